//! A topology of principal replicas: one hub Kubernetes API test server, N principal
//! replicas (`--ha`) with their own listeners, a real Envoy spreading agents across them
//! (L4 `tcp_proxy`, round robin: what a Kubernetes Service does, with SVID mTLS end to end
//! between agent and replica), and M agents, each with its own spoke and SPIFFE ID.
//!
//! ```text
//! agent-ha-0..M --mTLS--> Envoy (tcp_proxy, round robin) --> principal-0..N --> hub API
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::workload_api::{DevWorkloadApi, DevWorkloadApiHandle};
use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_kube_test_server::{KubeTestServer, ServerOptions};
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;

use crate::envoy::{envoy_bin, free_loopback_port, tail, wait_listening};
use crate::harness::{
    HUB_ARGOCD_NS, HarnessError, PRINCIPAL_ID, Proc, RULE, SPOKE_NS, TRUST_DOMAIN, agent_id,
    binary, create_namespace, kube_client, principal_args,
};

/// Options of an HA topology.
#[derive(Debug, Clone)]
pub struct HaOptions {
    /// Number of principal replicas (`principal-0` ..).
    pub replicas: usize,
    /// Agents by name with their mode (`managed` or `autonomous`).
    pub agents: Vec<(String, &'static str)>,
    /// Extra arguments for every replica (after `--ha --replica-id principal-<i>`).
    pub principal_args: Vec<String>,
    /// Extra arguments of replica `i` (`per_replica_args[i]`, after `principal_args`);
    /// missing entries add nothing.
    pub per_replica_args: Vec<Vec<String>>,
    /// Extra arguments of an agent, by name (after the harness's own).
    pub per_agent_args: BTreeMap<String, Vec<String>>,
    /// Where logs, sockets and kubeconfigs go (default: a temporary directory).
    pub dir: Option<PathBuf>,
}

impl Replica {
    /// Whether the replica process runs (not killed).
    pub fn proc_running(&self) -> bool {
        self.killed_at.is_empty() || self.proc.pid().is_some()
    }
}

/// One replica process and its ports.
pub struct Replica {
    /// `principal-<i>`, also its `--replica-id`.
    pub name: String,
    /// The replica's process.
    pub proc: Proc,
    /// Its gRPC listener on 127.0.0.1 (an Envoy upstream); kept across restarts.
    pub addr: SocketAddr,
    /// Port of its `/metrics`, `/healthz` and `/readyz` on 127.0.0.1; new on each restart.
    pub metrics_port: u16,
    /// When it was killed (`kill -9`): its sessions ended then (it logged nothing).
    pub killed_at: Vec<SystemTime>,
}

/// The running HA topology.
pub struct HaTopology {
    /// Working directory: Workload API sockets, kubeconfigs, Envoy's config and logs.
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    /// The development Workload API server (`principal.sock`, `<agent>.sock`).
    pub spiffe: DevWorkloadApiHandle,
    /// The hub's API server, shared by every replica.
    pub hub: KubeTestServer,
    /// Each agent's spoke API server, by agent name.
    pub spokes: BTreeMap<String, KubeTestServer>,
    /// Each agent's mode (`managed` or `autonomous`), by agent name.
    pub modes: BTreeMap<String, &'static str>,
    /// The principal replicas, in index order.
    pub replicas: Vec<Replica>,
    /// The Envoy process balancing agents across the replicas.
    pub envoy: Proc,
    /// Envoy's listener on 127.0.0.1: what every agent dials.
    pub envoy_addr: SocketAddr,
    /// The agent processes, in the order of [`HaOptions::agents`].
    pub agents: Vec<Proc>,
}

/// Envoy as an L4 load balancer: round robin over the replicas; a refused connection is
/// retried on the next one (a dead replica costs a reconnect, not an outage).
pub fn envoy_tcp_config(listen: SocketAddr, upstreams: &[SocketAddr]) -> String {
    let endpoints: String = upstreams
        .iter()
        .map(|u| {
            format!(
                "        - endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}\n",
                u.ip(),
                u.port()
            )
        })
        .collect();
    format!(
        r#"static_resources:
  listeners:
  - name: agents
    address: {{socket_address: {{address: {ip}, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: principals
          cluster: principals
          max_connect_attempts: 5
  clusters:
  - name: principals
    type: STATIC
    connect_timeout: 1s
    lb_policy: ROUND_ROBIN
    load_assignment:
      cluster_name: principals
      endpoints:
      - lb_endpoints:
{endpoints}"#,
        ip = listen.ip(),
        port = listen.port(),
    )
}

impl HaTopology {
    /// Starts the hub, the replicas, Envoy and the agents; does not wait for the agents to
    /// connect. On failure, stops what was started and returns the error with every log.
    pub async fn start(opts: HaOptions) -> Result<HaTopology, HarnessError> {
        let envoy_program = envoy_bin()?;
        let (dir, tmp) = crate::harness::work_dir(opts.dir.as_deref(), "argocd-agent-e2e-ha")?;
        let td = TrustDomain::new(TRUST_DOMAIN)?;
        let mut builder = DevWorkloadApi::builder(dir.join("spiffe"), td)
            .socket(dir.join("principal.sock"), SpiffeId::parse(PRINCIPAL_ID)?);
        for (agent, _) in &opts.agents {
            builder = builder.socket(
                dir.join(format!("{agent}.sock")),
                SpiffeId::parse(&agent_id(agent))?,
            );
        }
        let spiffe = builder.serve().await?;
        let hub =
            KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
        hub.write_kubeconfig(&dir.join("hub.kubeconfig"), "hub")?;
        create_namespace(&hub, HUB_ARGOCD_NS).await?;
        let mut spokes = BTreeMap::new();
        let mut modes = BTreeMap::new();
        for (agent, mode) in &opts.agents {
            create_namespace(&hub, agent).await?;
            let spoke =
                KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
            spoke.write_kubeconfig(&dir.join(format!("{agent}.kubeconfig")), agent)?;
            create_namespace(&spoke, SPOKE_NS).await?;
            spokes.insert(agent.clone(), spoke);
            modes.insert(agent.clone(), *mode);
        }

        let bin = binary("argocd-agent")?;
        let mut replicas = Vec::new();
        for i in 0..opts.replicas {
            let port = free_loopback_port()?;
            let metrics_port = free_loopback_port()?;
            let name = format!("principal-{i}");
            let mut args = principal_args(
                port,
                &dir.join("hub.kubeconfig"),
                metrics_port,
                &spiffe.endpoint(&dir.join("principal.sock")),
            );
            let extra: Vec<String> = opts
                .principal_args
                .iter()
                .chain(opts.per_replica_args.get(i).into_iter().flatten())
                .cloned()
                .collect();
            // The Redis proxy only when the test gives it an address.
            if !extra.iter().any(|a| a == "--redis-proxy-address") {
                args.push("--disable-redis-proxy".into());
            }
            args.extend([
                "--identity-rule".into(),
                RULE.into(),
                "--admin-address".into(),
                "off".into(),
                "--ha".into(),
                "--replica-id".into(),
                name.clone(),
            ]);
            args.extend(extra);
            let mut proc = Proc::new(&name, bin.clone(), args, dir.join(format!("{name}.log")));
            proc.start()?;
            replicas.push(Replica {
                name,
                proc,
                addr: format!("127.0.0.1:{port}").parse()?,
                metrics_port,
                killed_at: vec![],
            });
        }
        let envoy_addr: SocketAddr = format!("127.0.0.1:{}", free_loopback_port()?).parse()?;
        let config = dir.join("envoy.yaml");
        let upstreams: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
        std::fs::write(&config, envoy_tcp_config(envoy_addr, &upstreams))?;
        let envoy = Proc::new(
            "envoy",
            envoy_program,
            vec![
                "-c".into(),
                config.display().to_string(),
                "--base-id".into(),
                crate::envoy::next_base_id().to_string(),
                "--disable-hot-restart".into(),
                "--concurrency".into(),
                "1".into(),
                "-l".into(),
                "warn".into(),
            ],
            dir.join("envoy.log"),
        );
        let mut topo = HaTopology {
            dir,
            _tmp: tmp,
            spiffe,
            hub,
            spokes,
            modes,
            replicas,
            envoy,
            envoy_addr,
            agents: vec![],
        };
        match topo
            .start_rest(&bin, &opts.agents, &opts.per_agent_args)
            .await
        {
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
        bin: &std::path::Path,
        agents: &[(String, &'static str)],
        per_agent_args: &BTreeMap<String, Vec<String>>,
    ) -> Result<(), HarnessError> {
        for r in &self.replicas {
            wait_listening(r.addr, Duration::from_secs(30)).await?;
        }
        self.envoy.start()?;
        wait_listening(self.envoy_addr, Duration::from_secs(30)).await?;
        for (agent, mode) in agents {
            let mut args: Vec<String> = vec![
                "agent".into(),
                "--agent-mode".into(),
                (*mode).into(),
                "--creds".into(),
                "spiffe".into(),
                "--server-address".into(),
                "127.0.0.1".into(),
                "--server-port".into(),
                self.envoy_addr.port().to_string(),
                "--principal-spiffe-id".into(),
                PRINCIPAL_ID.into(),
                "--spiffe-endpoint-socket".into(),
                self.spiffe
                    .endpoint(&self.dir.join(format!("{agent}.sock"))),
                "--kubeconfig".into(),
                self.dir
                    .join(format!("{agent}.kubeconfig"))
                    .display()
                    .to_string(),
                "--namespace".into(),
                SPOKE_NS.into(),
                "--metrics-port".into(),
                "0".into(),
                "--keep-alive-ping-interval".into(),
                "5s".into(),
            ];
            args.extend(per_agent_args.get(agent).into_iter().flatten().cloned());
            let mut p = Proc::new(
                agent,
                bin.to_path_buf(),
                args,
                self.dir.join(format!("{agent}.log")),
            );
            p.start()?;
            self.agents.push(p);
        }
        Ok(())
    }

    /// The replica name serving each agent, from the agent Leases on the hub.
    pub async fn holders(&self) -> Result<BTreeMap<String, String>, HarnessError> {
        let client = kube_client(&self.hub)?;
        let api: Api<DynamicObject> = Api::namespaced_with(
            client,
            HUB_ARGOCD_NS,
            &ApiResource {
                group: "coordination.k8s.io".into(),
                version: "v1".into(),
                api_version: "coordination.k8s.io/v1".into(),
                kind: "Lease".into(),
                plural: "leases".into(),
            },
        );
        let mut out = BTreeMap::new();
        for lease in api.list(&Default::default()).await?.items {
            let labels = lease.metadata.labels.clone().unwrap_or_default();
            if labels
                .get("argocd-agent.argoproj-labs.io/lease")
                .map(String::as_str)
                != Some("agent")
            {
                continue;
            }
            let (Some(agent), Some(holder)) = (
                labels.get("argocd-agent.argoproj-labs.io/agent-name"),
                lease.data["spec"]["holderIdentity"].as_str(),
            ) else {
                continue;
            };
            let replica = holder.rsplit_once('_').map_or(holder, |(r, _)| r);
            out.insert(agent.clone(), replica.to_string());
        }
        Ok(out)
    }

    /// Which agents each replica serves now, from the replicas' logs (live sessions).
    pub fn served(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for s in self.sessions() {
            if s.end.is_none() {
                out.entry(s.replica).or_default().push(s.agent);
            }
        }
        out
    }

    /// Every session every replica logged: agent, replica, start, end (`None`: live).
    /// A killed replica's open sessions end when it was killed.
    pub fn sessions(&self) -> Vec<Session> {
        let mut all = Vec::new();
        for r in &self.replicas {
            let mut events: Vec<(SystemTime, String, i32)> = Vec::new();
            for line in r.proc.log().lines() {
                let delta = if line.contains("session: agent connected") {
                    1
                } else if line.contains("session: agent disconnected") {
                    -1
                } else {
                    continue;
                };
                let Some(at) = line
                    .split_whitespace()
                    .next()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                else {
                    continue;
                };
                let Some(agent) = field(line, "agent=") else {
                    continue;
                };
                events.push((SystemTime::from(at), agent, delta));
            }
            for k in &r.killed_at {
                events.push((*k, String::new(), 0)); // ends every live session
            }
            events.sort_by_key(|e| e.0);
            let mut live: HashMap<String, (usize, SystemTime)> = HashMap::new();
            for (at, agent, delta) in events {
                if delta == 0 {
                    for (agent, (_, start)) in live.drain() {
                        all.push(Session {
                            agent,
                            replica: r.name.clone(),
                            start,
                            end: Some(at),
                        });
                    }
                    continue;
                }
                let entry = live.entry(agent.clone()).or_insert((0, at));
                if delta > 0 {
                    entry.0 += 1;
                } else {
                    entry.0 = entry.0.saturating_sub(1);
                    if entry.0 == 0 {
                        let start = entry.1;
                        live.remove(&agent);
                        all.push(Session {
                            agent,
                            replica: r.name.clone(),
                            start,
                            end: Some(at),
                        });
                    }
                }
            }
            for (agent, (_, start)) in live {
                all.push(Session {
                    agent,
                    replica: r.name.clone(),
                    start,
                    end: None,
                });
            }
        }
        all.sort_by_key(|s| s.start);
        all
    }

    /// Pairs of sessions of one agent on two replicas that were live at the same time.
    pub fn overlapping_sessions(&self) -> Vec<(Session, Session)> {
        let sessions = self.sessions();
        let mut out = Vec::new();
        for (i, a) in sessions.iter().enumerate() {
            for b in &sessions[i + 1..] {
                if a.agent != b.agent || a.replica == b.replica {
                    continue;
                }
                let a_end = a
                    .end
                    .unwrap_or(SystemTime::UNIX_EPOCH + Duration::from_secs(u32::MAX as u64));
                let b_end = b
                    .end
                    .unwrap_or(SystemTime::UNIX_EPOCH + Duration::from_secs(u32::MAX as u64));
                if a.start < b_end && b.start < a_end {
                    out.push((a.clone(), b.clone()));
                }
            }
        }
        out
    }

    /// SIGTERM to replica `i` (a step of a rolling update); waits for it to exit (SIGKILL
    /// after 5 s).
    pub async fn stop_replica(&mut self, i: usize) {
        self.replicas[i].proc.stop().await;
    }

    /// `kill -9` replica `i`.
    pub async fn kill_replica(&mut self, i: usize) {
        self.replicas[i].proc.kill().await;
        self.replicas[i].killed_at.push(SystemTime::now());
    }

    /// Starts replica `i` again (same name, a new incarnation).
    /// Its gRPC port stays (Envoy routes to it); its metrics port is a new one. Either port
    /// may have been taken meanwhile as the local port of some outgoing connection (it is in
    /// the ephemeral range): a replica that exits at once is started again.
    pub async fn restart_replica(&mut self, i: usize) -> Result<(), HarnessError> {
        let r = &mut self.replicas[i];
        r.metrics_port = free_loopback_port()?;
        r.proc
            .set_arg("--metrics-port", &r.metrics_port.to_string());
        for _ in 0..10 {
            r.proc.start()?;
            let listening = tokio::time::timeout(Duration::from_secs(15), async {
                loop {
                    if tokio::net::TcpStream::connect(r.addr).await.is_ok() {
                        return true;
                    }
                    if !r.proc.is_running() {
                        return false;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await;
            match listening {
                Ok(true) => return Ok(()),
                Ok(false) => tokio::time::sleep(Duration::from_millis(500)).await,
                Err(_) => break,
            }
        }
        Err(format!(
            "replica {} is not accepting connections on {}",
            r.name, r.addr
        )
        .into())
    }

    /// Every process's log tail, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for r in &self.replicas {
            out.push_str(&format!(
                "--- {} ---\n{}\n",
                r.name,
                tail(&r.proc.log(), 50)
            ));
        }
        for p in &self.agents {
            out.push_str(&format!("--- {} ---\n{}\n", p.name, tail(&p.log(), 15)));
        }
        out.push_str(&format!("--- envoy ---\n{}\n", tail(&self.envoy.log(), 10)));
        out
    }

    /// Stops every process: the agents, then Envoy, then the replicas.
    pub async fn stop(mut self) {
        for p in &mut self.agents {
            p.stop().await;
        }
        self.envoy.stop().await;
        for r in &mut self.replicas {
            r.proc.stop().await;
        }
    }
}

/// One session of one agent on one replica.
#[derive(Debug, Clone)]
pub struct Session {
    /// The agent's name.
    pub agent: String,
    /// The replica's name.
    pub replica: String,
    /// When the replica logged the agent connected.
    pub start: SystemTime,
    /// When it logged it disconnected, or was killed; `None` while live.
    pub end: Option<SystemTime>,
}

/// The value of `key` (e.g. `agent=`) in a log line, up to a space, `}` or `,`.
fn field(line: &str, key: &str) -> Option<String> {
    let at = line.find(key)? + key.len();
    let rest = &line[at..];
    let end = rest.find([' ', '}', ',']).unwrap_or(rest.len());
    let v = rest[..end].trim_matches('"');
    (!v.is_empty()).then(|| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_reads_span_values() {
        let line = "2026-11-23T18:00:00.123456Z  INFO session{agent=agent-ha-0 client=spiffe://x rule=0}: argocd_agent_principal::session: agent connected mode=managed";
        assert_eq!(field(line, "agent=").as_deref(), Some("agent-ha-0"));
        assert_eq!(field("x agent=\"a\"}", "agent=").as_deref(), Some("a"));
        assert_eq!(field("nothing", "agent="), None);
    }

    #[test]
    fn envoy_config_lists_every_replica() {
        let c = envoy_tcp_config(
            "127.0.0.1:1".parse().unwrap(),
            &[
                "127.0.0.1:2".parse().unwrap(),
                "127.0.0.1:3".parse().unwrap(),
            ],
        );
        assert!(c.contains("port_value: 2") && c.contains("port_value: 3"));
        assert!(c.contains("ROUND_ROBIN") && c.contains("tcp_proxy"));
    }
}
