//! `argocd-agent-dev demo`: the whole topology on this machine. A development Workload API
//! server, Kubernetes API test servers for the hub and two spokes, the principal, a managed
//! and an autonomous agent (real `argocd-agent` processes), sample Applications, AppProjects
//! and a repository Secret, and a live table of where each Application is, what state it
//! reports, and which projects and repositories each cluster holds. The two agents belong
//! to two tenants (team-a: managed, team-b: autonomous) and the managed spoke runs a spoke
//! guard; the demo shows one refusal of each (docs/tenancy.md, docs/spoke-guard.md).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use argocd_agent_kube_test_server::KubeTestServer;
use argocd_agent_testkit::harness::{
    self, AUTONOMOUS, HUB_ARGOCD_NS, MANAGED, SPOKE_NS, Topology, TopologyOptions,
};
use kube::api::PostParams;
use serde_json::{Value, json};

/// The hub project the managed sample Application uses.
const TEAM_PROJECT: &str = "team-a";
/// The repository Secret of [`TEAM_PROJECT`] (fake credentials).
const TEAM_REPO: &str = "team-a-repo";
/// The project created locally on the autonomous spoke; on the hub it is
/// `agent-autonomous-edge`.
const EDGE_PROJECT: &str = "edge";
const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";
/// Tenant team-b's operator (the autonomous agent's tenant).
const OPS_B: &str = "spiffe://example.org/ns/team-b/sa/ops";
/// The hub Application from a repository the managed spoke's guard does not allow.
const INTRUDER: &str = "intruder";
/// Its repository.
const FOREIGN_REPO: &str = "https://github.com/attacker/payload";
/// What the managed spoke's guard allows (the samples' repositories).
const GUARD_REPOS: &str = "https://github.com/argoproj/*,https://git.example.invalid/team-a/*";

/// The mapping rules with the demo's two tenants: team-a holds the managed agent, its hub
/// namespace, project team-a and repository team-a-repo; team-b the autonomous agent and
/// its namespace, with an operator of its own.
fn rules_yaml() -> String {
    format!(
        r#"rules:
  - name: operators
    template: "spiffe://example.org/ns/platform/sa/{{who}}"
    role: admin
  - name: agents
    template: "spiffe://{{trust_domain}}/ns/agents/sa/{{sa}}"
    agent: "{{sa}}"
    namespace: "{{sa}}"
    trustDomains: [example.org]
    mode: both
tenants:
  - name: team-a
    agents: ["{managed}"]
    namespaces: ["{MANAGED}"]
    projects: ["{TEAM_PROJECT}"]
    repositories: ["{TEAM_REPO}"]
  - name: team-b
    agents: ["{autonomous}"]
    namespaces: ["{AUTONOMOUS}"]
    admins: ["{OPS_B}"]
    quotas:
      applicationsPerAgent: 50
"#,
        managed = harness::agent_id(MANAGED),
        autonomous = harness::agent_id(AUTONOMOUS),
    )
}

/// The refusals the demo shows: the guard's condition on the hub copy of [`INTRUDER`], and
/// team-b's operator asking about team-a's agent.
async fn cross_tenant_refusal(topo: &Topology) -> Result<String, harness::HarnessError> {
    let endpoint = topo.spiffe.endpoint(&topo.dir.join("ops-b.sock"));
    let out = tokio::process::Command::new(harness::binary("argocd-agentctl")?)
        .args(["agent", "inspect", MANAGED])
        .args(["--principal-address", &topo.principal_addr.to_string()])
        .args(["--spiffe-endpoint-socket", &endpoint])
        .args(["--principal-spiffe-id", harness::PRINCIPAL_ID])
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_owned();
    if out.status.success() || !line.contains("outside the caller's scope (tenant team-b)") {
        return Err(format!(
            "team-b's operator should be refused agent inspect {MANAGED}: {stderr}"
        )
        .into());
    }
    Ok(line)
}

/// The guard's condition on the hub copy of [`INTRUDER`], once the managed agent refused it.
fn guard_refusal(topo: &Topology) -> Option<String> {
    let app = harness::stored_app(&topo.hub, MANAGED, INTRUDER)?;
    app.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "InvalidSpecError")
        .and_then(|c| c["message"].as_str())
        .map(str::to_owned)
}

/// What the live table shows under it: one refusal of each kind.
fn refusals(topo: &Topology, cross: &str) -> String {
    let guard = guard_refusal(topo).unwrap_or_else(|| "(waiting for the managed agent)".into());
    format!(
        "Refused:
  guard (managed spoke): hub Application {MANAGED}/{INTRUDER} from {FOREIGN_REPO}: {guard}
  tenant (team-b's operator): argocd-agentctl agent inspect {MANAGED}: {cross}
"
    )
}

/// Arguments of `argocd-agent-dev demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Directory for kubeconfigs, sockets, the dev CA and logs.
    #[arg(long, default_value = ".demo")]
    dir: PathBuf,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    exit_after: Option<u64>,
    /// Verify that the sample Applications, projects and repository flow where they should,
    /// then exit (0 on success).
    #[arg(long)]
    check: bool,
}

fn row(server: &KubeTestServer, ns: &str) -> Vec<[String; 6]> {
    let mut rows: Vec<[String; 6]> = server
        .list_objects("argoproj.io", "v1alpha1", "applications", Some(ns))
        .iter()
        .map(|a| {
            let s = |p: &str| {
                a.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_owned()
            };
            [
                ns.to_owned(),
                s("/metadata/name"),
                s("/spec/project"),
                s("/spec/source/targetRevision"),
                s("/status/sync/status"),
                s("/status/health/status"),
            ]
        })
        .collect();
    rows.sort();
    rows
}

fn table(topo: &Topology) -> String {
    let mut out = String::new();
    let sections: [(&str, &KubeTestServer, &str); 4] = [
        ("hub", &topo.hub, MANAGED),
        ("hub", &topo.hub, AUTONOMOUS),
        ("spoke agent-managed", &topo.managed_spoke, SPOKE_NS),
        ("spoke agent-autonomous", &topo.autonomous_spoke, SPOKE_NS),
    ];
    out.push_str(&format!(
        "{:<24} {:<18} {:<16} {:<22} {:<10} {:<10} {:<10}\n",
        "CLUSTER", "NAMESPACE", "NAME", "PROJECT", "REVISION", "SYNC", "HEALTH"
    ));
    for (cluster, server, ns) in sections {
        for [ns, name, project, rev, sync, health] in row(server, ns) {
            out.push_str(&format!(
                "{cluster:<24} {ns:<18} {name:<16} {project:<22} {rev:<10} {sync:<10} {health:<10}\n"
            ));
        }
    }
    out.push('\n');
    let clusters: [(&str, &KubeTestServer, &str); 3] = [
        ("hub", &topo.hub, HUB_ARGOCD_NS),
        ("spoke agent-managed", &topo.managed_spoke, SPOKE_NS),
        ("spoke agent-autonomous", &topo.autonomous_spoke, SPOKE_NS),
    ];
    out.push_str(&format!(
        "sessions (Leases on the hub): {}\n",
        join(session_leases(&topo.hub))
    ));
    for (cluster, server, ns) in clusters {
        out.push_str(&format!(
            "projects on {cluster} ({ns}): {}\n",
            join(project_names(server, ns))
        ));
        out.push_str(&format!(
            "repositories on {cluster} ({ns}): {}\n",
            join(repository_names(server, ns))
        ));
    }
    out
}

/// `agent -> replica (moves)` for every agent Lease on the hub.
fn session_leases(hub: &KubeTestServer) -> Vec<String> {
    let mut out: Vec<String> = hub
        .list_objects("coordination.k8s.io", "v1", "leases", Some(HUB_ARGOCD_NS))
        .into_iter()
        .filter(|l| l["metadata"]["labels"][argocd_agent_principal::ha::LEASE_LABEL] == "agent")
        .map(|l| {
            let agent = l["metadata"]["labels"][argocd_agent_principal::ha::AGENT_LABEL]
                .as_str()
                .unwrap_or("?")
                .to_owned();
            let holder = l["spec"]["holderIdentity"].as_str().unwrap_or("");
            let replica = if holder.is_empty() {
                "nobody".to_owned()
            } else {
                argocd_agent_principal::ha::replica_of(holder).to_owned()
            };
            let moves = l["spec"]["leaseTransitions"].as_i64().unwrap_or(0);
            format!("{agent} -> {replica} ({moves} moves)")
        })
        .collect();
    out.sort();
    out
}

fn join(names: Vec<String>) -> String {
    if names.is_empty() {
        "-".into()
    } else {
        names.join(", ")
    }
}

fn names(objects: impl Iterator<Item = Value>) -> Vec<String> {
    let mut names: Vec<String> = objects
        .filter_map(|o| {
            o.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// AppProjects in `ns`, by name.
fn project_names(server: &KubeTestServer, ns: &str) -> Vec<String> {
    names(
        server
            .list_objects("argoproj.io", "v1alpha1", "appprojects", Some(ns))
            .into_iter(),
    )
}

/// Repository and repo-creds Secrets in `ns`, by name (never their data).
fn repository_names(server: &KubeTestServer, ns: &str) -> Vec<String> {
    names(
        server
            .list_objects("", "v1", "secrets", Some(ns))
            .into_iter()
            .filter(|s| {
                matches!(
                    s.pointer("/metadata/labels")
                        .and_then(|l| l.get(SECRET_TYPE_LABEL))
                        .and_then(Value::as_str),
                    Some("repository" | "repo-creds")
                )
            }),
    )
}

/// The project of the managed sample: it goes to `agent-managed` (destination name and
/// source namespace match), and only there.
fn team_project() -> kube::api::DynamicObject {
    harness::object(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": TEAM_PROJECT, "namespace": HUB_ARGOCD_NS},
        "spec": {
            "description": "team A's applications on agent-managed",
            "sourceNamespaces": [MANAGED],
            "sourceRepos": ["*"],
            "destinations": [{"name": MANAGED, "namespace": "*", "server": "*"}]
        }
    }))
}

/// Argo CD's built-in project, as an Argo CD install has it on the hub; it goes to every
/// managed agent.
fn default_project() -> kube::api::DynamicObject {
    harness::object(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "default", "namespace": HUB_ARGOCD_NS},
        "spec": {
            "sourceRepos": ["*"],
            "destinations": [{"namespace": "*", "server": "*"}],
            "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]
        }
    }))
}

/// A private repository of [`TEAM_PROJECT`]. The credentials are fake: the URL is under the
/// reserved `.invalid` domain and nothing ever clones it.
fn team_repository() -> kube::api::DynamicObject {
    harness::object(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": TEAM_REPO, "namespace": HUB_ARGOCD_NS,
                     "labels": {SECRET_TYPE_LABEL: "repository"}},
        "type": "Opaque",
        "stringData": {
            "type": "git",
            "project": TEAM_PROJECT,
            "url": "https://git.example.invalid/team-a/apps.git",
            "username": "demo",
            "password": "fake-demo-token-not-a-secret"
        }
    }))
}

/// A project created locally on the autonomous spoke.
fn edge_project() -> kube::api::DynamicObject {
    harness::object(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": EDGE_PROJECT, "namespace": SPOKE_NS},
        "spec": {
            "description": "edge applications, defined on the autonomous spoke",
            "sourceRepos": ["*"],
            "destinations": [{"name": "in-cluster", "namespace": "*",
                              "server": "https://kubernetes.default.svc"}]
        }
    }))
}

fn with_project(mut app: kube::api::DynamicObject, project: &str) -> kube::api::DynamicObject {
    app.data["spec"]["project"] = json!(project);
    app
}

fn kubectl() -> String {
    let venv = PathBuf::from(".venv/bin/kubectl");
    if venv.exists() {
        venv.display().to_string()
    } else {
        "kubectl".into()
    }
}

async fn check(topo: &Topology) -> Result<(), harness::HarnessError> {
    let t = Duration::from_secs(60);
    harness::eventually(
        "the managed spoke's guard refuses the foreign repository: condition on the hub copy, nothing on the spoke",
        t,
        || async {
            guard_refusal(topo)
                .filter(|m| m.contains(FOREIGN_REPO))
                .filter(|_| harness::stored_app(&topo.managed_spoke, SPOKE_NS, INTRUDER).is_none())
        },
    )
    .await?;
    cross_tenant_refusal(topo).await?;
    harness::eventually(
        "each agent's session is recorded in a Lease held by principal-0",
        t,
        || async {
            let leases = session_leases(&topo.hub);
            (leases.len() == 2 && leases.iter().all(|l| l.contains("-> principal-0"))).then_some(())
        },
    )
    .await?;
    check_refresh(topo, t).await?;
    check_app_of_apps(topo, t).await?;
    let managed_label = "argocd-agent.argoproj-labs.io/managed-by-principal";
    harness::eventually(
        "hub application reaches the managed spoke (project team-a) and reports Healthy",
        t,
        || async {
            harness::stored_app(&topo.hub, MANAGED, "guestbook")
                .filter(|a| a.pointer("/status/health/status") == Some(&Value::from("Healthy")))
                .and(harness::stored_app(
                    &topo.managed_spoke,
                    SPOKE_NS,
                    "guestbook",
                ))
                .filter(|a| a["spec"]["project"] == TEAM_PROJECT)
        },
    )
    .await?;
    harness::eventually(
        "projects default and team-a reach the managed spoke, team-a pointed at in-cluster",
        t,
        || async {
            harness::stored_project(&topo.managed_spoke, SPOKE_NS, "default")?;
            harness::stored_project(&topo.managed_spoke, SPOKE_NS, TEAM_PROJECT).filter(|p| {
                p["metadata"]["labels"][managed_label] == "true"
                    && p["spec"]["destinations"]
                        == json!([{"name": "in-cluster", "namespace": "*",
                                   "server": "https://kubernetes.default.svc"}])
                    && p["spec"].get("sourceNamespaces").is_none()
            })
        },
    )
    .await?;
    harness::eventually(
        "repository team-a-repo reaches the managed spoke",
        t,
        || async {
            harness::stored_secret(&topo.managed_spoke, SPOKE_NS, TEAM_REPO)
                .filter(|s| s["metadata"]["labels"][managed_label] == "true")
        },
    )
    .await?;
    let hub_edge = format!("{AUTONOMOUS}-{EDGE_PROJECT}");
    harness::eventually(
        "autonomous spoke application reaches the hub (project agent-autonomous-edge) and reports Healthy",
        t,
        || async {
            harness::stored_app(&topo.hub, AUTONOMOUS, "edge-guestbook")
                .filter(|a| a.pointer("/status/health/status") == Some(&Value::from("Healthy")))
                .filter(|a| a["spec"]["project"] == hub_edge.as_str())
        },
    )
    .await?;
    harness::eventually(
        "autonomous spoke's project lands on the hub as agent-autonomous-edge",
        t,
        || async {
            harness::stored_project(&topo.hub, HUB_ARGOCD_NS, &hub_edge).filter(|p| {
                p["metadata"]["labels"]["argocd-agent.argoproj-labs.io/agent-name"] == AUTONOMOUS
                    && p["spec"]["sourceNamespaces"] == json!([AUTONOMOUS])
            })
        },
    )
    .await?;
    let spoke_app = harness::stored_app(&topo.autonomous_spoke, SPOKE_NS, "edge-guestbook")
        .ok_or("edge-guestbook disappeared from the autonomous spoke")?;
    if spoke_app["spec"]["project"] != EDGE_PROJECT {
        return Err(format!(
            "edge-guestbook on the autonomous spoke should keep project {EDGE_PROJECT}, has {}",
            spoke_app["spec"]["project"]
        )
        .into());
    }
    // Nothing goes to autonomous agents; credentials stay out of the logs.
    let auto = &topo.autonomous_spoke;
    if harness::stored_secret(auto, SPOKE_NS, TEAM_REPO).is_some()
        || harness::stored_project(auto, SPOKE_NS, TEAM_PROJECT).is_some()
    {
        return Err("a hub project or repository reached the autonomous spoke".into());
    }
    let mut logs = topo.principal.log();
    if let Some(p) = &topo.managed {
        logs.push_str(&p.log());
    }
    if logs.contains("fake-demo-token-not-a-secret") {
        return Err("the repository password appears in a log".into());
    }
    Ok(())
}

/// App-of-apps on the managed spoke: the parent `apps`, authored on the hub, renders one
/// child Application (`apps-child`) from the managed spoke's repository stand-in; the spoke's
/// Argo CD (the stand-in) creates it there and the agent publishes it to the hub, read-only.
async fn seed_app_of_apps(topo: &Topology) -> Result<(), harness::HarnessError> {
    let child = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": APP_OF_APPS_CHILD},
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://github.com/argoproj/argocd-example-apps",
                       "path": "kustomize-guestbook", "targetRevision": "HEAD"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "kustomize-guestbook"}
        }
    });
    harness::configmaps(&topo.managed_spoke, SPOKE_NS)?
        .create(
            &PostParams::default(),
            &harness::object(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": argocd_agent_testkit::app_of_apps::REPO_CONFIGMAP, "namespace": SPOKE_NS},
                "data": {"apps": serde_json::to_string(&[child])?}
            })),
        )
        .await?;
    let mut parent = serde_json::to_value(with_project(
        harness::sample_app("apps", MANAGED, "apps"),
        TEAM_PROJECT,
    ))?;
    parent["spec"]["destination"]["namespace"] = json!(SPOKE_NS);
    harness::apps(&topo.hub, MANAGED)?
        .create(&PostParams::default(), &harness::object(parent))
        .await?;
    Ok(())
}

/// The child Application the demo's app-of-apps parent creates on the managed spoke.
const APP_OF_APPS_CHILD: &str = "apps-child";

/// The app-of-apps child reaches the hub, read-only (agent label, parent annotation), with
/// the status the spoke's Argo CD gave it.
async fn check_app_of_apps(topo: &Topology, t: Duration) -> Result<(), harness::HarnessError> {
    harness::eventually(
        "the app-of-apps child created on the managed spoke appears on the hub, Healthy",
        t,
        || async {
            harness::stored_app(&topo.hub, MANAGED, APP_OF_APPS_CHILD).filter(|a| {
                a["metadata"]["annotations"]["argocd-agent.argoproj-labs.io/parent-application"]
                    == "apps"
                    && a.pointer("/status/health/status") == Some(&Value::from("Healthy"))
            })
        },
    )
    .await?;
    println!(
        "app-of-apps: parent apps (hub) -> managed spoke's Argo CD creates {APP_OF_APPS_CHILD} -> {APP_OF_APPS_CHILD} on the hub, read-only, Healthy"
    );
    Ok(())
}

/// The hub UI's Hard refresh on the managed Application: the request goes down, the spoke's
/// Argo CD (the stand-in) reconciles and removes it, and it ends on the hub.
async fn check_refresh(topo: &Topology, t: Duration) -> Result<(), harness::HarnessError> {
    const REFRESH: &str = "argocd.argoproj.io/refresh";
    let hub = harness::apps(&topo.hub, MANAGED)?;
    let before = harness::stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
        .map(|a| a["status"]["reconciledAt"].clone());
    // reconciledAt has a resolution of one second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    harness::merge_patch(
        &hub,
        "guestbook",
        json!({"metadata": {"annotations": {REFRESH: "hard"}}}),
    )
    .await?;
    harness::eventually(
        "a hard refresh on the hub is carried out by the managed spoke's Argo CD",
        t,
        || async {
            harness::stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook").filter(|a| {
                a["metadata"]["annotations"][REFRESH].is_null()
                    && Some(a["status"]["reconciledAt"].clone()) != before
            })
        },
    )
    .await?;
    harness::eventually("the refresh request ends on the hub", t, || async {
        harness::stored_app(&topo.hub, MANAGED, "guestbook")
            .filter(|a| a["metadata"]["annotations"][REFRESH].is_null())
    })
    .await?;
    println!(
        "refresh round trip: hub hard refresh -> managed spoke reconciled -> request cleared on the hub"
    );
    Ok(())
}

/// The demo hub Redis's password (Argo CD's argocd-redis Secret plays this part).
const DEMO_REDIS_PASSWORD: &str = "demo-hub-redis-password";

/// Real Redis servers (hub and one per spoke) behind the principal's Redis proxy, when
/// `redis-server` is on PATH; the demo runs without them otherwise.
struct DemoRedis {
    proxy_port: u16,
    hub: argocd_agent_testkit::redis::RedisServer,
    managed: argocd_agent_testkit::redis::RedisServer,
    autonomous: argocd_agent_testkit::redis::RedisServer,
}

impl DemoRedis {
    async fn start(
        dir: &std::path::Path,
    ) -> Result<Option<DemoRedis>, Box<dyn std::error::Error + Send + Sync>> {
        use argocd_agent_testkit::redis::{RedisServer, redis_server_bin};
        if redis_server_bin().is_err() {
            eprintln!("redis-server is not on PATH: the demo runs without the Redis proxy");
            return Ok(None);
        }
        let start = |name: &'static str| RedisServer::start(dir, name);
        Ok(Some(DemoRedis {
            proxy_port: argocd_agent_testkit::envoy::free_loopback_port()?,
            // Password-protected, as Argo CD runs its Redis (the argocd-redis Secret).
            hub: RedisServer::start_with_password(dir, "redis-hub", DEMO_REDIS_PASSWORD)
                .await
                .map_err(|e| e.to_string())?,
            managed: start("redis-managed").await.map_err(|e| e.to_string())?,
            autonomous: start("redis-autonomous").await.map_err(|e| e.to_string())?,
        }))
    }

    fn configure(&self, options: &mut TopologyOptions) {
        options.principal_args.extend([
            "--redis-proxy-address".into(),
            format!("127.0.0.1:{}", self.proxy_port),
            "--redis-server-address".into(),
            self.hub.addr(),
            "--redis-password".into(),
            DEMO_REDIS_PASSWORD.into(),
        ]);
        options.per_agent_args = vec![
            (MANAGED, vec!["--redis-addr".into(), self.managed.addr()]),
            (
                AUTONOMOUS,
                vec!["--redis-addr".into(), self.autonomous.addr()],
            ),
        ];
    }

    /// Through the proxy, as argocd-server: with the hub Redis's password the managed
    /// spoke's resource tree; without it `NOAUTH` and nothing of the spoke.
    async fn check(&self) -> Result<(), ProxyCheckError> {
        use argocd_agent_redis::RedisEndpoint;
        let key: &[u8] = b"app|resources-tree|agent-managed_guestbook";
        let proxy = |password: Option<&str>| RedisEndpoint {
            addr: format!("127.0.0.1:{}", self.proxy_port),
            password: password.map(str::to_owned),
            ..Default::default()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let got = async {
                let mut conn = proxy(Some(DEMO_REDIS_PASSWORD)).connect(1 << 20).await?;
                let reply = conn.command(&[b"GET", key]).await?;
                Ok::<_, ProxyCheckError>(reply.into_value()?)
            }
            .await;
            match got {
                Ok(Some(v)) if v.starts_with(b"{\"nodes\"") => break,
                other if std::time::Instant::now() > deadline => {
                    // As `{:?}` of the outcome, its error by its message.
                    let seen = match other {
                        Ok(v) => format!("Ok({v:?})"),
                        Err(e) => format!("Err({:?})", e.to_string()),
                    };
                    return Err(ProxyCheckError::NoTree(seen));
                }
                _ => tokio::time::sleep(std::time::Duration::from_millis(300)).await,
            }
        }
        let mut conn = proxy(None).connect(1 << 20).await?;
        let reply = conn.command(&[b"GET", key]).await?;
        match reply.into_value() {
            Err(e) if e.to_string().starts_with("NOAUTH") => Ok(()),
            other => Err(ProxyCheckError::Unguarded(format!("{other:?}"))),
        }
    }

    /// What the managed spoke's Argo CD would have written for guestbook.
    async fn seed(&self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut conn = argocd_agent_redis::RedisEndpoint {
            addr: self.managed.addr(),
            ..Default::default()
        }
        .connect(1 << 20)
        .await?;
        conn.command(&[
            b"SET",
            b"app|resources-tree|guestbook",
            br#"{"nodes":[{"kind":"Deployment","name":"guestbook-ui"}]}"#,
        ])
        .await?;
        Ok(())
    }
}

/// Where the resource proxy listens, and the spoke workloads it shows.
struct DemoProxy {
    port: u16,
}

/// The namespace of the sample workloads on the spokes.
const WORKLOAD_NS: &str = "guestbook";

impl DemoProxy {
    fn configure(&self, options: &mut TopologyOptions) {
        options.principal_args.extend([
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{}", self.port),
            "--enable-self-cluster-registration".into(),
        ]);
    }

    /// What Argo CD would have deployed for `app` on `spoke`: a ConfigMap and a Pod with
    /// Argo CD's tracking label, the Pod writing a log line every 2 s.
    async fn seed(spoke: &KubeTestServer, app: &str) -> Result<(), harness::HarnessError> {
        harness::create_namespace(spoke, WORKLOAD_NS).await?;
        let client = harness::kube_client(spoke)?;
        let core = |kind: &str, plural: &str| {
            kube::Api::<kube::api::DynamicObject>::namespaced_with(
                client.clone(),
                WORKLOAD_NS,
                &kube::api::ApiResource {
                    group: String::new(),
                    version: "v1".into(),
                    api_version: "v1".into(),
                    kind: kind.into(),
                    plural: plural.into(),
                },
            )
        };
        let labels = json!({"app.kubernetes.io/instance": app});
        let pp = PostParams::default();
        core("ConfigMap", "configmaps")
            .create(
                &pp,
                &harness::object(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("{app}-config"), "labels": labels},
                    "data": {"greeting": "hello from the spoke"}})),
            )
            .await?;
        core("Pod", "pods")
            .create(
                &pp,
                &harness::object(json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("{app}-ui"), "labels": labels,
                        "annotations": {"kube-test-server.argocd-agent.io/log-every": "2s"}},
                    "spec": {"containers": [{"name": "ui", "image": "gcr.io/google-samples/gb-frontend:v5"}]}})),
            )
            .await?;
        Ok(())
    }

    /// Writes `<dir>/<agent>.proxy.kubeconfig` from the agent's cluster secret (once the
    /// principal has created it).
    async fn kubeconfig(dir: &std::path::Path, agent: &str) -> Result<PathBuf, ProxyCheckError> {
        let path = dir.join(format!("{agent}.proxy.kubeconfig"));
        let args = argocd_agent_cli::ctl::agent::KubeconfigArgs {
            name: agent.into(),
            hub: argocd_agent_cli::ctl::HubArgs {
                namespace: HUB_ARGOCD_NS.into(),
                kubeconfig: Some(dir.join("hub.kubeconfig")),
                kube_context: None,
            },
            file: Some(path.clone()),
            from_principal: false,
            admin: Default::default(),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match argocd_agent_cli::ctl::agent::kubeconfig(&args).await {
                Ok(text) => {
                    std::fs::write(&path, text)?;
                    return Ok(path);
                }
                Err(e) if tokio::time::Instant::now() > deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

/// kubectl through the resource proxy, as argocd-server reaches the spokes.
async fn check_proxy(kubeconfig: &std::path::Path, app: &str) -> Result<(), ProxyCheckError> {
    let k = kubectl();
    let run = |args: Vec<String>| {
        let k = k.clone();
        async move {
            let out = tokio::process::Command::new(&k)
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args(["-n", WORKLOAD_NS])
                .args(&args)
                .output()
                .await
                .map_err(|cause| ProxyCheckError::Spawn {
                    kubectl: k.clone(),
                    cause,
                })?;
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).to_string())
            } else {
                Err(ProxyCheckError::Kubectl {
                    args: args.join(" "),
                    stderr: String::from_utf8_lossy(&out.stderr).to_string(),
                })
            }
        }
    };
    let pods = run(vec![
        "get".into(),
        "pods".into(),
        "-o".into(),
        "name".into(),
    ])
    .await?;
    if !pods.contains(&format!("pod/{app}-ui")) {
        return Err(ProxyCheckError::Listed(pods));
    }
    let pwd = run(vec![
        "exec".into(),
        format!("{app}-ui"),
        "--".into(),
        "pwd".into(),
    ])
    .await?;
    if pwd.trim() != "/" {
        return Err(ProxyCheckError::Pwd(pwd));
    }
    Ok(())
}

/// Why the demo's check of the resource or Redis proxy failed. Messages carry their cause
/// (no `source`), except the wrapped errors, which are their cause's.
#[derive(Debug, thiserror::Error)]
pub enum ProxyCheckError {
    /// A connection or command through the Redis proxy failed.
    #[error(transparent)]
    Redis(#[from] argocd_agent_redis::RespError),
    /// The Redis proxy answered with no value.
    #[error(transparent)]
    Reply(#[from] argocd_agent_redis::resp::ReplyError),
    /// The resource tree never came through with the password (the last outcome, as `{:?}`).
    #[error("the resource tree with the password: {0}")]
    NoTree(String),
    /// Without the password the Redis proxy answered something else than `NOAUTH`.
    #[error("without the password the proxy answered {0}")]
    Unguarded(String),
    /// The agent's resource-proxy kubeconfig cannot be had.
    #[error(transparent)]
    Kubeconfig(#[from] argocd_agent_cli::ctl::error::KubeconfigError),
    /// The kubeconfig cannot be written.
    #[error(transparent)]
    Write(#[from] std::io::Error),
    /// kubectl does not start.
    #[error("running {kubectl}: {cause}")]
    Spawn {
        /// The kubectl binary.
        kubectl: String,
        /// Why.
        cause: std::io::Error,
    },
    /// kubectl failed.
    #[error("kubectl {args}: {stderr}")]
    Kubectl {
        /// Its arguments.
        args: String,
        /// What it wrote to standard error.
        stderr: String,
    },
    /// The proxy's pod list lacks the app's Pod.
    #[error("the proxy listed {0:?}")]
    Listed(String),
    /// `exec pwd` answered something else than `/`.
    #[error("exec pwd answered {0:?}")]
    Pwd(String),
}

/// Runs the demo.
pub async fn run(args: DemoArgs) -> crate::CmdResult {
    std::fs::create_dir_all(&args.dir)?;
    let dir = std::fs::canonicalize(&args.dir)?;
    eprintln!("starting the local topology in {} ...", dir.display());
    let redis = DemoRedis::start(&dir).await?;
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, rules_yaml())?;
    let mut options = TopologyOptions {
        dir: Some(dir.clone()),
        rules_file: Some(rules),
        extra_sockets: vec![("ops-b.sock".into(), OPS_B.into())],
        ..Default::default()
    };
    if let Some(r) = &redis {
        r.configure(&mut options);
    }
    // The managed spoke's guard: Applications, projects and repositories from the samples'
    // repositories only (docs/spoke-guard.md).
    let guard = vec!["--guard-allowed-repos".to_owned(), GUARD_REPOS.to_owned()];
    match options
        .per_agent_args
        .iter_mut()
        .find(|(a, _)| *a == MANAGED)
    {
        Some((_, args)) => args.extend(guard),
        None => options.per_agent_args.push((MANAGED, guard)),
    }
    // Periodic resync (docs/reliability.md): both agents ask for a round every minute
    // while connected; the principal takes one per agent every 30 s at most.
    for agent in [MANAGED, AUTONOMOUS] {
        let every = ["--resync-interval".to_owned(), "60s".to_owned()];
        match options.per_agent_args.iter_mut().find(|(a, _)| *a == agent) {
            Some((_, args)) => args.extend(every),
            None => options.per_agent_args.push((agent, every.to_vec())),
        }
    }
    options
        .principal_args
        .extend(["--resync-min-interval".into(), "30s".into()]);
    let proxy = DemoProxy {
        port: argocd_agent_testkit::envoy::free_loopback_port()?,
    };
    proxy.configure(&mut options);
    // The principal runs as a replica (docs/ha.md): each session holds a Lease on the hub.
    options
        .principal_args
        .extend(["--ha".into(), "--replica-id".into(), "principal-0".into()]);
    let topo = Topology::start(options).await?;
    if let Some(r) = &redis {
        r.seed().await?;
    }
    DemoProxy::seed(&topo.managed_spoke, "guestbook").await?;
    DemoProxy::seed(&topo.autonomous_spoke, "edge-guestbook").await?;
    let managed_kc = DemoProxy::kubeconfig(&dir, MANAGED).await?;
    let autonomous_kc = DemoProxy::kubeconfig(&dir, AUTONOMOUS).await?;

    // Simulated Argo CD controllers on the spokes (they only write status).
    let managed_sim = spawn_sim(harness::apps(&topo.managed_spoke, SPOKE_NS)?);
    let autonomous_sim = spawn_sim(harness::apps(&topo.autonomous_spoke, SPOKE_NS)?);

    // Samples. On the hub, in Argo CD's namespace: the default project, project team-a for
    // the managed agent and a (fake) private repository of team-a; in the managed agent's
    // namespace: guestbook, in project team-a. On the autonomous spoke: project edge and
    // edge-guestbook in it.
    let pp = PostParams::default();
    let hub_projects = harness::projects(&topo.hub, HUB_ARGOCD_NS)?;
    hub_projects.create(&pp, &default_project()).await?;
    hub_projects.create(&pp, &team_project()).await?;
    harness::secrets(&topo.hub, HUB_ARGOCD_NS)?
        .create(&pp, &team_repository())
        .await?;
    harness::apps(&topo.hub, MANAGED)?
        .create(
            &pp,
            &with_project(
                harness::sample_app("guestbook", MANAGED, "guestbook"),
                TEAM_PROJECT,
            ),
        )
        .await?;
    seed_app_of_apps(&topo).await?;
    // A hub Application from a repository the managed spoke's guard does not allow.
    let mut intruder = harness::sample_app(INTRUDER, MANAGED, "payload");
    intruder.data["spec"]["source"]["repoURL"] = json!(FOREIGN_REPO);
    harness::apps(&topo.hub, MANAGED)?
        .create(&pp, &intruder)
        .await?;
    harness::projects(&topo.autonomous_spoke, SPOKE_NS)?
        .create(&pp, &edge_project())
        .await?;
    harness::apps(&topo.autonomous_spoke, SPOKE_NS)?
        .create(
            &pp,
            &with_project(
                harness::sample_app("edge-guestbook", SPOKE_NS, "helm-guestbook"),
                EDGE_PROJECT,
            ),
        )
        .await?;

    if args.check {
        let mut r = check(&topo).await;
        if r.is_ok()
            && std::process::Command::new(kubectl())
                .arg("version")
                .arg("--client")
                .output()
                .is_ok()
        {
            r = async {
                check_proxy(&managed_kc, "guestbook").await?;
                check_proxy(&autonomous_kc, "edge-guestbook").await
            }
            .await
            .map_err(|e| format!("resource proxy: {e}").into());
        }
        if r.is_ok()
            && let Some(redis) = &redis
        {
            r = redis
                .check()
                .await
                .map_err(|e| format!("Redis proxy: {e}").into());
        }
        println!("{}", table(&topo));
        if r.is_ok() {
            let cross = cross_tenant_refusal(&topo).await.unwrap_or_default();
            println!("{}", refusals(&topo, &cross));
        }
        managed_sim.abort();
        autonomous_sim.abort();
        let logs = topo.logs();
        topo.stop().await;
        return match r {
            Ok(()) => {
                println!(
                    "demo check passed: Applications flow hub -> managed spoke and autonomous spoke -> hub, status flows back; project team-a and repository team-a-repo reached the managed spoke; project edge is agent-autonomous-edge on the hub; kubectl reaches both spokes through the resource proxy; the Redis proxy serves the spoke's resource tree only with the hub Redis's password; the managed spoke's guard refused a foreign repository and team-b's operator was refused team-a's agent"
                );
                Ok(())
            }
            Err(e) => Err(format!("demo check failed: {e}\n{logs}").into()),
        };
    }

    let k = kubectl();
    let help = format!(
        "Try (in another terminal):\n  {k} --kubeconfig {d}/hub.kubeconfig -n {MANAGED} edit application guestbook\n  {k} --kubeconfig {d}/hub.kubeconfig -n {MANAGED} apply -f my-app.yaml\n  {k} --kubeconfig {d}/managed.kubeconfig -n {SPOKE_NS} get applications -w\n  {k} --kubeconfig {d}/hub.kubeconfig -n {MANAGED} get application {APP_OF_APPS_CHILD} -o yaml   # created on the spoke by the app-of-apps parent apps; read-only on the hub\n  {k} --kubeconfig {d}/hub.kubeconfig -n {MANAGED} annotate application guestbook argocd.argoproj.io/refresh=hard   # the hub UI's Hard refresh: watch it reach the spoke and end on both sides\n  {k} --kubeconfig {d}/autonomous.kubeconfig -n {SPOKE_NS} delete application edge-guestbook\n  {k} --kubeconfig {d}/managed.kubeconfig -n {SPOKE_NS} get appprojects,secrets   # team-a, team-a-repo from the hub\n  {k} --kubeconfig {d}/managed.kubeconfig -n {SPOKE_NS} delete secret {TEAM_REPO}   # comes back\n  {k} --kubeconfig {d}/hub.kubeconfig -n {HUB_ARGOCD_NS} get appprojects   # {AUTONOMOUS}-{EDGE_PROJECT} from the autonomous spoke\n  argocd-agentctl agent list --principal-admin-address {admin}   # agents as the principal sees them\nLogs: {d}/principal.log, {d}/{MANAGED}.log, {d}/{AUTONOMOUS}.log. Ctrl-C stops everything.\n",
        d = dir.display(),
        admin = topo.admin_address
    );
    let help = match &redis {
        Some(r) => format!(
            "{help}Redis proxy (argocd-server's view of the spokes' Redis; the hub Redis wants a password, as Argo CD's does):\n  redis-cli -p {p} --no-auth-warning -a {pw} GET 'app|resources-tree|{MANAGED}_guestbook'   # the managed spoke's value, through the principal\n  redis-cli -p {p} GET 'app|resources-tree|{MANAGED}_guestbook'   # without the password: NOAUTH, nothing of the spoke\n  redis-cli -p {p} --no-auth-warning -a {pw} SUBSCRIBE 'app|managed-resources|{MANAGED}_guestbook'   # then: redis-cli -p {m} PUBLISH 'app|managed-resources|guestbook' x\n",
            p = r.proxy_port,
            m = r.managed.port,
            pw = DEMO_REDIS_PASSWORD
        ),
        None => help,
    };
    let help = format!(
        "{help}Resource proxy (kubectl as argocd-server reaches the spokes; kubeconfigs from each agent's cluster secret):\n  {k} --kubeconfig {m} -n {WORKLOAD_NS} get pods,configmaps\n  {k} --kubeconfig {m} -n {WORKLOAD_NS} logs -f guestbook-ui\n  {k} --kubeconfig {m} -n {WORKLOAD_NS} exec -it guestbook-ui -- sh   # try: pwd, ls /etc, cat /etc/motd, exit\n  {k} --kubeconfig {a} -n {WORKLOAD_NS} get configmap edge-guestbook-config -o yaml\n  argocd-agentctl agent kubeconfig {MANAGED} --kubeconfig {d}/hub.kubeconfig   # how those kubeconfigs are made\n",
        m = managed_kc.display(),
        a = autonomous_kc.display(),
        d = dir.display(),
    );
    let cross = match cross_tenant_refusal(&topo).await {
        Ok(line) => line,
        Err(e) => format!("(not refused: {e})"),
    };
    let tty = std::io::stdout().is_terminal();
    let deadline = args
        .exit_after
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => {
                if tty {
                    print!("\x1b[2J\x1b[H");
                }
                println!("{}\n{}\n{help}", table(&topo), refusals(&topo, &cross));
                if deadline.is_some_and(|d| tokio::time::Instant::now() > d) {
                    break;
                }
            }
        }
    }
    eprintln!("stopping ...");
    managed_sim.abort();
    autonomous_sim.abort();
    topo.stop().await;
    Ok(())
}

fn spawn_sim(api: kube::Api<kube::api::DynamicObject>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = argocd_agent_testkit::fake_argocd::run(api, Duration::from_secs(1)).await {
            tracing::warn!(error = %e, "simulated Argo CD stopped");
        }
    })
}
