//! The chaos run behind `argocd-agent-dev chaos`: a hub and several spokes (Kubernetes API
//! test servers), the development Workload API server, a real principal process, and one
//! real agent process per spoke (managed and autonomous), each agent dialing the principal
//! through its own fault-injecting TCP proxy.
//!
//! A seeded driver performs random operations (create, spec edit, delete, status change,
//! operation set and terminate) on the side each mode makes the source of truth, and keeps a
//! model of what every side must end up holding. A fault schedule from the same seed kills
//! and restarts the principal, the agents and the Workload API server, cuts, delays and
//! takes down agent links, makes the API servers answer 500 and 429, drops their watches
//! and forces 410 Gone, while every SVID is rotated every few seconds. Then the run goes
//! quiet, waits for the sides to converge and checks every object against the model.
//!
//! The seed fixes the sequence of operations and of faults; the interleaving of the two is
//! wall-clock timing (real processes), so a failing seed reproduces its inputs exactly and
//! its timing only roughly. See `docs/reliability.md`.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_kube_test_server::{KubeTestServer, ServerOptions};
use argocd_agent_testkit::workload_api::{DevWorkloadApi, DevWorkloadApiHandle};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Mutex as AsyncMutex;

use argocd_agent_testkit::envoy::{free_loopback_port, wait_listening};
use argocd_agent_testkit::harness::{
    HUB_ARGOCD_NS, HarnessError, PRINCIPAL_ID, Proc, RULE, SPOKE_NS, TRUST_DOMAIN, TcpProxy,
    agent_id, apps, binary, create_namespace, object, principal_args, stored_app,
};

/// Options of a chaos run.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// Seed of the operations and of the fault schedule.
    pub seed: u64,
    /// Operations to perform, over all agents.
    pub ops: usize,
    /// Agents (and spokes); even-numbered ones are managed, odd-numbered autonomous.
    pub agents: usize,
    /// Operations per second, over all agents.
    pub rate: f64,
    /// Application names per agent (a small pool makes operations meet on the same object).
    pub names: usize,
    /// Inject faults (off: the same operations on a healthy topology, for comparison).
    pub faults: bool,
    /// Mean pause between two faults.
    pub fault_every: Duration,
    /// Every SVID is rotated at this interval (zero: never).
    pub rotate_every: Duration,
    /// How long the quiet phase may take to converge before the run fails.
    pub converge_timeout: Duration,
    /// Working directory (kept); a temporary one by default.
    pub dir: Option<PathBuf>,
}

impl Default for ChaosOptions {
    fn default() -> Self {
        Self {
            seed: 1,
            ops: 10_000,
            agents: 4,
            rate: 40.0,
            names: 12,
            faults: true,
            fault_every: Duration::from_millis(1500),
            rotate_every: Duration::from_secs(3),
            converge_timeout: Duration::from_secs(120),
            dir: None,
        }
    }
}

/// What a chaos run found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosReport {
    /// The run's seed ([`ChaosOptions::seed`]).
    pub seed: u64,
    /// Each agent as `<name> <mode>`.
    pub agents: Vec<String>,
    /// Operations requested.
    pub ops: usize,
    /// Operations applied, by kind.
    pub applied: BTreeMap<String, usize>,
    /// Operations not applied, by reason (e.g. the mirror copy was not there yet for a
    /// status write); they change nothing, so the model leaves them out.
    pub skipped: BTreeMap<String, usize>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Objects checked (each agent's names on the hub and on its spoke).
    pub objects_checked: usize,
    /// Objects the model holds that a side lacks.
    pub lost: usize,
    /// Objects whose spec, status or operation differs from the model.
    pub divergent: usize,
    /// Objects no operation created (names outside the model).
    pub duplicated: usize,
    /// Objects the model deleted that a side still holds.
    pub resurrected: usize,
    /// The driver's own surprises (e.g. a create finding the object already there).
    pub anomalies: Vec<String>,
    /// Processes that exited without being killed by the schedule (restarted at once).
    pub unexpected_exits: usize,
    /// `panicked at` lines in the processes' logs.
    pub panics: usize,
    /// Whether every object matched the model before the converge timeout.
    pub converged: bool,
    /// From the end of the faults to every object matching, seconds.
    pub converge_secs: f64,
    /// The operation phase, seconds.
    pub run_secs: f64,
    /// The first differences found at the end (object, side, what).
    pub findings: Vec<String>,
    /// Working directory (logs).
    pub dir: String,
}

impl ChaosReport {
    /// Whether the run lost nothing and every side agrees with the model.
    pub fn passed(&self) -> bool {
        self.converged
            && self.lost == 0
            && self.divergent == 0
            && self.duplicated == 0
            && self.resurrected == 0
            && self.panics == 0
    }

    /// The human-readable report.
    pub fn table(&self) -> String {
        let sum = |m: &BTreeMap<String, usize>| m.values().sum::<usize>();
        let list = |m: &BTreeMap<String, usize>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = String::new();
        out.push_str(&format!(
            "chaos seed {} · {} agents ({})\n",
            self.seed,
            self.agents.len(),
            self.agents.join(", ")
        ));
        out.push_str(&format!(
            "ops        {} requested, {} applied ({}), {} skipped ({})\n",
            self.ops,
            sum(&self.applied),
            list(&self.applied),
            sum(&self.skipped),
            list(&self.skipped)
        ));
        out.push_str(&format!(
            "faults     {} ({})\n",
            sum(&self.faults),
            list(&self.faults)
        ));
        out.push_str(&format!(
            "processes  {} unexpected exits, {} panics\n",
            self.unexpected_exits, self.panics
        ));
        out.push_str(&format!(
            "{:>8} {:>6} {:>10} {:>11} {:>12} {:>10} {:>9}\n",
            "checked", "lost", "divergent", "duplicated", "resurrected", "converge", "run"
        ));
        let converge = if self.converged {
            format!("{:.1} s", self.converge_secs)
        } else {
            "never".to_string()
        };
        out.push_str(&format!(
            "{:>8} {:>6} {:>10} {:>11} {:>12} {:>10} {:>7.1} s\n",
            self.objects_checked,
            self.lost,
            self.divergent,
            self.duplicated,
            self.resurrected,
            converge,
            self.run_secs
        ));
        for a in &self.anomalies {
            out.push_str(&format!("anomaly: {a}\n"));
        }
        for f in &self.findings {
            out.push_str(&format!("finding: {f}\n"));
        }
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        if self.dir.is_empty() {
            out.push_str(&format!("{verdict}\n"));
        } else {
            out.push_str(&format!("{verdict} (logs in {})\n", self.dir));
        }
        out
    }

    /// The report as one JSON line.
    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// What one object must look like at the end, by the model.
#[derive(Debug, Clone, Default)]
struct Expect {
    present: bool,
    /// Number of the operation that created this incarnation (in `spec.source.path`).
    inc: u64,
    /// `spec.source.targetRevision` of the last edit.
    rev: String,
    /// `status.sync.revision` of the last status write on the spoke.
    status: Option<String>,
    /// `operation.sync.revision` of the last operation set on the hub.
    op: Option<String>,
    /// Whether that operation was terminated after it was set.
    terminated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Managed,
    Autonomous,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Managed => "managed",
            Mode::Autonomous => "autonomous",
        }
    }
}

struct Spoke {
    agent: String,
    mode: Mode,
    server: KubeTestServer,
    proxy: TcpProxy,
    proc: AsyncMutex<Proc>,
}

struct Ctx {
    dir: PathBuf,
    hub: KubeTestServer,
    spokes: Vec<Spoke>,
    principal: AsyncMutex<Proc>,
    spiffe_builder: DevWorkloadApi,
    spiffe: AsyncMutex<Option<DevWorkloadApiHandle>>,
    faults: Mutex<BTreeMap<String, usize>>,
    applied: Mutex<BTreeMap<String, usize>>,
    skipped: Mutex<BTreeMap<String, usize>>,
    anomalies: Mutex<Vec<String>>,
    unexpected_exits: AtomicUsize,
}

fn bump(m: &Mutex<BTreeMap<String, usize>>, k: &str) {
    *m.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(k.to_string())
        .or_default() += 1;
}

impl Ctx {
    fn new(
        dir: PathBuf,
        hub: KubeTestServer,
        spokes: Vec<Spoke>,
        principal: Proc,
        spiffe_builder: DevWorkloadApi,
        spiffe: Option<DevWorkloadApiHandle>,
    ) -> Ctx {
        Ctx {
            dir,
            hub,
            spokes,
            principal: AsyncMutex::new(principal),
            spiffe_builder,
            spiffe: AsyncMutex::new(spiffe),
            faults: Mutex::default(),
            applied: Mutex::default(),
            skipped: Mutex::default(),
            anomalies: Mutex::default(),
            unexpected_exits: AtomicUsize::new(0),
        }
    }

    fn fault(&self, kind: &str) {
        bump(&self.faults, kind);
        tracing::info!(fault = kind, "chaos fault");
    }

    fn anomaly(&self, what: String) {
        tracing::warn!("chaos anomaly: {what}");
        self.anomalies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what);
    }

    fn servers(&self) -> Vec<(&str, &KubeTestServer)> {
        std::iter::once(("hub", &self.hub))
            .chain(self.spokes.iter().map(|s| (s.agent.as_str(), &s.server)))
            .collect()
    }

    fn logs(&self) -> Vec<(String, String)> {
        let mut files = vec!["principal.log".to_string()];
        files.extend(self.spokes.iter().map(|s| format!("{}.log", s.agent)));
        files
            .into_iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.dir.join(&f)).unwrap_or_default();
                (f, text)
            })
            .collect()
    }
}

fn agent_name(i: usize) -> (String, Mode) {
    if i.is_multiple_of(2) {
        (format!("chaos-managed-{}", i / 2 + 1), Mode::Managed)
    } else {
        (format!("chaos-autonomous-{}", i / 2 + 1), Mode::Autonomous)
    }
}

/// Runs a chaos run and reports what it found (an `Err` only when the topology could not
/// be built).
pub async fn run(opts: &ChaosOptions) -> Result<ChaosReport, HarnessError> {
    let (dir, tmp) =
        argocd_agent_testkit::harness::work_dir(opts.dir.as_deref(), "argocd-agent-chaos")?;
    let agents: Vec<(String, Mode)> = (0..opts.agents.max(1)).map(agent_name).collect();
    let ctx = Arc::new(start(&dir, &agents).await?);
    let result = drive_and_check(&ctx, opts).await;
    stop(&ctx).await;
    let mut report = result?;
    // A temporary directory goes with a passing run; a failing run keeps it (below).
    if tmp.is_none() {
        report.dir = dir.display().to_string();
    }
    report.agents = agents
        .iter()
        .map(|(a, m)| format!("{a} {}", m.as_str()))
        .collect();
    // Keep the logs of a failed run.
    if let Some(t) = tmp.filter(|_| !report.passed()) {
        report.dir = t.keep().display().to_string();
    }
    Ok(report)
}

async fn start(dir: &std::path::Path, agents: &[(String, Mode)]) -> Result<Ctx, HarnessError> {
    let td = TrustDomain::new(TRUST_DOMAIN)?;
    let mut builder = DevWorkloadApi::builder(dir.join("spiffe"), td)
        .socket(dir.join("principal.sock"), SpiffeId::parse(PRINCIPAL_ID)?);
    for (agent, _) in agents {
        builder = builder.socket(
            dir.join(format!("{agent}.sock")),
            SpiffeId::parse(&agent_id(agent))?,
        );
    }
    let spiffe = builder.clone().serve().await?;
    let hub = KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
    hub.write_kubeconfig(&dir.join("hub.kubeconfig"), "hub")?;
    create_namespace(&hub, HUB_ARGOCD_NS).await?;

    let bin = binary("argocd-agent")?;
    let port = free_loopback_port()?;
    let principal_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut args = principal_args(
        port,
        &dir.join("hub.kubeconfig"),
        free_loopback_port()?,
        &spiffe.endpoint(&dir.join("principal.sock")),
    );
    args.extend(
        [
            "--identity-rule",
            RULE,
            "--admin-address",
            "off",
            "--disable-redis-proxy",
        ]
        .map(String::from),
    );
    // Info logs whatever this process's RUST_LOG: the run reads sessions from them.
    let mut principal = Proc::new("principal", bin.clone(), args, dir.join("principal.log"))
        .env("RUST_LOG", "info");
    principal.start()?;
    wait_listening(principal_addr, Duration::from_secs(30)).await?;

    let mut spokes = Vec::new();
    for (agent, mode) in agents {
        create_namespace(&hub, agent).await?;
        let server =
            KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
        server.write_kubeconfig(&dir.join(format!("{agent}.kubeconfig")), agent)?;
        create_namespace(&server, SPOKE_NS).await?;
        let proxy = TcpProxy::start(principal_addr).await?;
        let args: Vec<String> = vec![
            "agent".into(),
            "--agent-mode".into(),
            mode.as_str().into(),
            "--creds".into(),
            "spiffe".into(),
            "--server-address".into(),
            "127.0.0.1".into(),
            "--server-port".into(),
            proxy.addr.port().to_string(),
            "--principal-spiffe-id".into(),
            PRINCIPAL_ID.into(),
            "--spiffe-endpoint-socket".into(),
            spiffe.endpoint(&dir.join(format!("{agent}.sock"))),
            "--kubeconfig".into(),
            dir.join(format!("{agent}.kubeconfig"))
                .display()
                .to_string(),
            "--namespace".into(),
            SPOKE_NS.into(),
            "--metrics-port".into(),
            "0".into(),
            "--keep-alive-ping-interval".into(),
            "5s".into(),
        ];
        let mut proc = Proc::new(agent, bin.clone(), args, dir.join(format!("{agent}.log")))
            .env("RUST_LOG", "info");
        proc.start()?;
        spokes.push(Spoke {
            agent: agent.clone(),
            mode: *mode,
            server,
            proxy,
            proc: AsyncMutex::new(proc),
        });
    }
    let ctx = Ctx::new(
        dir.to_path_buf(),
        hub,
        spokes,
        principal,
        builder,
        Some(spiffe),
    );
    // Every agent connected before the first operation.
    let deadline = Instant::now() + Duration::from_secs(60);
    for s in &ctx.spokes {
        let needle = format!("agent={}", s.agent);
        loop {
            let log = std::fs::read_to_string(dir.join("principal.log")).unwrap_or_default();
            if log
                .lines()
                .any(|l| l.contains("agent connected") && l.contains(&needle))
            {
                break;
            }
            if Instant::now() > deadline {
                stop(&ctx).await;
                return Err(format!("{} did not connect within 60 s", s.agent).into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(ctx)
}

async fn stop(ctx: &Ctx) {
    for s in &ctx.spokes {
        s.proc.lock().await.stop().await;
    }
    ctx.principal.lock().await.stop().await;
    if let Some(h) = ctx.spiffe.lock().await.take() {
        h.shutdown().await;
    }
}

async fn drive_and_check(ctx: &Arc<Ctx>, opts: &ChaosOptions) -> Result<ChaosReport, HarnessError> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let supervisor = tokio::spawn(supervise(ctx.clone()));
    let faults = opts
        .faults
        .then(|| tokio::spawn(fault_schedule(ctx.clone(), opts.clone(), stop_rx.clone())));
    let rotation = (opts.faults && !opts.rotate_every.is_zero())
        .then(|| tokio::spawn(rotate(ctx.clone(), opts.rotate_every, stop_rx.clone())));

    let started = Instant::now();
    let n = ctx.spokes.len();
    let mut drivers = Vec::new();
    for i in 0..n {
        let ops = opts.ops / n + usize::from(i < opts.ops % n);
        drivers.push(tokio::spawn(drive(ctx.clone(), i, ops, opts.clone())));
    }
    let mut models = Vec::new();
    for d in drivers {
        models.push(d.await?);
    }
    let run_secs = started.elapsed().as_secs_f64();

    // Quiet: no more faults, every link and process back, every API server healthy.
    stop_tx.send_replace(true);
    if let Some(f) = faults {
        f.await?;
    }
    if let Some(r) = rotation {
        r.await?;
    }
    {
        let mut spiffe = ctx.spiffe.lock().await;
        if spiffe.is_none() {
            *spiffe = Some(ctx.spiffe_builder.clone().serve().await?);
        }
    }
    for s in &ctx.spokes {
        s.proxy.set_down(false);
        s.proxy.set_delay(Duration::ZERO);
    }
    for (_, server) in ctx.servers() {
        server.set_latency(Duration::ZERO);
        server.fail_next(0, 500);
    }
    let quiet = Instant::now();
    let deadline = quiet + opts.converge_timeout;
    let (mut checked, mut findings);
    loop {
        (checked, findings) = check(ctx, &models, opts.names);
        if findings.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let converge_secs = quiet.elapsed().as_secs_f64();
    supervisor.abort();

    let count = |k: Problem| findings.iter().filter(|f| f.0 == k).count();
    let panics = ctx
        .logs()
        .iter()
        .map(|(_, t)| t.matches("panicked at").count())
        .sum();
    let take =
        |m: &Mutex<BTreeMap<String, usize>>| m.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(ChaosReport {
        seed: opts.seed,
        agents: vec![],
        ops: opts.ops,
        applied: take(&ctx.applied),
        skipped: take(&ctx.skipped),
        faults: take(&ctx.faults),
        objects_checked: checked,
        lost: count(Problem::Lost),
        divergent: count(Problem::Divergent),
        duplicated: count(Problem::Duplicated),
        resurrected: count(Problem::Resurrected),
        anomalies: ctx
            .anomalies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        unexpected_exits: ctx.unexpected_exits.load(Ordering::SeqCst),
        panics,
        converged: findings.is_empty(),
        converge_secs,
        run_secs,
        findings: findings.iter().take(30).map(|f| f.1.clone()).collect(),
        dir: String::new(),
    })
}

/// Restarts any process that exited on its own (what a kubelet does), counting it; runs
/// until the check is done (a process the fault schedule is restarting is locked by it).
async fn supervise(ctx: Arc<Ctx>) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let procs = std::iter::once(&ctx.principal).chain(ctx.spokes.iter().map(|s| &s.proc));
        for p in procs {
            if let Ok(mut p) = p.try_lock()
                && !p.is_running()
            {
                ctx.unexpected_exits.fetch_add(1, Ordering::SeqCst);
                tracing::warn!(process = %p.name, "chaos: process exited on its own; restarting");
                let _ = p.start();
            }
        }
    }
}

async fn rotate(ctx: Arc<Ctx>, every: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        if let Some(h) = ctx.spiffe.lock().await.as_ref()
            && h.rotate_now().is_ok()
        {
            ctx.fault("svid-rotation");
        }
    }
}

fn jitter(rng: &mut fastrand::Rng, lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_millis(rng.u64(lo_ms..=hi_ms))
}

/// The fault schedule: one random fault at a time, at random pauses around `fault_every`.
async fn fault_schedule(
    ctx: Arc<Ctx>,
    opts: ChaosOptions,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut rng = fastrand::Rng::with_seed(opts.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xFA17);
    let mean = u64::try_from(opts.fault_every.as_millis())
        .unwrap_or(1500)
        .max(10);
    const KINDS: &[(&str, u32)] = &[
        ("principal-kill", 2),
        ("agent-kill", 3),
        ("workload-api-restart", 2),
        ("link-cut", 3),
        ("link-down", 2),
        ("link-delay", 2),
        ("api-500", 2),
        ("api-429", 2),
        ("watch-drop", 2),
        ("watch-410", 2),
    ];
    let total: u32 = KINDS.iter().map(|k| k.1).sum();
    loop {
        let pause = jitter(&mut rng, mean / 2, mean * 3 / 2);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return,
        }
        let mut pick = rng.u32(0..total);
        let kind = KINDS
            .iter()
            .find(|(_, w)| {
                if pick < *w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .map_or("link-cut", |k| k.0);
        let spoke = &ctx.spokes[rng.usize(0..ctx.spokes.len())];
        let servers = ctx.servers();
        let (_, server) = servers[rng.usize(0..servers.len())];
        ctx.fault(kind);
        match kind {
            "principal-kill" => {
                let mut p = ctx.principal.lock().await;
                p.kill().await;
                tokio::time::sleep(jitter(&mut rng, 100, 2000)).await;
                let _ = p.start();
            }
            "agent-kill" => {
                let mut p = spoke.proc.lock().await;
                p.kill().await;
                tokio::time::sleep(jitter(&mut rng, 100, 2000)).await;
                let _ = p.start();
            }
            "workload-api-restart" => {
                let mut h = ctx.spiffe.lock().await;
                if let Some(old) = h.take() {
                    old.shutdown().await;
                }
                tokio::time::sleep(jitter(&mut rng, 100, 2000)).await;
                match ctx.spiffe_builder.clone().serve().await {
                    Ok(new) => *h = Some(new),
                    Err(e) => ctx.anomaly(format!("Workload API did not restart: {e}")),
                }
            }
            "link-cut" => spoke.proxy.cut_all(),
            "link-down" => {
                spoke.proxy.set_down(true);
                tokio::time::sleep(jitter(&mut rng, 300, 3000)).await;
                spoke.proxy.set_down(false);
            }
            "link-delay" => {
                spoke.proxy.set_delay(jitter(&mut rng, 20, 300));
                tokio::time::sleep(jitter(&mut rng, 500, 3000)).await;
                spoke.proxy.set_delay(Duration::ZERO);
            }
            "api-500" => server.fail_next(rng.usize(1..=5), 500),
            "api-429" => server.fail_next(rng.usize(1..=5), 429),
            "watch-drop" => server.drop_watches(),
            "watch-410" => {
                server.compact_history();
                server.drop_watches();
            }
            _ => {}
        }
    }
}

/// Whether a failed API call is worth repeating (the server's injected 5xx and 429, and
/// connection errors).
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        _ => true,
    }
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

async fn retry<T, F, Fut>(mut f: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Err(e) if transient(&e) && attempt < 100 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            r => return r,
        }
    }
}

fn app_object(name: &str, ns: &str, inc: u64, rev: &str) -> DynamicObject {
    object(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "project": "default",
            "source": {
                "repoURL": "https://github.com/argoproj/argocd-example-apps",
                "path": format!("inc-{inc}"),
                "targetRevision": rev
            },
            "destination": {"server": "https://kubernetes.default.svc", "namespace": name}
        }
    }))
}

fn inc_of(obj: &Value) -> Option<u64> {
    obj.pointer("/spec/source/path")
        .and_then(Value::as_str)
        .and_then(|p| p.strip_prefix("inc-"))
        .and_then(|n| n.parse().ok())
}

fn str_at<'a>(obj: &'a Value, path: &str) -> Option<&'a str> {
    obj.pointer(path).and_then(Value::as_str)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    Edit,
    Delete,
    Status,
    SetOperation,
    Terminate,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Edit => "edit",
            Op::Delete => "delete",
            Op::Status => "status",
            Op::SetOperation => "operation",
            Op::Terminate => "terminate",
        }
    }
}

fn pick_op(rng: &mut fastrand::Rng, e: &Expect) -> Op {
    if !e.present {
        return Op::Create;
    }
    match rng.u32(0..100) {
        0..40 => Op::Edit,
        40..52 => Op::Delete,
        52..76 => Op::Status,
        76..90 => Op::SetOperation,
        _ if e.op.is_some() && !e.terminated => Op::Terminate,
        _ => Op::Edit,
    }
}

/// One agent's driver: `ops` operations on its names, returning the model of the end state.
async fn drive(
    ctx: Arc<Ctx>,
    index: usize,
    ops: usize,
    opts: ChaosOptions,
) -> BTreeMap<String, Expect> {
    let spoke = &ctx.spokes[index];
    let mut rng =
        fastrand::Rng::with_seed(opts.seed.wrapping_mul(1_000_003).wrapping_add(index as u64));
    let mut model: BTreeMap<String, Expect> = BTreeMap::new();
    let (Ok(hub), Ok(spoke_api)) = (apps(&ctx.hub, &spoke.agent), apps(&spoke.server, SPOKE_NS))
    else {
        ctx.anomaly(format!("{}: no API client", spoke.agent));
        return model;
    };
    let (source, source_ns) = match spoke.mode {
        Mode::Managed => (&hub, spoke.agent.as_str()),
        Mode::Autonomous => (&spoke_api, SPOKE_NS),
    };
    let per_agent_rate = (opts.rate / ctx.spokes.len() as f64).max(0.01);
    for k in 1..=ops as u64 {
        let pause = Duration::from_secs_f64(rng.f64() * 2.0 / per_agent_rate);
        tokio::time::sleep(pause).await;
        let name = format!("app-{:02}", rng.usize(0..opts.names.max(1)));
        let e = model.entry(name.clone()).or_default();
        let op = pick_op(&mut rng, e);
        let tag = format!("{}-{k}", spoke.agent);
        let dp = DeleteParams::default();
        let applied = match op {
            Op::Create => {
                let obj = app_object(&name, source_ns, k, &format!("r{k}"));
                let pp = PostParams::default();
                match retry(|| source.create(&pp, &obj)).await {
                    Ok(_) => {
                        *e = Expect {
                            present: true,
                            inc: k,
                            rev: format!("r{k}"),
                            ..Expect::default()
                        };
                        Ok(())
                    }
                    Err(err) => Err(format!("create {tag} {name}: {err}")),
                }
            }
            Op::Edit => {
                let patch =
                    Patch::Merge(json!({"spec": {"source": {"targetRevision": format!("r{k}")}}}));
                let pp = PatchParams::default();
                match retry(|| source.patch(&name, &pp, &patch)).await {
                    Ok(_) => {
                        e.rev = format!("r{k}");
                        Ok(())
                    }
                    Err(err) => Err(format!("edit {tag} {name}: {err}")),
                }
            }
            Op::Delete => match retry(|| source.delete(&name, &dp)).await {
                Ok(_) => {
                    *e = Expect::default();
                    Ok(())
                }
                Err(err) => Err(format!("delete {tag} {name}: {err}")),
            },
            // Status is written where Argo CD's controller runs: the spoke, in both modes; on
            // this incarnation only (resourceVersion precondition).
            Op::Status => {
                let revision = format!("s{k}");
                let body = |rv: &str| {
                    json!({"metadata": {"resourceVersion": rv},
                       "status": {"sync": {"status": "Synced", "revision": revision},
                                  "health": {"status": "Healthy"}}})
                };
                conditional(&spoke_api, &name, e.inc, |rv| {
                    let b = body(&rv);
                    let api = &spoke_api;
                    let name = &name;
                    async move {
                        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&b))
                            .await
                    }
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|applied| {
                    if applied {
                        e.status = Some(revision.clone());
                        Ok(())
                    } else {
                        bump(&ctx.skipped, "status: spoke copy not current yet");
                        Err(String::new())
                    }
                })
            }
            // `argocd app sync` sets `.operation` on the hub, in both modes.
            Op::SetOperation => {
                let revision = format!("o{k}");
                let body = |rv: &str| {
                    json!({"metadata": {"resourceVersion": rv},
                       "operation": {"sync": {"revision": revision},
                                     "initiatedBy": {"username": "chaos"}}})
                };
                conditional(&hub, &name, e.inc, |rv| {
                    let b = body(&rv);
                    let hub = &hub;
                    let name = &name;
                    async move {
                        hub.patch(name, &PatchParams::default(), &Patch::Merge(&b))
                            .await
                    }
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|applied| {
                    if applied {
                        e.op = Some(revision.clone());
                        e.terminated = false;
                        Ok(())
                    } else {
                        bump(&ctx.skipped, "operation: hub copy not current yet");
                        Err(String::new())
                    }
                })
            }
            // `argocd app terminate-op` sets the hub's operation phase to Terminating.
            Op::Terminate => {
                let body = |rv: &str| {
                    json!({"metadata": {"resourceVersion": rv},
                       "status": {"operationState": {"phase": "Terminating"}}})
                };
                conditional(&hub, &name, e.inc, |rv| {
                    let b = body(&rv);
                    let hub = &hub;
                    let name = &name;
                    async move {
                        hub.patch_status(name, &PatchParams::default(), &Patch::Merge(&b))
                            .await
                    }
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|applied| {
                    if applied {
                        e.terminated = true;
                        Ok(())
                    } else {
                        bump(&ctx.skipped, "terminate: hub copy not current yet");
                        Err(String::new())
                    }
                })
            }
        };
        match applied {
            Ok(()) => bump(&ctx.applied, op.as_str()),
            Err(msg) if msg.is_empty() => {}
            Err(msg) => {
                // The source side is the driver's alone: a write it cannot make there means
                // something else changed it (a create finding the object, an edit or
                // delete not finding it).
                bump(&ctx.skipped, &format!("{}: failed", op.as_str()));
                ctx.anomaly(msg);
            }
        }
    }
    model
}

/// Why a conditional write failed. Messages carry their cause (no `source`).
#[derive(Debug, thiserror::Error)]
enum WriteFailed {
    /// The object cannot be read.
    #[error("get {name}: {cause}")]
    Get { name: String, cause: kube::Error },
    /// The object cannot be written.
    #[error("write {name}: {cause}")]
    Write { name: String, cause: kube::Error },
}

/// Reads `name` through `api`; if it is incarnation `inc`, writes it with `write(rv)` (a
/// precondition on its resourceVersion). `Ok(false)`: not there, another incarnation, or
/// changed in between.
async fn conditional<F, Fut>(
    api: &Api<DynamicObject>,
    name: &str,
    inc: u64,
    write: F,
) -> Result<bool, WriteFailed>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<DynamicObject, kube::Error>>,
{
    for _ in 0..3 {
        let cur = match retry(|| api.get_opt(name)).await {
            Ok(Some(o)) => o,
            Ok(None) => return Ok(false),
            Err(cause) => {
                return Err(WriteFailed::Get {
                    name: name.to_owned(),
                    cause,
                });
            }
        };
        let Ok(v) = serde_json::to_value(&cur) else {
            return Ok(false);
        };
        if inc_of(&v) != Some(inc) {
            return Ok(false);
        }
        let rv = cur.metadata.resource_version.clone().unwrap_or_default();
        match retry(|| write(rv.clone())).await {
            Ok(_) => return Ok(true),
            Err(e) if code(&e) == Some(409) => continue,
            Err(e) if code(&e) == Some(404) => return Ok(false),
            Err(cause) => {
                return Err(WriteFailed::Write {
                    name: name.to_owned(),
                    cause,
                });
            }
        }
    }
    Ok(false)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Problem {
    Lost,
    Divergent,
    Duplicated,
    Resurrected,
}

/// Compares every side with the model: (objects checked, problems found).
fn check(
    ctx: &Ctx,
    models: &[BTreeMap<String, Expect>],
    names: usize,
) -> (usize, Vec<(Problem, String)>) {
    let mut checked = 0;
    let mut out = Vec::new();
    for (spoke, model) in ctx.spokes.iter().zip(models) {
        let agent = &spoke.agent;
        let pool: Vec<String> = (0..names.max(1)).map(|i| format!("app-{i:02}")).collect();
        for side in ["hub", "spoke"] {
            let (server, ns) = if side == "hub" {
                (&ctx.hub, agent.as_str())
            } else {
                (&spoke.server, SPOKE_NS)
            };
            for o in server.list_objects("argoproj.io", "v1alpha1", "applications", Some(ns)) {
                let n = str_at(&o, "/metadata/name").unwrap_or_default();
                if !pool.iter().any(|p| p == n) {
                    out.push((
                        Problem::Duplicated,
                        format!("{agent}: {side} holds {ns}/{n}, which no operation created"),
                    ));
                }
            }
        }
        for name in &pool {
            let e = model.get(name).cloned().unwrap_or_default();
            let hub = stored_app(&ctx.hub, agent, name);
            let sp = stored_app(&spoke.server, SPOKE_NS, name);
            checked += 2;
            let at = |side: &str| format!("{agent} {} {side} {name}", spoke.mode.as_str());
            if !e.present {
                for (side, o) in [("hub", &hub), ("spoke", &sp)] {
                    if let Some(o) = o {
                        out.push((
                            Problem::Resurrected,
                            format!(
                                "{}: deleted, but present ({})",
                                at(side),
                                str_at(o, "/spec/source/path").unwrap_or("?")
                            ),
                        ));
                    }
                }
                continue;
            }
            for (side, o) in [("hub", &hub), ("spoke", &sp)] {
                let Some(o) = o else {
                    out.push((
                        Problem::Lost,
                        format!("{}: missing (want inc-{})", at(side), e.inc),
                    ));
                    continue;
                };
                let got = (
                    inc_of(o),
                    str_at(o, "/spec/source/targetRevision").unwrap_or(""),
                );
                if got != (Some(e.inc), e.rev.as_str()) {
                    out.push((
                        Problem::Divergent,
                        format!(
                            "{}: spec {:?}/{}, want inc-{}/{}",
                            at(side),
                            got.0,
                            got.1,
                            e.inc,
                            e.rev
                        ),
                    ));
                    continue;
                }
                let status = str_at(o, "/status/sync/revision");
                if status != e.status.as_deref() {
                    out.push((
                        Problem::Divergent,
                        format!("{}: status {status:?}, want {:?}", at(side), e.status),
                    ));
                }
                // `.operation` is delivered to the spoke; the hub's is cleared once the agent
                // acknowledged it (the hub runs no controller for agent namespaces).
                let got = str_at(o, "/operation/sync/revision");
                let want = if side == "spoke" {
                    e.op.as_deref()
                } else {
                    None
                };
                if got != want && (side == "hub" || e.op.is_some()) {
                    out.push((
                        Problem::Divergent,
                        format!("{}: operation {got:?}, want {want:?}", at(side)),
                    ));
                }
                if e.terminated && side == "spoke" {
                    let phase = str_at(o, "/status/operationState/phase");
                    if phase != Some("Terminating") {
                        out.push((
                            Problem::Divergent,
                            format!("{}: operation phase {phase:?}, want Terminating", at(side)),
                        ));
                    }
                }
            }
        }
    }
    (checked, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_objects_are_created_first() {
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..100 {
            assert_eq!(pick_op(&mut rng, &Expect::default()), Op::Create);
        }
    }

    #[test]
    fn terminate_only_follows_a_live_operation() {
        let mut rng = fastrand::Rng::with_seed(5);
        let present = Expect {
            present: true,
            ..Expect::default()
        };
        for _ in 0..1000 {
            assert_ne!(pick_op(&mut rng, &present), Op::Terminate);
        }
        let running = Expect {
            present: true,
            op: Some("o1".into()),
            ..Expect::default()
        };
        assert!((0..1000).any(|_| pick_op(&mut rng, &running) == Op::Terminate));
    }

    #[test]
    fn the_seed_fixes_the_operations() {
        let ops = |seed| {
            let mut rng = fastrand::Rng::with_seed(seed);
            let running = Expect {
                present: true,
                op: Some("o1".into()),
                ..Expect::default()
            };
            (0..50)
                .map(|_| pick_op(&mut rng, &running))
                .collect::<Vec<_>>()
        };
        assert_eq!(ops(7), ops(7));
        assert_ne!(ops(7), ops(8));
    }

    #[test]
    fn incarnation_is_read_from_the_path() {
        let v = serde_json::to_value(app_object("a", "ns", 42, "r1")).unwrap();
        assert_eq!(inc_of(&v), Some(42));
        assert_eq!(inc_of(&json!({"spec": {"source": {"path": "x"}}})), None);
    }

    /// The check is what makes a chaos run fail: it must see each kind of problem.
    #[tokio::test]
    async fn the_check_finds_every_kind_of_problem() {
        let start =
            || KubeTestServer::start_on("127.0.0.1:0".parse().unwrap(), ServerOptions::default());
        let (hub, server) = (start().await.unwrap(), start().await.unwrap());
        let agent = "chaos-managed-1";
        create_namespace(&hub, agent).await.unwrap();
        create_namespace(&server, SPOKE_NS).await.unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let proxy = TcpProxy::start(hub.addr()).await.unwrap();
        let idle = |n: &str| Proc::new(n, "true".into(), vec![], tmp.path().join("x.log"));
        let spokes = vec![Spoke {
            agent: agent.into(),
            mode: Mode::Managed,
            server,
            proxy,
            proc: AsyncMutex::new(idle(agent)),
        }];
        let builder = DevWorkloadApi::builder(tmp.path(), TrustDomain::new(TRUST_DOMAIN).unwrap());
        let ctx = Ctx::new(
            tmp.path().into(),
            hub,
            spokes,
            idle("principal"),
            builder,
            None,
        );
        let present = |inc: u64, status: Option<&str>| Expect {
            present: true,
            inc,
            rev: format!("r{inc}"),
            status: status.map(str::to_owned),
            ..Expect::default()
        };
        let model: BTreeMap<String, Expect> = [
            ("app-00".to_string(), present(1, None)),
            ("app-01".to_string(), present(2, None)),
            ("app-03".to_string(), present(3, Some("s5"))),
        ]
        .into();
        let hub_api = apps(&ctx.hub, agent).unwrap();
        let spoke_api = apps(&ctx.spokes[0].server, SPOKE_NS).unwrap();
        let pp = PostParams::default();
        let put = |api: &Api<DynamicObject>, ns: &str, name: &str, inc: u64, rev: &str| {
            let (api, obj, pp) = (api.clone(), app_object(name, ns, inc, rev), pp.clone());
            async move { api.create(&pp, &obj).await.unwrap() }
        };
        put(&hub_api, agent, "app-00", 1, "r1").await; // lost on the spoke
        put(&hub_api, agent, "app-01", 2, "r9").await; // divergent on the hub
        put(&spoke_api, SPOKE_NS, "app-01", 2, "r2").await;
        put(&spoke_api, SPOKE_NS, "app-02", 7, "r7").await; // deleted, still on the spoke
        put(&hub_api, agent, "app-03", 3, "r3").await;
        put(&spoke_api, SPOKE_NS, "app-03", 3, "r3").await;
        argocd_agent_testkit::harness::set_status(
            &spoke_api,
            "app-03",
            json!({"sync": {"revision": "s5"}}),
        )
        .await
        .unwrap(); // the hub lacks the status: divergent
        put(&hub_api, agent, "stray", 1, "r1").await; // no operation made it
        let (checked, found) = check(&ctx, std::slice::from_ref(&model), 4);
        assert_eq!(checked, 8);
        let kinds: Vec<Problem> = found.iter().map(|f| f.0).collect();
        for k in [
            Problem::Lost,
            Problem::Divergent,
            Problem::Resurrected,
            Problem::Duplicated,
        ] {
            assert!(kinds.contains(&k), "{k:?} not found in {found:?}");
        }
        assert_eq!(found.len(), 5, "{found:?}");

        // Once every side holds what the model says, nothing is found.
        put(&spoke_api, SPOKE_NS, "app-00", 1, "r1").await;
        argocd_agent_testkit::harness::merge_patch(
            &hub_api,
            "app-01",
            json!({"spec": {"source": {"targetRevision": "r2"}}}),
        )
        .await
        .unwrap();
        spoke_api
            .delete("app-02", &DeleteParams::default())
            .await
            .unwrap();
        hub_api
            .delete("stray", &DeleteParams::default())
            .await
            .unwrap();
        argocd_agent_testkit::harness::set_status(
            &hub_api,
            "app-03",
            json!({"sync": {"revision": "s5"}}),
        )
        .await
        .unwrap();
        let (_, found) = check(&ctx, std::slice::from_ref(&model), 4);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn agents_alternate_modes() {
        assert_eq!(agent_name(0).1, Mode::Managed);
        assert_eq!(agent_name(1).1, Mode::Autonomous);
        assert_eq!(agent_name(2).0, "chaos-managed-2");
    }
}
