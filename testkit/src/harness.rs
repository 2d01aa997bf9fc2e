//! The end-to-end harness: a full local topology made of the development Workload API
//! server, Kubernetes API test servers for the hub and two spokes, and the real
//! `argocd-agent` binaries (principal, a managed agent, an autonomous agent) as child
//! processes. Used by the e2e tests and by `argocd-agent-dev demo`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::workload_api::{DevWorkloadApi, DevWorkloadApiHandle};
use argocd_agent_identity::SpiffeId;
use argocd_agent_identity::TrustDomain;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

use argocd_agent_kube_test_server::{KubeTestServer, ServerOptions};

/// Trust domain of the local topology.
pub const TRUST_DOMAIN: &str = "example.org";
/// SPIFFE ID of the principal.
pub const PRINCIPAL_ID: &str = "spiffe://example.org/ns/argocd/sa/argocd-agent-principal";
/// SPIFFE ID of an operator's workload (`operator.sock` in the topology directory); no rule of
/// the default topology maps it, so it is an operator only where a test adds an admin rule.
pub const OPERATOR_ID: &str = "spiffe://example.org/ns/platform/sa/operator";
/// Managed agent's name (and hub namespace).
pub const MANAGED: &str = "agent-managed";
/// Autonomous agent's name (and hub namespace).
pub const AUTONOMOUS: &str = "agent-autonomous";
/// Argo CD namespace on the spokes.
pub const SPOKE_NS: &str = "argocd";
/// Argo CD namespace on the hub (AppProjects, repository Secrets, GPG keys).
pub const HUB_ARGOCD_NS: &str = "argocd";
/// The mapping rule of the topology: SPIRE-on-Kubernetes style IDs of service accounts in
/// namespace `agents` map to the agent of the same name, in the hub namespace of that name.
pub const RULE: &str = "template:spiffe://{trust_domain}/ns/agents/sa/{sa}=>{sa},namespace={sa},trustDomains=example.org,mode=both";

/// SPIFFE ID of an agent's workload.
pub fn agent_id(agent: &str) -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/agents/sa/{agent}")
}

/// Errors of the harness.
pub type HarnessError = Box<dyn std::error::Error + Send + Sync>;

/// Directory of the binaries the harness runs instead of those next to the test
/// executable (e.g. `target/release`, to run the e2e tests, built as usual, against the
/// release binaries).
pub const BIN_DIR_ENV: &str = "ARGOCD_AGENT_E2E_BIN_DIR";

/// Path of a workspace binary: from [`BIN_DIR_ENV`] when set (it must be there), else next
/// to the test executable (same profile), building the CLI package in that profile if it
/// is missing.
pub fn binary(name: &str) -> Result<PathBuf, HarnessError> {
    if let Ok(p) = std::env::var(format!("CARGO_BIN_EXE_{name}")) {
        return Ok(PathBuf::from(p));
    }
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV).filter(|d| !d.is_empty()) {
        let candidate = PathBuf::from(dir).join(name);
        if !candidate.exists() {
            return Err(format!("{BIN_DIR_ENV}: no {}", candidate.display()).into());
        }
        return Ok(candidate);
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let candidate = dir.join(name);
    if candidate.exists() {
        return Ok(candidate);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // The shipped binaries are the CLI package's; the developer tool is its own package.
    let package = if name == "argocd-agent-dev" {
        "argocd-agent-devtools"
    } else {
        "argocd-agent-cli"
    };
    let mut args = vec!["build", "-q", "-p", package, "--bins"];
    // A release test build runs release binaries (`cargo test --release`).
    if dir.ends_with("release") {
        args.push("--release");
    }
    let status = std::process::Command::new(cargo).args(&args).status()?;
    if !status.success() || !candidate.exists() {
        return Err(format!(
            "could not build {name} (looked for {})",
            candidate.display()
        )
        .into());
    }
    Ok(candidate)
}

/// A child process with its log file, restartable with the same arguments.
pub struct Proc {
    /// Name in logs and failure messages (`principal`, or the agent's name).
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// A process not started yet: `program` with `args`, its output appended to `log`.
    pub fn new(name: &str, program: PathBuf, args: Vec<String>, log: PathBuf) -> Proc {
        Proc {
            name: name.into(),
            program,
            args,
            envs: vec![],
            log,
            child: None,
        }
    }

    /// Adds environment variable `k`=`v` for every start.
    pub fn env(mut self, k: &str, v: &str) -> Proc {
        self.envs.push((k.into(), v.into()));
        self
    }

    /// Starts (or restarts) the process; output is appended to its log file.
    pub fn start(&mut self) -> Result<(), HarnessError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let err = log.try_clone()?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        self.child = Some(cmd.spawn()?);
        Ok(())
    }

    /// Stops the process: SIGTERM, then SIGKILL after 5 s.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = child.kill().await;
    }

    /// Kills the process at once (a crash).
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Replaces the value after `flag` in the arguments (for the next start).
    pub fn set_arg(&mut self, flag: &str, value: &str) {
        if let Some(i) = self.args.iter().position(|a| a == flag)
            && let Some(v) = self.args.get_mut(i + 1)
        {
            *v = value.to_owned();
        }
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A TCP proxy that injects link faults: it cuts every connection passing through it
/// (mid-stream faults), delays every chunk it forwards, or takes the link down (new
/// connections are accepted and closed at once, as a dropped route looks to a dialer).
pub struct TcpProxy {
    /// Where the proxy listens (127.0.0.1, a free port): dial this instead of the target.
    pub addr: std::net::SocketAddr,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    faults: Arc<LinkFaults>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct LinkFaults {
    delay_ms: std::sync::atomic::AtomicU64,
    down: std::sync::atomic::AtomicBool,
    /// Bytes forwarded to the target, and from it.
    to_target: std::sync::atomic::AtomicU64,
    from_target: std::sync::atomic::AtomicU64,
}

/// Copies `from` to `to`, sleeping the proxy's current delay before each chunk.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    faults: Arc<LinkFaults>,
    to_target: bool,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let delay = faults.delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        let counter = if to_target {
            &faults.to_target
        } else {
            &faults.from_target
        };
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards every connection to `target`, without
    /// faults until told otherwise.
    pub async fn start(target: std::net::SocketAddr) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let faults: Arc<LinkFaults> = Arc::default();
        let (c2, f2) = (conns.clone(), faults.clone());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if f2.down.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let f3 = f2.clone();
                let h = tokio::spawn(async move {
                    let _ = inbound.set_nodelay(true);
                    if let Ok(outbound) = TcpStream::connect(target).await {
                        let _ = outbound.set_nodelay(true);
                        let (ir, iw) = inbound.into_split();
                        let (or, ow) = outbound.into_split();
                        tokio::join!(pump(ir, ow, f3.clone(), true), pump(or, iw, f3, false));
                    }
                });
                let mut conns = c2.lock().unwrap_or_else(|p| p.into_inner());
                conns.retain(|h| !h.is_finished());
                conns.push(h.abort_handle());
            }
        });
        Ok(TcpProxy {
            addr,
            conns,
            faults,
            task,
        })
    }

    /// Cuts every open connection (new ones are still accepted).
    pub fn cut_all(&self) {
        for h in self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            h.abort();
        }
    }

    /// Delays every forwarded chunk, both ways, by `d` (zero: no delay).
    pub fn set_delay(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.faults
            .delay_ms
            .store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Bytes forwarded so far (TCP payload: TLS records), to the target and from it.
    pub fn bytes(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.faults.to_target.load(Relaxed),
            self.faults.from_target.load(Relaxed),
        )
    }

    /// Takes the link down (cutting open connections and closing new ones) or up again.
    pub fn set_down(&self, down: bool) {
        self.faults
            .down
            .store(down, std::sync::atomic::Ordering::SeqCst);
        if down {
            self.cut_all();
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut_all();
        self.task.abort();
    }
}

/// Options of a topology.
#[derive(Debug, Clone, Default)]
pub struct TopologyOptions {
    /// Directory for sockets, CA, kubeconfigs and logs (default: a temporary directory).
    pub dir: Option<PathBuf>,
    /// Route agents through a fault-injecting TCP proxy.
    pub with_proxy: bool,
    /// Extra arguments for the principal.
    pub principal_args: Vec<String>,
    /// Extra arguments for every agent.
    pub agent_args: Vec<String>,
    /// Mode of the second agent (`agent-autonomous`, autonomous by default): `managed` gives
    /// a topology with two managed agents.
    pub second_agent_mode: Option<&'static str>,
    /// Which agents to start (default both).
    pub agents: Option<Vec<&'static str>>,
    /// `--creds` of the agents (default `spiffe`: SVID mTLS).
    pub agent_creds: Option<String>,
    /// A mapping rules file for the principal instead of the `--identity-rule` flag.
    pub rules_file: Option<PathBuf>,
    /// Extra environment variables for the principal and every agent.
    pub envs: Vec<(String, String)>,
    /// Extra environment variables for the principal only (after `envs`).
    pub principal_envs: Vec<(String, String)>,
    /// Extra arguments for one agent (by name), after `agent_args`.
    pub per_agent_args: Vec<(&'static str, Vec<String>)>,
    /// Resource types the spokes' API servers serve besides the defaults (e.g. batch Jobs).
    pub spoke_resources: Vec<argocd_agent_kube_test_server::ResourceType>,
    /// More Workload API sockets: (file name in the topology directory, SPIFFE ID), for
    /// hand-driven agents and operators ([`Topology::svid_source`]).
    pub extra_sockets: Vec<(String, String)>,
}

/// The whole local topology.
pub struct Topology {
    /// Working directory: Workload API sockets, kubeconfigs (`hub.kubeconfig`, ...) and logs.
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    /// The development Workload API server, one socket per workload.
    pub spiffe: DevWorkloadApiHandle,
    /// The hub's API server.
    pub hub: KubeTestServer,
    /// The managed agent's spoke API server.
    pub managed_spoke: KubeTestServer,
    /// The second agent's spoke API server.
    pub autonomous_spoke: KubeTestServer,
    /// The principal process.
    pub principal: Proc,
    /// The [`MANAGED`] agent's process; `None` when not started.
    pub managed: Option<Proc>,
    /// The [`AUTONOMOUS`] agent's process (in `second_agent_mode`); `None` when not started.
    pub autonomous: Option<Proc>,
    /// The principal's gRPC listener (the agents dial [`Topology::proxy`] instead when set).
    pub principal_addr: std::net::SocketAddr,
    /// The fault-injecting proxy between the agents and the principal (`with_proxy`).
    pub proxy: Option<TcpProxy>,
    /// Port of each process's `/metrics`, `/healthz`, `/readyz` endpoint on 127.0.0.1, by
    /// `"principal"` or agent name.
    pub metrics_ports: std::collections::HashMap<String, u16>,
    /// The principal's `--admin-address` (operator API).
    pub admin_address: String,
}

/// The arguments every test principal starts with: listen on 127.0.0.1:`port`, the hub
/// kubeconfig, metrics and health on 127.0.0.1:`metrics_port`, SVIDs from `spiffe_endpoint`.
pub fn principal_args(
    port: u16,
    kubeconfig: &Path,
    metrics_port: u16,
    spiffe_endpoint: &str,
) -> Vec<String> {
    vec![
        "principal".into(),
        "--listen-host".into(),
        "127.0.0.1".into(),
        "--listen-port".into(),
        port.to_string(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--metrics-host".into(),
        "127.0.0.1".into(),
        "--metrics-port".into(),
        metrics_port.to_string(),
        "--spiffe-endpoint-socket".into(),
        spiffe_endpoint.into(),
    ]
}

/// An mTLS channel to the principal at `addr` with `source`'s SVID, pinned to the
/// principal's SPIFFE ID: what a hand-driven agent (or an impostor) dials.
pub async fn dial_principal(
    source: &argocd_agent_identity::source::SvidSource,
    addr: std::net::SocketAddr,
) -> Result<tonic::transport::Channel, HarnessError> {
    let tls = argocd_agent_identity::tls::client_config(
        source,
        argocd_agent_identity::tls::PeerPolicy::Exact(SpiffeId::parse(PRINCIPAL_ID)?),
    )?;
    Ok(argocd_agent_identity::transport::connect(
        &addr.to_string(),
        tls,
        "127.0.0.1",
        argocd_agent_identity::transport::ChannelOptions::default(),
    )
    .await?)
}

/// The two ends of a hand-driven agent stream: events to send, events received.
pub type AgentStream = (
    tokio::sync::mpsc::Sender<argocd_agent_proto::cloudevents::CloudEvent>,
    tonic::Streaming<argocd_agent_proto::cloudevents::CloudEvent>,
);

/// Waits (up to 30 s) for the principal's answer (`processed` or an error) to the event with
/// `id` on a hand-driven agent stream, skipping whatever else arrives.
pub async fn answer_to(
    inbound: &mut tonic::Streaming<argocd_agent_proto::cloudevents::CloudEvent>,
    id: &str,
) -> Result<argocd_agent_domain::Event, HarnessError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let msg = tokio::time::timeout_at(deadline, inbound.message())
            .await??
            .ok_or("stream closed")?;
        let e = argocd_agent_domain::Event::from_cloud_event(msg)?;
        if e.ack_id.as_deref() == Some(id) {
            return Ok(e);
        }
    }
}

/// A hand-driven agent stream: dials the principal, sends a hello in `mode` (with no resync
/// state: an empty spoke), and returns the stream with the principal's first answer (the
/// welcome, when admitted).
pub async fn open_agent_stream(
    source: &argocd_agent_identity::source::SvidSource,
    addr: std::net::SocketAddr,
    mode: argocd_agent_proto::eventstream::AgentMode,
) -> Result<(AgentStream, argocd_agent_domain::Event), HarnessError> {
    use argocd_agent_domain::{Event, EventType, Payload};
    let channel = dial_principal(source, addr).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let hello = Event::new(
        "test-client",
        EventType::Hello,
        Payload::Hello(argocd_agent_proto::eventstream::Hello {
            mode: mode as i32,
            version: "test".into(),
            protocol_version: 1,
            ..Default::default()
        }),
    );
    tx.send(hello.to_cloud_event())
        .await
        .map_err(|e| e.to_string())?;
    let mut inbound =
        argocd_agent_proto::eventstream::event_stream_client::EventStreamClient::new(channel)
            .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
    let first = inbound
        .message()
        .await?
        .ok_or("stream closed before welcome")?;
    Ok(((tx, inbound), Event::from_cloud_event(first)?))
}

/// When a process first logged a line containing `what` at or after `since` (from the log
/// line's own timestamp, so the figure does not depend on how often a test polls).
pub fn logged_at(
    log: &str,
    what: &str,
    since: std::time::SystemTime,
) -> Option<std::time::SystemTime> {
    log.lines().filter(|l| l.contains(what)).find_map(|l| {
        let ts: jiff::Timestamp = l.split_whitespace().next()?.parse().ok()?;
        let at = std::time::SystemTime::from(ts);
        (at >= since).then_some(at)
    })
}

/// kubectl from `KUBECTL`, else the project virtualenv (`.ci/run` installs it there), else
/// `kubectl` on PATH.
pub fn kubectl() -> PathBuf {
    if let Some(p) = std::env::var_os("KUBECTL") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/kubectl");
    if venv.is_file() {
        return venv;
    }
    PathBuf::from("kubectl")
}

/// The sum of every series of `name` (a metric name, or one labelled series) on the
/// `/metrics` endpoint at 127.0.0.1:`port`; 0 when absent or unreachable.
pub async fn metric_sum(port: u16, name: &str) -> f64 {
    let text = http_get(port, "/metrics").await.unwrap_or_default();
    metric_value(&text, name).unwrap_or(0.0)
}

/// Runs `argocd-agentctl agent kubeconfig <agent>` against the hub kubeconfig in `dir`;
/// returns the path of the resource proxy kubeconfig it wrote.
pub async fn agent_kubeconfig(dir: &Path, agent: &str) -> PathBuf {
    let out_path = dir.join(format!("{agent}.proxy.kubeconfig"));
    let out = Command::new(binary("argocd-agentctl").expect("argocd-agentctl"))
        .args(["agent", "kubeconfig", agent, "--kubeconfig"])
        .arg(dir.join("hub.kubeconfig"))
        .arg("-f")
        .arg(&out_path)
        .output()
        .await
        .expect("running argocd-agentctl");
    assert!(
        out.status.success(),
        "agentctl agent kubeconfig: {}",
        output_text(&out)
    );
    out_path
}

/// Runs kubectl (see [`kubectl`]) with `--kubeconfig kubeconfig` and `args`, stdin closed.
pub async fn run_kubectl(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("running kubectl: {e} (run .ci/run once to install it)"))
}

/// Exit code, stdout and stderr of a finished command, for failure messages.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A core (`v1`) kind of objects in namespace `ns` of a test server.
pub fn core_api(server: &KubeTestServer, ns: &str, plural: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        kube_client(server).expect("client of a test server"),
        ns,
        &ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        },
    )
}

/// The `ApiResource` of Argo CD Applications.
pub fn app_resource() -> ApiResource {
    ApiResource {
        group: "argoproj.io".into(),
        version: "v1alpha1".into(),
        api_version: "argoproj.io/v1alpha1".into(),
        kind: "Application".into(),
        plural: "applications".into(),
    }
}

/// A kube client for a test server, authenticated as user `e2e` (the test itself, so its
/// requests are not mistaken for the principal's or an agent's in `KubeTestServer::requests`).
pub fn kube_client(server: &KubeTestServer) -> Result<kube::Client, HarnessError> {
    let url: http::Uri = server.url().parse()?;
    let mut config = kube::Config::new(url);
    let bearer = http::HeaderValue::try_from(format!("Bearer {}", server.token_for("e2e")))?;
    config.headers.push((http::header::AUTHORIZATION, bearer));
    config.root_cert = server.ca_certificate_der().map(|der| vec![der]);
    Ok(kube::Client::try_from(config)?)
}

/// Applications in `ns` of a test server.
pub fn apps(server: &KubeTestServer, ns: &str) -> Result<Api<DynamicObject>, HarnessError> {
    Ok(Api::namespaced_with(
        kube_client(server)?,
        ns,
        &app_resource(),
    ))
}

/// The `ApiResource` of a kind: `("argoproj.io", "AppProject", "appprojects")`,
/// `("", "Secret", "secrets")`, ...
pub fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    let (version, api_version) = if group.is_empty() {
        ("v1".to_owned(), "v1".to_owned())
    } else {
        ("v1alpha1".to_owned(), format!("{group}/v1alpha1"))
    };
    ApiResource {
        group: group.into(),
        version,
        api_version,
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// AppProjects in `ns` of a test server.
pub fn projects(server: &KubeTestServer, ns: &str) -> Result<Api<DynamicObject>, HarnessError> {
    let ar = resource("argoproj.io", "AppProject", "appprojects");
    Ok(Api::namespaced_with(kube_client(server)?, ns, &ar))
}

/// Secrets in `ns` of a test server.
pub fn secrets(server: &KubeTestServer, ns: &str) -> Result<Api<DynamicObject>, HarnessError> {
    let ar = resource("", "Secret", "secrets");
    Ok(Api::namespaced_with(kube_client(server)?, ns, &ar))
}

/// ApplicationSets in `ns` of a test server.
pub fn appsets(server: &KubeTestServer, ns: &str) -> Result<Api<DynamicObject>, HarnessError> {
    let ar = resource("argoproj.io", "ApplicationSet", "applicationsets");
    Ok(Api::namespaced_with(kube_client(server)?, ns, &ar))
}

/// A key of an Argo CD cluster Secret (`name`, `server`, ...): from `data` (base64, as the
/// API server stores it) or, before that, `stringData`; empty when absent.
pub fn cluster_secret_field(secret: &Value, key: &str) -> String {
    use base64::Engine as _;
    secret["data"][key]
        .as_str()
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .or_else(|| secret["stringData"][key].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// ConfigMaps in `ns` of a test server.
pub fn configmaps(server: &KubeTestServer, ns: &str) -> Result<Api<DynamicObject>, HarnessError> {
    let ar = resource("", "ConfigMap", "configmaps");
    Ok(Api::namespaced_with(kube_client(server)?, ns, &ar))
}

/// Reads an AppProject straight from a test server's store.
pub fn stored_project(server: &KubeTestServer, ns: &str, name: &str) -> Option<Value> {
    server.get_object("argoproj.io", "v1alpha1", "appprojects", Some(ns), name)
}

/// Reads a Secret straight from a test server's store.
pub fn stored_secret(server: &KubeTestServer, ns: &str, name: &str) -> Option<Value> {
    server.get_object("", "v1", "secrets", Some(ns), name)
}

/// Reads a ConfigMap straight from a test server's store.
pub fn stored_configmap(server: &KubeTestServer, ns: &str, name: &str) -> Option<Value> {
    server.get_object("", "v1", "configmaps", Some(ns), name)
}

/// An object from JSON (for `Api::create`).
pub fn object(v: Value) -> DynamicObject {
    serde_json::from_value(v).expect("test object is a valid Kubernetes object")
}

/// A sample Argo CD Application.
pub fn sample_app(name: &str, ns: &str, path: &str) -> DynamicObject {
    let v = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "project": "default",
            "source": {
                "repoURL": "https://github.com/argoproj/argocd-example-apps",
                "path": path,
                "targetRevision": "HEAD"
            },
            "destination": {"server": "https://kubernetes.default.svc", "namespace": name},
            "syncPolicy": {"automated": {"prune": true}}
        }
    });
    serde_json::from_value(v).expect("static sample is a valid object")
}

/// Creates a namespace on a test server.
pub async fn create_namespace(server: &KubeTestServer, ns: &str) -> Result<(), HarnessError> {
    let api: Api<DynamicObject> = Api::all_with(
        kube_client(server)?,
        &ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Namespace".into(),
            plural: "namespaces".into(),
        },
    );
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
    }))?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The working directory of a topology: `dir` (created if missing), or a new temporary
/// directory named with `prefix`, removed when the returned guard is dropped.
pub fn work_dir(
    dir: Option<&Path>,
    prefix: &str,
) -> Result<(PathBuf, Option<tempfile::TempDir>), HarnessError> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            Ok((d.to_path_buf(), None))
        }
        None => {
            let t = tempfile::Builder::new().prefix(prefix).tempdir()?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}

/// `spec.source.targetRevision` of a stored Application.
pub fn target_revision(app: Option<Value>) -> Option<String> {
    app.and_then(|a| {
        a["spec"]["source"]["targetRevision"]
            .as_str()
            .map(str::to_owned)
    })
}

/// Polls `f` until it returns `Some`, or fails after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut f: F,
) -> Result<T, HarnessError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("timed out after {timeout:?} waiting for: {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads an Application straight from a test server's store.
pub fn stored_app(server: &KubeTestServer, ns: &str, name: &str) -> Option<Value> {
    server.get_object("argoproj.io", "v1alpha1", "applications", Some(ns), name)
}

impl Topology {
    /// Starts everything and waits until both agents are connected.
    pub async fn start(opts: TopologyOptions) -> Result<Topology, HarnessError> {
        let (dir, tmp) = work_dir(opts.dir.as_deref(), "argocd-agent-e2e")?;
        let td = TrustDomain::new(TRUST_DOMAIN)?;
        let mut builder = DevWorkloadApi::builder(dir.join("spiffe"), td);
        for (file, id) in &opts.extra_sockets {
            builder = builder.socket(dir.join(file), SpiffeId::parse(id)?);
        }
        let spiffe = builder
            .socket(dir.join("principal.sock"), SpiffeId::parse(PRINCIPAL_ID)?)
            .socket(dir.join("operator.sock"), SpiffeId::parse(OPERATOR_ID)?)
            .socket(
                dir.join("managed.sock"),
                SpiffeId::parse(&agent_id(MANAGED))?,
            )
            .socket(
                dir.join("autonomous.sock"),
                SpiffeId::parse(&agent_id(AUTONOMOUS))?,
            )
            .serve()
            .await?;

        let kube_opts = || ServerOptions::default();
        let spoke_opts = || {
            let mut o = ServerOptions::default();
            o.resources.extend(opts.spoke_resources.iter().cloned());
            o
        };
        let hub = KubeTestServer::start_on("127.0.0.1:0".parse()?, kube_opts()).await?;
        let managed_spoke = KubeTestServer::start_on("127.0.0.1:0".parse()?, spoke_opts()).await?;
        let autonomous_spoke =
            KubeTestServer::start_on("127.0.0.1:0".parse()?, spoke_opts()).await?;
        hub.write_kubeconfig(&dir.join("hub.kubeconfig"), "hub")?;
        managed_spoke.write_kubeconfig(&dir.join("managed.kubeconfig"), "managed")?;
        autonomous_spoke.write_kubeconfig(&dir.join("autonomous.kubeconfig"), "autonomous")?;
        for ns in [MANAGED, AUTONOMOUS, HUB_ARGOCD_NS] {
            create_namespace(&hub, ns).await?;
        }
        create_namespace(&managed_spoke, SPOKE_NS).await?;
        create_namespace(&autonomous_spoke, SPOKE_NS).await?;

        let bin = binary("argocd-agent")?;
        let port = crate::envoy::free_loopback_port()?;
        let mut metrics_ports = std::collections::HashMap::new();
        metrics_ports.insert("principal".to_string(), crate::envoy::free_loopback_port()?);
        let principal_addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let mut pargs = principal_args(
            port,
            &dir.join("hub.kubeconfig"),
            metrics_ports["principal"],
            &spiffe.endpoint(&dir.join("principal.sock")),
        );
        match &opts.rules_file {
            Some(f) => pargs.extend(["--identity-rules".into(), f.display().to_string()]),
            None => pargs.extend(["--identity-rule".into(), RULE.into()]),
        }
        // The operator API on a Unix socket in the topology's directory (no TCP port that a
        // parallel test could take between choosing and binding it), unless the test chose.
        let admin_address = match opts
            .principal_args
            .iter()
            .position(|a| a == "--admin-address")
        {
            Some(i) => opts.principal_args.get(i + 1).cloned().unwrap_or_default(),
            None => {
                let a = format!("unix://{}", dir.join("admin.sock").display());
                pargs.extend(["--admin-address".into(), a.clone()]);
                a
            }
        };
        // The Redis proxy is on by default (as upstream's) on :6379; tests that want it
        // choose a port.
        if !opts
            .principal_args
            .iter()
            .any(|a| a == "--redis-proxy-address")
        {
            pargs.push("--disable-redis-proxy".into());
        }
        pargs.extend(opts.principal_args.iter().cloned());
        let with_envs = |p: Proc| opts.envs.iter().fold(p, |p, (k, v)| p.env(k, v));
        let mut principal = with_envs(Proc::new(
            "principal",
            bin.clone(),
            pargs,
            dir.join("principal.log"),
        ));
        for (k, v) in &opts.principal_envs {
            principal = principal.env(k, v);
        }
        principal.start()?;
        wait_port(principal_addr).await?;
        if opts.agents.as_ref().is_some_and(Vec::is_empty) {
            // The test dials the principal itself: not before it takes agents (a principal
            // closes connections before TLS until it is ready). Agents of the topology
            // retry; a test that needs the principal unready starts agents or waits itself.
            let port = metrics_ports["principal"];
            let _ = eventually(
                "the principal ready",
                Duration::from_secs(30),
                || async move { (http_status(port, "/readyz").await == Some(200)).then_some(()) },
            )
            .await;
        }

        let proxy = if opts.with_proxy {
            Some(TcpProxy::start(principal_addr).await?)
        } else {
            None
        };
        let target = proxy.as_ref().map(|p| p.addr).unwrap_or(principal_addr);
        let which = opts
            .agents
            .clone()
            .unwrap_or_else(|| vec![MANAGED, AUTONOMOUS]);
        for agent in [MANAGED, AUTONOMOUS] {
            metrics_ports.insert(agent.to_string(), crate::envoy::free_loopback_port()?);
        }
        let start_agent =
            |agent: &str, mode: &str, sock: &str, kubeconfig: &str| -> Result<Proc, HarnessError> {
                let args: Vec<String> = vec![
                    "agent".into(),
                    "--agent-mode".into(),
                    mode.into(),
                    "--server-address".into(),
                    "127.0.0.1".into(),
                    "--server-port".into(),
                    target.port().to_string(),
                    "--principal-spiffe-id".into(),
                    PRINCIPAL_ID.into(),
                    "--spiffe-endpoint-socket".into(),
                    spiffe.endpoint(&dir.join(sock)),
                    "--kubeconfig".into(),
                    dir.join(kubeconfig).display().to_string(),
                    "--namespace".into(),
                    SPOKE_NS.into(),
                    "--metrics-host".into(),
                    "127.0.0.1".into(),
                    "--metrics-port".into(),
                    metrics_ports[agent].to_string(),
                    "--keep-alive-ping-interval".into(),
                    "5s".into(),
                    "--creds".into(),
                    opts.agent_creds.clone().unwrap_or_else(|| "spiffe".into()),
                ];
                let own = opts
                    .per_agent_args
                    .iter()
                    .filter(|(name, _)| *name == agent)
                    .flat_map(|(_, a)| a.iter().cloned());
                let args = args
                    .into_iter()
                    .chain(opts.agent_args.iter().cloned())
                    .chain(own)
                    .collect();
                let mut p = with_envs(Proc::new(
                    agent,
                    bin.clone(),
                    args,
                    dir.join(format!("{agent}.log")),
                ));
                p.start()?;
                Ok(p)
            };
        let managed = if which.contains(&MANAGED) {
            Some(start_agent(
                MANAGED,
                "managed",
                "managed.sock",
                "managed.kubeconfig",
            )?)
        } else {
            None
        };
        let autonomous = if which.contains(&AUTONOMOUS) {
            Some(start_agent(
                AUTONOMOUS,
                opts.second_agent_mode.unwrap_or("autonomous"),
                "autonomous.sock",
                "autonomous.kubeconfig",
            )?)
        } else {
            None
        };
        let topo = Topology {
            dir,
            _tmp: tmp,
            spiffe,
            hub,
            managed_spoke,
            autonomous_spoke,
            principal,
            managed,
            autonomous,
            principal_addr,
            proxy,
            metrics_ports,
            admin_address,
        };
        for agent in which {
            if let Err(e) = topo.wait_connected(agent, Duration::from_secs(30)).await {
                let logs = topo.logs();
                topo.stop().await;
                return Err(format!("{e}\n{logs}").into());
            }
        }
        Ok(topo)
    }

    /// Waits up to `timeout` until the principal's log shows `agent` connected (at any time
    /// so far).
    pub async fn wait_connected(&self, agent: &str, timeout: Duration) -> Result<(), HarnessError> {
        let needle = format!("agent={agent}");
        eventually(&format!("{agent} connected"), timeout, || {
            let log = self.principal.log();
            let n = log
                .lines()
                .filter(|l| l.contains("agent connected") && l.contains(&needle))
                .count();
            async move { (n > 0).then_some(()) }
        })
        .await
        .map_err(|e| {
            format!(
                "{e}\n--- principal log ---\n{}",
                tail(&self.principal.log(), 40)
            )
            .into()
        })
    }

    /// A ready X.509-SVID source on one of the topology's Workload API sockets
    /// (`managed.sock`, `autonomous.sock`, `operator.sock`, ...), to act as that workload.
    pub async fn svid_source(
        &self,
        socket: &str,
    ) -> Result<argocd_agent_identity::source::SvidSource, HarnessError> {
        let source = argocd_agent_identity::source::SvidSource::workload_api(Some(
            self.spiffe.endpoint(&self.dir.join(socket)),
        ))
        .await?;
        source.wait_ready(Duration::from_secs(30)).await?;
        Ok(source)
    }

    /// Number of times `agent` has connected so far (from the principal's log).
    pub fn connect_count(&self, agent: &str) -> usize {
        let needle = format!("agent={agent}");
        self.principal
            .log()
            .lines()
            .filter(|l| l.contains("agent connected") && l.contains(&needle))
            .count()
    }

    /// All process logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = format!("--- principal ---\n{}\n", tail(&self.principal.log(), 60));
        for p in [&self.managed, &self.autonomous].into_iter().flatten() {
            out.push_str(&format!("--- {} ---\n{}\n", p.name, tail(&p.log(), 60)));
        }
        out
    }

    /// Stops every process; with `r` an error, then panics with it and every log.
    pub async fn finish(self, r: Result<(), HarnessError>) {
        // A scenario that passed also leaves only objects Argo CD's own schemas accept.
        let r = match r {
            Ok(()) => self.check_argocd_schemas().await,
            failed => failed,
        };
        let logs = self.logs();
        self.stop().await;
        if let Err(e) = r {
            panic!("{e}\n{logs}");
        }
    }

    /// Every Application, AppProject and ApplicationSet on the hub and both spokes
    /// validates against Argo CD's CRD schemas, checked by a validator we did not write
    /// ([`crate::argocd_schema`]).
    pub async fn check_argocd_schemas(&self) -> Result<(), HarnessError> {
        let mut objects = Vec::new();
        for server in [&self.hub, &self.managed_spoke, &self.autonomous_spoke] {
            objects.extend(crate::argocd_schema::argocd_objects(server).await?);
        }
        let invalid = crate::argocd_schema::validate(&objects).await?;
        if invalid.is_empty() {
            return Ok(());
        }
        Err(format!("objects left that Argo CD's schemas refuse: {invalid:?}").into())
    }

    /// Stops every process.
    pub async fn stop(mut self) {
        for p in [&mut self.managed, &mut self.autonomous]
            .into_iter()
            .flatten()
        {
            p.stop().await;
        }
        self.principal.stop().await;
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits (up to 30 s) until `addr` accepts TCP connections.
pub async fn wait_port(addr: std::net::SocketAddr) -> Result<(), HarnessError> {
    eventually(
        &format!("{addr} accepting connections"),
        Duration::from_secs(30),
        || async move { TcpStream::connect(addr).await.ok().map(|_| ()) },
    )
    .await
}

/// Merge-patches an object through the Kubernetes API (what `kubectl patch --type merge` does).
pub async fn merge_patch(
    api: &Api<DynamicObject>,
    name: &str,
    patch: Value,
) -> Result<(), HarnessError> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// `.status.sync.revision` of a stored Application, if any.
pub fn sync_revision(app: Option<serde_json::Value>) -> Option<String> {
    app?.pointer("/status/sync/revision")?
        .as_str()
        .map(str::to_owned)
}

/// Writes `.status` through the status subresource (what Argo CD's controller does).
pub async fn set_status(
    api: &Api<DynamicObject>,
    name: &str,
    status: Value,
) -> Result<(), HarnessError> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": status })),
    )
    .await?;
    Ok(())
}

/// Body of `GET path` on 127.0.0.1:`port`.
pub async fn http_get(port: u16, path: &str) -> Result<String, HarnessError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    Ok(raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}

/// HTTP status code of `GET path` on 127.0.0.1:`port` (`None`: no answer).
pub async fn http_status(port: u16, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    out.split_whitespace().nth(1)?.parse().ok()
}

/// Sum of the samples of `name` (any labels) in a Prometheus text exposition.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = if let Some(r) = rest.strip_prefix('{') {
            r.rsplit_once("} ").map(|(_, v)| v)
        } else {
            rest.strip_prefix(' ')
        };
        if let Some(v) = value.and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// A spawned task (a stand-in controller, say) aborted when this guard is dropped, so it
/// stops with the scenario that started it.
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
