//! The load generator behind `argocd-agent-dev bench <scenario>`: a real principal process
//! against a Kubernetes API test server as hub, and N simulated agents in this process, each
//! real on the wire (see [`sim`]). Each scenario prints one table row and returns JSON; see
//! `docs/benchmarks.md` for what each measures and the figures of a full run.

mod big;
pub mod env;
pub mod floor;
pub mod plot;
mod projects;
mod rolling;
pub mod sim;
pub mod soak;
pub mod storms;
mod tenants;

/// The agent's message compression, as the simulated agents use it.
pub use argocd_agent_agent::dialer::Compression;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use serde_json::{Value, json};

use argocd_agent_testkit::harness::{
    HarnessError, TcpProxy, app_resource, kube_client, merge_patch,
};
use env::{BenchEnv, ProcSample};
use sim::{Fleet, FleetConfig, SimAgent, sim_id, sim_name};

/// The scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// N agents connect; time to all connected, idle memory per agent and idle CPU.
    Connect,
    /// `kill -9` and restart the principal under N agents; time to reconnected and resynced.
    Storm,
    /// Hub writes to agents and agent status to the hub: latency percentiles.
    Fanout,
    /// Events per second both ways, next to the raw tonic floor over the same TLS.
    Throughput,
    /// Every SVID rotated during a run: dropped streams and failed events.
    Rotation,
    /// The demo topology with real agent processes: mixed creates, edits and deletes, as a
    /// user's script makes them; time until the other side equals the side written.
    Bulk,
    /// Active-active replicas (`--ha`) under N agents spread across them: `kill -9` one;
    /// time until its agents have sessions on the others and until every agent is resynced.
    Failover,
    /// Configuration fan-out: P AppProjects with repository Secrets over N agents; one
    /// project change at a time reaches exactly the agents it matches.
    Projects,
    /// A hub with `apps_per_agent` Applications per agent: principal RSS per Application,
    /// start until ready with them all cached, and a storm with them on the hub.
    BigHub,
    /// One real agent process with `spoke_apps` Applications on its spoke: agent RSS and
    /// idle CPU, resync after a reconnect, apply latency under a steady stream of changes.
    BigSpoke,
    /// The shipped configuration (`--replicas` with `--ha`, or one principal): N agents
    /// connect for the first time while hub changes flow (see [`storms`]).
    HaConnect,
    /// The shipped configuration: `kill -9` of one replica, restarted at once.
    HaKillOne,
    /// The shipped configuration: `kill -9` of every replica, all restarted at once.
    HaKillAll,
    /// The shipped configuration: a rolling update, one replica at a time.
    HaRollout,
    /// Two tenants: team-b's round-trip latency alone, then while team-a floods past its
    /// quotas, and how much of team-a's work the principal refused (see [`tenants`]).
    Tenants,
    /// The shipped configuration for hours under steady changes, status updates,
    /// reconnects, SVID rotations and replica restarts: growth per hour of every process's
    /// memory, descriptors, threads and queues, and nothing lost (see [`soak`]).
    Soak,
}

impl Scenario {
    /// The scenario's name on the command line and in reports (`connect`, `storm`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Connect => "connect",
            Scenario::Storm => "storm",
            Scenario::Fanout => "fanout",
            Scenario::Throughput => "throughput",
            Scenario::Rotation => "rotation",
            Scenario::Bulk => "bulk",
            Scenario::Failover => "failover",
            Scenario::Projects => "projects",
            Scenario::BigHub => "big-hub",
            Scenario::BigSpoke => "big-spoke",
            Scenario::HaConnect => "ha-connect",
            Scenario::HaKillOne => "ha-kill-one",
            Scenario::HaKillAll => "ha-kill-all",
            Scenario::HaRollout => "ha-rollout",
            Scenario::Tenants => "tenants",
            Scenario::Soak => "soak",
        }
    }
}

/// Options of a run (each scenario uses the ones it needs).
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Simulated agents.
    pub agents: usize,
    /// Changes written (fanout, throughput, rotation).
    pub changes: usize,
    /// Size of the Application payloads, bytes (throughput).
    pub payload_bytes: usize,
    /// How long the idle phase lasts (connect), or the run (rotation).
    pub duration: Duration,
    /// Heartbeat interval of the simulated agents (the real agent's default is 30 s).
    pub heartbeat: Duration,
    /// The simulated agents' HTTP/2 PING interval (the real agent's
    /// `--keep-alive-ping-interval`, default 30 s).
    pub keepalive: Duration,
    /// Concurrent hub writers (throughput).
    pub writers: usize,
    /// Working directory (kept); a temporary one by default.
    pub dir: Option<PathBuf>,
    /// Extra principal arguments.
    pub principal_args: Vec<String>,
    /// Principal replicas (failover).
    pub replicas: usize,
    /// What the simulated agents compress their messages in (`None`: nothing). Pass
    /// `--enable-compression` with `principal_args` for the principal's side.
    pub compression: Option<argocd_agent_agent::dialer::Compression>,
    /// Route the agents through a byte-counting TCP proxy and report the bytes on the wire
    /// per event (throughput).
    pub wire_bytes: bool,
    /// AppProjects on the hub, each with one repository Secret (projects).
    pub projects: usize,
    /// Agents each project matches (projects).
    pub agents_per_project: usize,
    /// Applications per agent on the hub (big-hub).
    pub apps_per_agent: usize,
    /// Applications on the one agent's spoke (big-spoke).
    pub spoke_apps: usize,
    /// Changes per second written while latency is measured (big-spoke); hub spec changes
    /// and agent status updates per second, each (soak).
    pub rate: f64,
    /// Sampling interval (soak).
    pub interval: Duration,
    /// A replica restart (`kill -9`, restarted at once) every this long (soak).
    pub restart_every: Duration,
    /// Every SVID rotated every this long (soak).
    pub rotate_every: Duration,
    /// Where each sample is appended as one JSON line as the run goes (soak).
    pub samples: Option<PathBuf>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            agents: 100,
            changes: 200,
            payload_bytes: 6 * 1024,
            duration: Duration::from_secs(10),
            heartbeat: Duration::from_secs(30),
            keepalive: Duration::from_secs(30),
            writers: 16,
            dir: None,
            principal_args: Vec::new(),
            replicas: 3,
            compression: None,
            wire_bytes: false,
            projects: 1000,
            agents_per_project: 10,
            apps_per_agent: 10,
            spoke_apps: 10_000,
            rate: 20.0,
            interval: Duration::from_secs(60),
            restart_every: Duration::from_secs(300),
            rotate_every: Duration::from_secs(180),
            samples: None,
        }
    }
}

/// One scenario's result: named values, in order.
#[derive(Debug, Clone)]
pub struct Report {
    /// The scenario's [`Scenario::name`].
    pub scenario: &'static str,
    /// Measured values by name (`connect_s`, `rss_before_mib`, ...), in report order.
    pub values: Vec<(&'static str, Value)>,
}

impl Report {
    fn new(scenario: Scenario) -> Report {
        Report {
            scenario: scenario.name(),
            values: Vec::new(),
        }
    }

    fn put(&mut self, key: &'static str, v: impl Into<Value>) {
        self.values.push((key, v.into()));
    }

    /// The values as one JSON object (with `scenario`).
    pub fn json(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("scenario".into(), self.scenario.into());
        for (k, v) in &self.values {
            m.insert((*k).into(), v.clone());
        }
        Value::Object(m)
    }

    /// A header line and one row, columns aligned.
    pub fn table(&self) -> String {
        let cells: Vec<(String, String)> =
            std::iter::once(("scenario".into(), self.scenario.into()))
                .chain(self.values.iter().map(|(k, v)| {
                    let s = match v {
                        Value::Number(n) => match n.as_f64() {
                            // Small figures as rounded by `fine`, not as 0.00.
                            Some(f) if n.is_f64() && f != 0.0 && f.abs() < 1.0 => f.to_string(),
                            Some(f) if n.is_f64() => format!("{f:.2}"),
                            _ => n.to_string(),
                        },
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    ((*k).to_owned(), s)
                }))
                .collect();
        let widths: Vec<usize> = cells.iter().map(|(k, v)| k.len().max(v.len())).collect();
        let line = |f: &dyn Fn(&(String, String)) -> &str| {
            cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{:<w$}", f(c), w = *w))
                .collect::<Vec<_>>()
                .join("  ")
        };
        format!("{}\n{}\n", line(&|c| &c.0), line(&|c| &c.1))
    }
}

/// Runs `scenario`.
pub async fn run(scenario: Scenario, opts: &BenchOptions) -> Result<Report, HarnessError> {
    // One socket per agent here and one in the principal, plus the hub and some slack.
    env::raise_nofile(opts.agents as u64 + 512)?;
    match scenario {
        Scenario::Connect => connect(opts).await,
        Scenario::Storm => storm(opts).await,
        Scenario::Fanout => fanout(opts).await,
        Scenario::Throughput => throughput(opts).await,
        Scenario::Rotation => rotation(opts).await,
        Scenario::Bulk => bulk(opts).await,
        Scenario::Failover => failover(opts).await,
        Scenario::Projects => projects::projects(opts).await,
        Scenario::BigHub => big::big_hub(opts).await,
        Scenario::BigSpoke => big::big_spoke(opts).await,
        Scenario::HaConnect => storms::run(storms::Storm::Connect, opts).await,
        Scenario::HaKillOne => storms::run(storms::Storm::KillOne, opts).await,
        Scenario::HaKillAll => storms::run(storms::Storm::KillAll, opts).await,
        Scenario::HaRollout => storms::run(storms::Storm::Rollout, opts).await,
        Scenario::Tenants => tenants::tenants(opts).await,
        Scenario::Soak => soak::soak(opts).await,
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// [`round2`] for figures of 1 and more; smaller ones keep three significant digits, so a
/// small measured value (0.0042 % of a core) is not printed as a 0 it is not.
fn fine(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() || x.abs() >= 1.0 {
        return round2(x);
    }
    let scale = 10f64.powi(2 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// Polls `f` every 20 ms until it is true; fails after `timeout` naming `what`.
async fn until(
    what: &str,
    timeout: Duration,
    f: impl FnMut() -> bool,
) -> Result<Duration, HarnessError> {
    poll_until(what, timeout, Duration::from_millis(20), f).await
}

/// [`until`] polling every `every` (latency measurements poll every millisecond).
async fn poll_until(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> bool,
) -> Result<Duration, HarnessError> {
    let started = Instant::now();
    while !f() {
        if started.elapsed() > timeout {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        tokio::time::sleep(every).await;
    }
    Ok(started.elapsed())
}

/// A generous deadline for something that scales with the number of agents.
fn scaled(agents: usize) -> Duration {
    Duration::from_secs(60 + (agents as u64) / 50)
}

/// Creates the hub namespaces of `n` agents (as an operator would, ahead of time).
async fn create_namespaces(env: &BenchEnv, n: usize) -> Result<(), HarnessError> {
    let client = kube_client(&env.hub)?;
    let api: Api<DynamicObject> = Api::all_with(
        client,
        &argocd_agent_testkit::harness::resource("", "Namespace", "namespaces"),
    );
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let ns: DynamicObject = serde_json::from_value(
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": sim_name(i)}}),
                )?;
                match api.create(&PostParams::default(), &ns).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) => Err(HarnessError::from(e)),
                }
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// An Application of about `pad` bytes more than a minimal one (inline Helm values, as real
/// Applications often carry), tracking `revision`.
pub fn bench_app(name: &str, ns: &str, revision: &str, pad: usize) -> Value {
    let mut values = String::with_capacity(pad + 64);
    let mut i = 0;
    while values.len() < pad {
        values.push_str(&format!("replica{i}: {{cpu: 250m, memory: 256Mi}}\n"));
        i += 1;
    }
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": ns, "labels": {"team": "bench"}},
        "spec": {
            "project": "default",
            "source": {
                "repoURL": "https://github.com/argoproj/argocd-example-apps",
                "path": "helm-guestbook",
                "targetRevision": revision,
                "helm": {"values": values}
            },
            "destination": {"server": "https://kubernetes.default.svc", "namespace": name},
            "syncPolicy": {"automated": {"prune": true, "selfHeal": true}}
        }
    })
}

/// Creates `app-<j>` for `j` in `range` in agent `j % agents`'s namespace.
async fn create_apps(
    env: &BenchEnv,
    agents: usize,
    range: std::ops::Range<usize>,
    revision: &str,
    pad: usize,
    writers: usize,
) -> Result<(), HarnessError> {
    let apps = range.map(|j| (sim_name(j % agents), format!("app-{j}")));
    create_named_apps(env, apps, revision, pad, writers).await
}

/// Creates one Application per (namespace, name) on the hub, `writers` at once.
async fn create_named_apps(
    env: &BenchEnv,
    apps: impl Iterator<Item = (String, String)>,
    revision: &str,
    pad: usize,
    writers: usize,
) -> Result<(), HarnessError> {
    let client = kube_client(&env.hub)?;
    futures::stream::iter(apps)
        .map(|(ns, name)| {
            let client = client.clone();
            let revision = revision.to_owned();
            async move {
                let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &app_resource());
                let app: DynamicObject =
                    serde_json::from_value(bench_app(&name, &ns, &revision, pad))?;
                api.create(&PostParams::default(), &app).await?;
                Ok::<_, HarnessError>(())
            }
        })
        .buffer_unordered(writers.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Points agent `i`'s `app-<i>` on the hub at `revision` (a spec change, through the API).
async fn set_revision(
    client: &kube::Client,
    i: usize,
    revision: String,
) -> Result<(), HarnessError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &sim_name(i), &app_resource());
    merge_patch(
        &api,
        &format!("app-{i}"),
        json!({"spec": {"source": {"targetRevision": revision}}}),
    )
    .await
}

/// Issues SVIDs and builds `n` simulated agents.
fn make_agents(env: &BenchEnv, n: usize) -> Result<Vec<Arc<SimAgent>>, HarnessError> {
    (0..n)
        .map(|i| {
            let name = sim_name(i);
            let id = argocd_agent_identity::SpiffeId::parse(&sim_id(&name))?;
            SimAgent::new(name, env.svid(&id, Duration::from_secs(3600))?)
        })
        .collect()
}

fn fleet(env: &BenchEnv, agents: Vec<Arc<SimAgent>>, opts: &BenchOptions) -> Fleet {
    let principals = std::iter::once(env.principal_addr)
        .chain(env.replicas.iter().map(|r| r.addr))
        .collect();
    fleet_to(principals, agents, opts)
}

/// A fleet dialing `principals` (a byte-counting proxy, say).
fn fleet_to(
    principals: Vec<std::net::SocketAddr>,
    agents: Vec<Arc<SimAgent>>,
    opts: &BenchOptions,
) -> Fleet {
    Fleet::start(
        agents,
        FleetConfig {
            principals,
            heartbeat: opts.heartbeat,
            keepalive: opts.keepalive,
            compression: opts.compression,
        },
    )
}

/// `opts.agents` simulated agents, started, and every one connected within `timeout`.
async fn connected_fleet_within(
    env: &BenchEnv,
    opts: &BenchOptions,
    timeout: Duration,
) -> Result<Fleet, HarnessError> {
    let n = opts.agents;
    let fleet = fleet(env, make_agents(env, n)?, opts);
    if let Err(e) = until("every agent connected", timeout, || fleet.connected() == n).await {
        let connected = fleet.connected();
        fleet.stop().await;
        return Err(format!("{e} ({connected} of {n})").into());
    }
    Ok(fleet)
}

/// [`connected_fleet_within`] with one Application per agent (`app-<i>` at revision `v1`, ~`pad`
/// bytes) on the hub, created first, and held by every agent before this returns.
async fn settled_fleet(
    env: &BenchEnv,
    opts: &BenchOptions,
    pad: usize,
) -> Result<Fleet, HarnessError> {
    settled_fleet_within(env, opts, pad, scaled(opts.agents)).await
}

/// [`settled_fleet`], waiting at most `timeout` for every agent to connect.
async fn settled_fleet_within(
    env: &BenchEnv,
    opts: &BenchOptions,
    pad: usize,
    timeout: Duration,
) -> Result<Fleet, HarnessError> {
    let n = opts.agents;
    create_namespaces(env, n).await?;
    create_apps(env, n, 0..n, "v1", pad, opts.writers).await?;
    let fleet = connected_fleet_within(env, opts, timeout).await?;
    wait_holding(&fleet, "v1", pad, scaled(n)).await?;
    Ok(fleet)
}

/// Runs `f`, and stops the environment however it went (the principal log's tail joins an
/// error).
async fn with_env<F, Fut>(opts: &BenchOptions, f: F) -> Result<Report, HarnessError>
where
    F: FnOnce(BenchEnv) -> Fut,
    Fut: std::future::Future<Output = (BenchEnv, Result<Report, HarnessError>)>,
{
    with_replicas(opts, 1, f).await
}

/// [`with_env`] with `replicas` principal processes ([`BenchEnv::start_ha`]).
async fn with_replicas<F, Fut>(
    opts: &BenchOptions,
    replicas: usize,
    f: F,
) -> Result<Report, HarnessError>
where
    F: FnOnce(BenchEnv) -> Fut,
    Fut: std::future::Future<Output = (BenchEnv, Result<Report, HarnessError>)>,
{
    let env = BenchEnv::start_ha(opts.dir.clone(), &opts.principal_args, replicas).await?;
    let (env, result) = f(env).await;
    let log = env.logs(30);
    env.stop().await;
    result.map_err(|e| format!("{e}\nprincipal log (tail):\n{log}").into())
}

async fn connect(opts: &BenchOptions) -> Result<Report, HarnessError> {
    let n = opts.agents;
    with_env(opts, |env| async move {
        let r = async {
            create_namespaces(&env, n).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let before = env.sample()?;
            let issued = Instant::now();
            let agents = make_agents(&env, n)?;
            let issue_time = issued.elapsed();
            let floor_tls: Vec<_> = agents.iter().map(|a| a.tls()).collect();
            let fleet = fleet(&env, agents, opts);
            let started = Instant::now();
            let mut connected_at = None;
            while connected_at.is_none() {
                if env
                    .metric("argocd_principal_connected_agents")
                    .await
                    .unwrap_or(0.0) as usize
                    >= n
                {
                    connected_at = Some(started.elapsed());
                } else if started.elapsed() > scaled(n) {
                    return Err(format!(
                        "only {} of {n} agents connected after {:?}",
                        fleet.connected(),
                        scaled(n)
                    )
                    .into());
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            let connect_time = connected_at.unwrap_or_default();
            // Settle, then measure an idle period with default heartbeats, over whole
            // heartbeat periods.
            tokio::time::sleep(Duration::from_secs(2)).await;
            const LEASE_WRITES: &str = "argocd_principal_lease_writes_total";
            const RECEIVED: &str = "principal_events_received";
            let [leases_connected, received_connected] = env
                .metrics([LEASE_WRITES, RECEIVED])
                .await
                .map(|v| v.unwrap_or(0.0));
            let idle = whole_periods(opts.duration, opts.heartbeat);
            let idle_start = env.sample()?;
            tokio::time::sleep(idle).await;
            let idle_end = env.sample()?;
            let [leases_now, received_now] = env
                .metrics([LEASE_WRITES, RECEIVED])
                .await
                .map(|v| v.unwrap_or(0.0));
            let (leases_idle, received_idle) = (
                leases_now - leases_connected,
                received_now - received_connected,
            );
            let bench_rss = ProcSample::read(std::process::id())?.rss;
            let dropped = fleet
                .stats
                .dropped
                .load(std::sync::atomic::Ordering::Relaxed);
            fleet.stop().await;
            let gone = Instant::now();
            while env
                .metric("argocd_principal_connected_agents")
                .await
                .unwrap_or(1.0)
                > 0.0
            {
                if gone.elapsed() > scaled(n) {
                    return Err("agents still counted as connected after the fleet stopped".into());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            let after = env.sample()?;
            // The floor in the same run: a bare tonic server holding one idle stream per
            // agent over the same mTLS, as its own process.
            let floor = floor::idle_floor(&env.dir, &floor_tls, Duration::from_secs(5)).await?;
            let idle_bytes = idle_end.rss.saturating_sub(before.rss) / n.max(1) as u64;
            let mut r = Report::new(Scenario::Connect);
            r.put("agents", n);
            r.put("connect_s", round2(connect_time.as_secs_f64()));
            r.put(
                "handshakes_per_s",
                round2(n as f64 / connect_time.as_secs_f64().max(1e-9)),
            );
            r.put("rss_before_mib", round2(mib(before.rss)));
            r.put("rss_connected_mib", round2(mib(idle_end.rss)));
            r.put("idle_bytes_per_agent", idle_bytes);
            r.put("floor_idle_bytes_per_conn", floor.bytes_per_conn);
            r.put(
                "idle_ratio_to_floor",
                round2(idle_bytes as f64 / floor.bytes_per_conn.max(1) as f64),
            );
            r.put("idle_cpu_pct", idle_end.cpu_percent_since(&idle_start));
            r.put("idle_s", round2(idle.as_secs_f64()));
            // Everything an idle agent sends is its heartbeat.
            let heartbeats = received_idle.max(0.0) as u64;
            r.put("idle_heartbeats", heartbeats);
            r.put(
                "idle_cpu_us_per_heartbeat",
                idle_end.cpu_since(&idle_start).per(heartbeats, 1e6),
            );
            if leases_connected > 0.0 {
                // With --ha: Lease writes to connect everyone, and per second while idle.
                r.put("lease_writes_connect", leases_connected as u64);
                r.put(
                    "lease_writes_idle_per_s",
                    round2(leases_idle / idle.as_secs_f64().max(1e-9)),
                );
            }
            r.put("rss_after_disconnect_mib", round2(mib(after.rss)));
            r.put("dropped_streams", dropped);
            r.put("svid_issue_s", round2(issue_time.as_secs_f64()));
            r.put("bench_rss_mib", round2(mib(bench_rss)));
            Ok(r)
        }
        .await;
        (env, r)
    })
    .await
}

/// The idle window for `asked`: rounded up to whole heartbeat `period`s (at least one). An
/// idle fleet's heartbeats come in rounds (each agent's 30 s from its welcome, and the fleet
/// welcomed within seconds), so a window of 20, 40 or 45 s holds one round or two depending
/// on where it starts: measured so, idle CPU swung by half. A window of whole periods holds
/// exactly one heartbeat per agent per period wherever it starts. (The principal's own
/// PINGs do not come while heartbeats do: `agent_listener`'s tests.)
pub(crate) fn whole_periods(asked: Duration, period: Duration) -> Duration {
    if period.is_zero() {
        return asked;
    }
    let n = asked.as_nanos().div_ceil(period.as_nanos()).max(1);
    u32::try_from(n)
        .ok()
        .and_then(|n| period.checked_mul(n))
        .unwrap_or(asked)
}

/// Waits until every agent holds `app-<i>` with the checksum of `revision`'s spec.
async fn wait_holding(
    fleet: &Fleet,
    revision: &str,
    pad: usize,
    timeout: Duration,
) -> Result<Duration, HarnessError> {
    let want: Vec<String> = fleet
        .agents
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let app = bench_app(&format!("app-{i}"), &a.name, revision, pad);
            argocd_agent_kubernetes::object::checksum_of(&app["spec"])
        })
        .collect();
    until(
        &format!("every agent to hold its app at {revision}"),
        timeout,
        || {
            fleet
                .agents
                .iter()
                .enumerate()
                .all(|(i, a)| a.checksum(&format!("app-{i}")).as_deref() == Some(want[i].as_str()))
        },
    )
    .await
}

async fn storm(opts: &BenchOptions) -> Result<Report, HarnessError> {
    let n = opts.agents;
    let pad = 512;
    with_env(opts, |mut env| async move {
        let r = async {
            let fleet = settled_fleet(&env, opts, pad).await?;
            let sessions_before = fleet
                .stats
                .sessions
                .load(std::sync::atomic::Ordering::Relaxed);

            env.kill_principal().await;
            until("every session to notice the crash", scaled(n), || {
                fleet.connected() == 0
            })
            .await?;
            // While the principal is down, every Application changes on the hub: the restart
            // has to bring each agent the new spec through resync.
            let client = kube_client(&env.hub)?;
            futures::stream::iter(0..n)
                .map(|i| set_revision(&client, i, "v2".into()))
                .buffer_unordered(opts.writers.max(1))
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<Vec<()>, _>>()?;

            let restarted = Instant::now();
            env.restart_principal().await?;
            let ready = restarted.elapsed();
            let reconnected = until("every agent reconnected", scaled(n), || {
                fleet.connected() == n
            })
            .await?
                + ready;
            let resynced = wait_holding(&fleet, "v2", pad, scaled(n)).await? + ready;
            let resynced = resynced.max(reconnected);
            let sessions = fleet
                .stats
                .sessions
                .load(std::sync::atomic::Ordering::Relaxed)
                - sessions_before;
            let failed = fleet
                .stats
                .failed_attempts
                .load(std::sync::atomic::Ordering::Relaxed);
            fleet.stop().await;
            let mut r = Report::new(Scenario::Storm);
            r.put("agents", n);
            r.put("principal_ready_s", round2(ready.as_secs_f64()));
            r.put("reconnected_s", round2(reconnected.as_secs_f64()));
            r.put("resynced_s", round2(resynced.as_secs_f64()));
            r.put(
                "handshakes_per_s",
                round2(n as f64 / reconnected.as_secs_f64().max(1e-9)),
            );
            r.put("sessions", sessions);
            r.put("failed_attempts", failed);
            Ok(r)
        }
        .await;
        (env, r)
    })
    .await
}

/// The value of `--replica-lease-duration` in `args` (`--flag=v` or `--flag v`), if given.
fn replica_lease_arg(args: &[String]) -> Option<String> {
    const FLAG: &str = "--replica-lease-duration";
    args.iter().enumerate().rev().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(FLAG).and_then(|r| r.strip_prefix('=')) {
            Some(v.to_owned())
        } else if a == FLAG {
            args.get(i + 1).cloned()
        } else {
            None
        }
    })
}

async fn failover(opts: &BenchOptions) -> Result<Report, HarnessError> {
    use std::sync::atomic::Ordering::Relaxed;
    const CONNECTED: &str = "argocd_principal_connected_agents";
    const LEASE_WRITES: &str = "argocd_principal_lease_writes_total";
    let n = opts.agents;
    let replicas = opts.replicas.max(2);
    let pad = 512;
    let lease = replica_lease_arg(&opts.principal_args).unwrap_or_else(|| "10s".into());
    with_replicas(opts, replicas, |mut env| async move {
        let r = async {
            // Replicas turn sessions away above their share of the agents (by the Leases they
            // have seen), so a whole fleet connecting at once takes a while to settle.
            let settling = Instant::now();
            let fleet = settled_fleet_within(&env, opts, pad, scaled(n) * 5).await?;
            let settled = settling.elapsed();
            // Where every agent is before the crash (rebalancing may have moved some while
            // the fleet settled).
            let before: Vec<Option<usize>> =
                fleet.agents.iter().map(|a| a.principal_index()).collect();
            let on_killed = before.iter().filter(|&&p| p == Some(0)).count();
            let sessions_before = fleet.stats.sessions.load(Relaxed);
            let failed_before = fleet.stats.failed_attempts.load(Relaxed);
            let leases_before = env.replicas_metric(LEASE_WRITES).await?;

            let killed = Instant::now();
            env.kill_principal().await;
            // Right away, every Application changes on the hub: the agents that move get the
            // new spec through resync on their new replica, the others through the watch.
            let client = kube_client(&env.hub)?;
            futures::stream::iter(0..n)
                .map(|i| set_revision(&client, i, "v2".into()))
                .buffer_unordered(opts.writers.max(1))
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<Vec<()>, _>>()?;
            let written = killed.elapsed();

            // Reconnected: every agent has a live session on a survivor, by its own count
            // and by the survivors'.
            let deadline = scaled(n) + Duration::from_secs(60);
            let reconnected = loop {
                if fleet.connected() == n
                    && fleet.agents.iter().all(|a| a.principal_index() != Some(0))
                    && env.replicas_metric(CONNECTED).await.unwrap_or(0.0) as usize == n
                {
                    break killed.elapsed();
                }
                if killed.elapsed() > deadline {
                    return Err(format!(
                        "{} of {n} agents connected {:?} after the kill (survivors count {})",
                        fleet.connected(),
                        killed.elapsed(),
                        env.replicas_metric(CONNECTED).await.unwrap_or(-1.0)
                    )
                    .into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            wait_holding(&fleet, "v2", pad, deadline).await?;
            let resynced = killed.elapsed().max(reconnected);
            let leases_after = env.replicas_metric(LEASE_WRITES).await?;
            let moved = fleet
                .agents
                .iter()
                .zip(&before)
                .filter(|(a, b)| a.principal_index() != **b)
                .count();
            let sessions = fleet.stats.sessions.load(Relaxed) - sessions_before;
            let failed = fleet.stats.failed_attempts.load(Relaxed) - failed_before;
            fleet.stop().await;
            let mut r = Report::new(Scenario::Failover);
            r.put("agents", n);
            r.put("replicas", replicas);
            r.put("replica_lease", lease);
            r.put("settle_s", round2(settled.as_secs_f64()));
            r.put("on_killed_replica", on_killed);
            r.put("hub_writes_s", round2(written.as_secs_f64()));
            r.put("reconnected_s", round2(reconnected.as_secs_f64()));
            r.put("resynced_s", round2(resynced.as_secs_f64()));
            r.put("moved", moved);
            r.put("sessions", sessions);
            r.put("failed_attempts", failed);
            r.put(
                "lease_writes",
                (leases_after - leases_before).max(0.0) as u64,
            );
            Ok(r)
        }
        .await;
        (env, r)
    })
    .await
}

/// p50, p99 and max of `samples`, in milliseconds.
fn percentiles(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    (round2(at(0.50)), round2(at(0.99)), round2(at(1.0)))
}

async fn fanout(opts: &BenchOptions) -> Result<Report, HarnessError> {
    let n = opts.agents;
    let m = opts.changes;
    let pad = 512;
    with_env(opts, |env| async move {
        let r = async {
            let fleet = settled_fleet(&env, opts, pad).await?;
            let client = kube_client(&env.hub)?;

            // Hub -> agent: one spec change at a time, to a different agent each time.
            fleet.arrivals.track(true);
            let mut writes = Vec::with_capacity(m);
            for j in 0..m {
                let i = (j * 7919) % n;
                let marker = format!("r{j}");
                let t = Instant::now();
                set_revision(&client, i, marker).await?;
                writes.push((format!("app-{i}@r{j}"), t));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            until("every change at its agent", Duration::from_secs(60), || {
                writes.iter().all(|(k, _)| fleet.arrivals.get(k).is_some())
            })
            .await?;
            let down: Vec<Duration> = writes
                .iter()
                .filter_map(|(k, t)| Some(fleet.arrivals.get(k)?.saturating_duration_since(*t)))
                .collect();

            // Agent -> hub: one status update at a time; latency until the hub holds it.
            let mut up = Vec::with_capacity(m);
            for j in 0..m {
                let i = (j * 7919) % n;
                let marker = format!("s{j}");
                let name = format!("app-{i}");
                let t = Instant::now();
                fleet.agents[i].send_status(
                    &name,
                    json!({"sync": {"status": "Synced", "revision": marker}, "health": {"status": "Healthy"}}),
                )?;
                let ns = sim_name(i);
                poll_until(&format!("status {marker} of {ns}/{name} on the hub"), Duration::from_secs(30), Duration::from_millis(1), || {
                    argocd_agent_testkit::harness::stored_app(&env.hub, &ns, &name)
                        .and_then(|a| a.pointer("/status/sync/revision").cloned())
                        .is_some_and(|r| r == marker.as_str())
                })
                .await?;
                up.push(t.elapsed());
            }
            fleet.stop().await;
            let (d50, d99, dmax) = percentiles(down);
            let (u50, u99, umax) = percentiles(up);
            let mut r = Report::new(Scenario::Fanout);
            r.put("agents", n);
            r.put("changes", m);
            r.put("hub_to_agent_p50_ms", d50);
            r.put("hub_to_agent_p99_ms", d99);
            r.put("hub_to_agent_max_ms", dmax);
            r.put("agent_to_hub_p50_ms", u50);
            r.put("agent_to_hub_p99_ms", u99);
            r.put("agent_to_hub_max_ms", umax);
            Ok(r)
        }
        .await;
        (env, r)
    })
    .await
}

async fn throughput(opts: &BenchOptions) -> Result<Report, HarnessError> {
    use std::sync::atomic::Ordering::Relaxed;
    let n = opts.agents;
    let m = opts.changes;
    let pad = opts.payload_bytes;
    with_env(opts, |env| async move {
        let r = async {
            create_namespaces(&env, n).await?;
            // With --wire-bytes the agents dial through a proxy that counts TCP payload
            // bytes (TLS records) each way.
            let proxy = match opts.wire_bytes {
                true => Some(TcpProxy::start(env.principal_addr).await?),
                false => None,
            };
            let dial = || vec![proxy.as_ref().map_or(env.principal_addr, |p| p.addr)];
            let wire = || proxy.as_ref().map(TcpProxy::bytes).unwrap_or_default();
            let fleet = fleet_to(dial(), make_agents(&env, n)?, opts);
            until("every agent connected", scaled(n), || {
                fleet.connected() == n
            })
            .await?;

            // Principal -> agents: m new Applications of ~pad bytes, written by `writers`.
            let w0 = wire();
            let base = fleet.stats.events_in.load(Relaxed);
            let started = Instant::now();
            create_apps(&env, n, 0..m, "v1", pad, opts.writers).await?;
            let written = started.elapsed();
            until("every Application at its agent", scaled(m), || {
                fleet.stats.events_in.load(Relaxed) >= base + m as u64
            })
            .await?;
            let down_time = started.elapsed();
            let down_rate = m as f64 / down_time.as_secs_f64();
            let bytes = fleet.stats.bytes_in.load(Relaxed);
            let event_bytes = bytes / (fleet.stats.events_in.load(Relaxed).max(1));
            let w1 = wire();

            // Agents -> principal: m status updates of ~pad bytes to those Applications.
            let status_pad = "x".repeat(pad.saturating_sub(200));
            let acked = fleet.stats.acked_out.load(Relaxed);
            let started = Instant::now();
            for j in 0..m {
                fleet.agents[j % n].send_status(
                    &format!("app-{j}"),
                    json!({"sync": {"status": "Synced", "revision": format!("s{j}")},
                           "health": {"status": "Healthy"},
                           "summary": {"images": [status_pad]}}),
                )?;
            }
            until("every status update acknowledged", scaled(m), || {
                fleet.stats.acked_out.load(Relaxed) + fleet.stats.refused.load(Relaxed)
                    >= acked + m as u64
            })
            .await?;
            let up_time = started.elapsed();
            let up_rate = m as f64 / up_time.as_secs_f64();
            let w2 = wire();
            let refused = fleet.stats.refused.load(Relaxed);

            // The floor, same clients, same bytes.
            let sample = bench_app("app-0", &sim_name(0), "v1", pad);
            let event = argocd_agent_domain::Event::resource(
                "bench",
                argocd_agent_domain::EventType::Create,
                argocd_agent_domain::event::ResourceRef::new(
                    argocd_agent_domain::ResourceKind::Application,
                    argocd_agent_domain::Namespace::new(&sim_name(0))?,
                    "app-0",
                ),
                argocd_agent_domain::Payload::Object(Arc::new(sample)),
            )
            .to_cloud_event();
            let principal_svid = env.svid(
                &argocd_agent_identity::SpiffeId::parse(
                    argocd_agent_testkit::harness::PRINCIPAL_ID,
                )?,
                Duration::from_secs(3600),
            )?;
            let floor = floor::Floor::start(principal_svid, event.clone()).await?;
            let tls: Vec<_> = fleet.agents.iter().map(|a| a.tls()).collect();
            let clients = floor.connect(&tls).await?;
            // Enough events that connection set-up and ramp-up do not count.
            let per_client = (m.max(20 * n).max(10_000) / n).max(1) as u64;
            let cpu0 = ProcSample::read(std::process::id())?;
            let floor_down = floor.download(&clients, per_client).await?;
            // Both ends of the floor are in this process: its CPU per event, both ends.
            let floor_cpu = ProcSample::read(std::process::id())?.cpu_since(&cpu0);
            let floor_up = floor.upload(&clients, per_client, &event).await?;
            drop(clients);

            // Principal -> agents from its watch cache: m more Applications are created
            // while every agent is away (not timed), then the agents come back without
            // the Applications they held, so their resync sends all 2·m. No hub write is
            // in this path; it is the principal's own pipeline (cache, queue, stream,
            // acknowledgements), with the agents' n TLS handshakes in its time.
            fleet.stop().await;
            create_apps(&env, n, m..2 * m, "v1", pad, opts.writers).await?;
            let agents = make_agents(&env, n)?;
            // The principal has taken in the watch events of those creates.
            env.until_quiet(scaled(m)).await?;
            // CPU of the principal and of this process (the agents; the hub is idle) while
            // the backlog flows, per event: where the time goes on the shared cores.
            // Both finer than clock ticks (see `env::CpuClock`): a short backlog (the smoke
            // test's 48 events) can take less than one tick.
            let (p0, b0) = (env.sample()?, ProcSample::read(std::process::id())?);
            let wb0 = wire();
            let started = Instant::now();
            let fleet = fleet_to(dial(), agents, opts);
            let backlog = 2 * m;
            let held = until("the backlog at the agents", scaled(backlog), || {
                fleet.agents.iter().map(|a| a.app_count()).sum::<usize>() >= backlog
            })
            .await;
            let backlog_time = started.elapsed();
            let (p1, b1) = (env.sample()?, ProcSample::read(std::process::id())?);
            let wb1 = wire();
            fleet.stop().await;
            held?;
            let backlog_rate = backlog as f64 / backlog_time.as_secs_f64();
            let mut r = Report::new(Scenario::Throughput);
            r.put("agents", n);
            r.put("events", m);
            r.put("event_bytes", event_bytes);
            r.put("hub_write_per_s", round2(m as f64 / written.as_secs_f64()));
            r.put("to_agents_per_s", round2(down_rate));
            r.put("floor_to_agents_per_s", round2(floor_down));
            r.put("to_agents_ratio", round2(down_rate / floor_down));
            r.put("backlog_to_agents_per_s", round2(backlog_rate));
            r.put("backlog_ratio", round2(backlog_rate / floor_down));
            r.put(
                "backlog_principal_cpu_us_per_event",
                p1.cpu_since(&p0).per(backlog as u64, 1e6),
            );
            r.put(
                "backlog_agents_cpu_us_per_event",
                b1.cpu_since(&b0).per(backlog as u64, 1e6),
            );
            r.put(
                "floor_cpu_us_per_event",
                floor_cpu.per(per_client * n as u64, 1e6),
            );
            r.put("to_principal_per_s", round2(up_rate));
            r.put("floor_to_principal_per_s", round2(floor_up));
            r.put("to_principal_ratio", round2(up_rate / floor_up));
            r.put("refused", refused);
            r.put(
                "compression",
                opts.compression
                    .map_or("none".to_string(), |c| c.to_string()),
            );
            if proxy.is_some() {
                // TCP payload per event: hub -> agents live, agents -> hub (status), and
                // the backlog (with the n TLS handshakes of the returning agents in it).
                let per = |bytes: u64, events: usize| bytes / events.max(1) as u64;
                r.put("wire_bytes_per_event_to_agents", per(w1.1 - w0.1, m));
                r.put("wire_bytes_per_event_to_principal", per(w2.0 - w1.0, m));
                r.put("backlog_wire_bytes_per_event", per(wb1.1 - wb0.1, backlog));
            }
            r.put("principal_hub_requests", json!(env.principal_requests()));
            Ok(r)
        }
        .await;
        (env, r)
    })
    .await
}

async fn rotation(opts: &BenchOptions) -> Result<Report, HarnessError> {
    use std::sync::atomic::Ordering::Relaxed;
    let n = opts.agents;
    let pad = 512;
    with_env(opts, |env| async move {
        let r = async {
            let fleet = settled_fleet(&env, opts, pad).await?;
            let sessions_before = fleet.stats.sessions.load(Relaxed);
            let client = kube_client(&env.hub)?;

            // Changes flow while every SVID rotates every 2 s; after each rotation a tenth of
            // the agents reconnect on purpose, so new handshakes use the new SVIDs on both
            // sides.
            let started = Instant::now();
            let mut rotations = 0u64;
            let mut kicked = 0u64;
            let mut changes = 0usize;
            let mut next_rotation = Instant::now() + Duration::from_secs(2);
            while started.elapsed() < opts.duration {
                let i = (changes * 7919) % n;
                set_revision(&client, i, format!("c{changes}")).await?;
                changes += 1;
                if Instant::now() >= next_rotation {
                    env.spiffe.rotate_now()?;
                    for a in &fleet.agents {
                        let id = argocd_agent_identity::SpiffeId::parse(&sim_id(&a.name))?;
                        a.rotate(env.svid(&id, Duration::from_secs(3600))?);
                    }
                    for a in fleet
                        .agents
                        .iter()
                        .skip(rotations as usize % 10)
                        .step_by(10)
                    {
                        a.kick();
                        kicked += 1;
                    }
                    rotations += 1;
                    next_rotation = Instant::now() + Duration::from_secs(2);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            until("every agent connected again", scaled(n), || {
                fleet.connected() == n
            })
            .await?;
            // Every Application's last change must have arrived.
            let want: Vec<(usize, String)> = (0..n)
                .filter_map(|i| {
                    let app = argocd_agent_testkit::harness::stored_app(
                        &env.hub,
                        &sim_name(i),
                        &format!("app-{i}"),
                    )?;
                    Some((
                        i,
                        argocd_agent_kubernetes::object::checksum_of(&app["spec"]),
                    ))
                })
                .collect();
            let converged = until("every last change at its agent", scaled(n), || {
                want.iter().all(|(i, sum)| {
                    fleet.agents[*i].checksum(&format!("app-{i}")).as_deref() == Some(sum)
                })
            })
            .await
            .is_ok();
            let lost = if converged {
                0
            } else {
                want.iter()
                    .filter(|(i, sum)| {
                        fleet.agents[*i].checksum(&format!("app-{i}")).as_deref() != Some(sum)
                    })
                    .count()
            };
            let dropped = fleet.stats.dropped.load(Relaxed);
            let failed_handshakes = fleet.stats.failed_attempts.load(Relaxed);
            let refused = fleet.stats.refused.load(Relaxed);
            let sessions = fleet.stats.sessions.load(Relaxed) - sessions_before;
            fleet.stop().await;
            let mut r = Report::new(Scenario::Rotation);
            r.put("agents", n);
            r.put("seconds", opts.duration.as_secs());
            r.put("rotations", rotations);
            r.put("changes", changes);
            r.put("reconnects_with_new_svids", kicked);
            r.put("sessions", sessions);
            r.put("dropped_streams", dropped);
            r.put("failed_handshakes", failed_handshakes);
            r.put("refused_events", refused);
            r.put("lost_changes", lost);
            Ok(r)
        }
        .await;
        (env, r)
    })
    .await
}

/// Name -> spec checksum of the Applications of one namespace of a test server, without
/// `spec.project` (an autonomous agent's project is `<agent>-<project>` on the hub).
fn spec_sums(
    server: &argocd_agent_kube_test_server::KubeTestServer,
    ns: &str,
) -> std::collections::BTreeMap<String, String> {
    server
        .list_objects("argoproj.io", "v1alpha1", "applications", Some(ns))
        .into_iter()
        .filter(|a| a.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|a| {
            let name = a.pointer("/metadata/name")?.as_str()?.to_owned();
            let mut spec = a.get("spec").cloned().unwrap_or_default();
            if let Some(m) = spec.as_object_mut() {
                m.remove("project");
            }
            Some((name, argocd_agent_kubernetes::object::checksum_of(&spec)))
        })
        .collect()
}

/// `ops` sequential operations on `api` (a third creates, a third edits, a third deletes,
/// interleaved), as a user's script against the Kubernetes API makes them.
async fn mixed_ops(api: &Api<DynamicObject>, ns: &str, ops: usize) -> Result<(), HarnessError> {
    let mut live: Vec<usize> = Vec::new();
    let mut next = 0usize;
    for j in 0..ops {
        match j % 3 {
            0 => {
                let app: DynamicObject =
                    serde_json::from_value(bench_app(&format!("bulk-{next}"), ns, "v1", 512))?;
                api.create(&PostParams::default(), &app).await?;
                live.push(next);
                next += 1;
            }
            1 if !live.is_empty() => {
                let i = live[(j * 7919) % live.len()];
                merge_patch(
                    api,
                    &format!("bulk-{i}"),
                    json!({"spec": {"source": {"targetRevision": format!("e{j}")}}}),
                )
                .await?;
            }
            _ if live.len() > 1 => {
                let i = live.remove((j * 104_729) % live.len());
                api.delete(&format!("bulk-{i}"), &Default::default())
                    .await?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// `ops` mixed operations on `written` (server, namespace); returns how long the writes took
/// and how long until `follower` held the same Applications, both from the first write.
async fn bulk_phase(
    written: (&argocd_agent_kube_test_server::KubeTestServer, &str),
    follower: (&argocd_agent_kube_test_server::KubeTestServer, &str),
    ops: usize,
) -> Result<(Duration, Duration), HarnessError> {
    let started = Instant::now();
    mixed_ops(
        &argocd_agent_testkit::harness::apps(written.0, written.1)?,
        written.1,
        ops,
    )
    .await?;
    let write_time = started.elapsed();
    let want = spec_sums(written.0, written.1);
    until(
        &format!("{} equal to what was written", follower.1),
        Duration::from_secs(300),
        || spec_sums(follower.0, follower.1) == want,
    )
    .await?;
    Ok((write_time, started.elapsed()))
}

async fn bulk(opts: &BenchOptions) -> Result<Report, HarnessError> {
    use argocd_agent_testkit::harness::{AUTONOMOUS, MANAGED, SPOKE_NS, Topology, TopologyOptions};
    let ops = opts.changes;
    let topo = Topology::start(TopologyOptions {
        dir: opts.dir.clone(),
        principal_args: opts.principal_args.clone(),
        ..Default::default()
    })
    .await?;
    let r = async {
        let mut r = Report::new(Scenario::Bulk);
        r.put("ops", ops);
        // Managed: the user writes to the hub; the managed spoke must follow.
        let (written, converged) =
            bulk_phase((&topo.hub, MANAGED), (&topo.managed_spoke, SPOKE_NS), ops).await?;
        r.put("managed_write_s", round2(written.as_secs_f64()));
        r.put("managed_converged_s", round2(converged.as_secs_f64()));
        // Autonomous: the user writes to the spoke; the hub must follow.
        let (written, converged) = bulk_phase(
            (&topo.autonomous_spoke, SPOKE_NS),
            (&topo.hub, AUTONOMOUS),
            ops,
        )
        .await?;
        r.put("autonomous_write_s", round2(written.as_secs_f64()));
        r.put("autonomous_converged_s", round2(converged.as_secs_f64()));
        Ok(r)
    }
    .await;
    let logs = topo.logs();
    topo.stop().await;
    r.map_err(|e: HarnessError| format!("{e}\n{}", env::tail(&logs, 40)).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_window_is_whole_heartbeat_periods() {
        let s = Duration::from_secs;
        assert_eq!(whole_periods(s(40), s(30)), s(60));
        assert_eq!(whole_periods(s(45), s(30)), s(60));
        assert_eq!(whole_periods(s(60), s(30)), s(60));
        assert_eq!(whole_periods(s(10), s(30)), s(30));
        assert_eq!(whole_periods(s(0), s(30)), s(30));
        let ms = Duration::from_millis;
        assert_eq!(whole_periods(s(3), ms(250)), s(3));
        assert_eq!(whole_periods(s(3), ms(400)), ms(3200));
        assert_eq!(whole_periods(s(7), Duration::ZERO), s(7));
        // Beyond what a Duration holds: the asked window as it is, no overflow.
        assert_eq!(whole_periods(Duration::MAX, s(30)), Duration::MAX);
    }

    #[test]
    fn small_figures_keep_three_significant_digits() {
        assert_eq!(fine(58.1234), 58.12);
        assert_eq!(fine(1.005), round2(1.005));
        assert_eq!(fine(0.71234), 0.712);
        assert_eq!(fine(0.0042137), 0.00421);
        assert_eq!(fine(-0.0042137), -0.00421);
        assert_eq!(fine(0.0), 0.0);
        let mut r = Report::new(Scenario::Connect);
        r.put("idle_cpu_pct", fine(0.0042137));
        r.put("connect_s", 1.5);
        r.put("cpu", "not measured: why");
        let table = r.table();
        assert!(table.contains("0.00421"), "{table}");
        assert!(table.contains("1.50"), "{table}");
        assert!(table.contains("not measured: why"), "{table}");
    }
}
