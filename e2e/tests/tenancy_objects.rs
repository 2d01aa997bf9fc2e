//! Tenants on one hub, end to end with the real binaries: two tenants declared in the
//! mapping rules file, each with a managed and an autonomous agent (four agents, four
//! spokes). A tenant's AppProject whose destinations match every agent, its repository,
//! repo-creds and GPG key reach its own managed agent only; the platform's reach both;
//! an autonomous agent's published project reaches nobody; cluster Secrets carry the
//! tenant label; a live rules reload that gives a project to the other tenant deletes it
//! from the agent that lost it; the per-agent and per-tenant Application quotas refuse an
//! agent's new Application and hold back a hub-authored one (condition on the hub, nothing
//! on the spoke) until the count drops, while the other tenant keeps syncing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_kube_test_server::{KubeTestServer, ServerOptions};
use argocd_agent_testkit::harness::*;
use argocd_agent_testkit::workload_api::{DevWorkloadApi, DevWorkloadApiHandle};
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);
const A_MANAGED: &str = "a-managed";
const A_AUTO: &str = "a-auto";
const B_MANAGED: &str = "b-managed";
const B_AUTO: &str = "b-auto";
const AGENTS: [(&str, &str, &str); 4] = [
    (A_MANAGED, "team-a", "managed"),
    (A_AUTO, "team-a", "autonomous"),
    (B_MANAGED, "team-b", "managed"),
    (B_AUTO, "team-b", "autonomous"),
];
const TENANT_LABEL: &str = "argocd-agent.argoproj-labs.io/tenant";

/// The rules file: one rule for every agent (hub namespace = agent name), and two tenants.
/// `b_projects_extra` is added to tenant B's project claims (the reload test).
fn rules(b_projects_extra: &str) -> String {
    format!(
        r#"rules:
  - name: teams
    template: "spiffe://example.org/ns/{{team}}/sa/{{sa}}"
    agent: "{{sa}}"
    namespace: "{{sa}}"
    mode: both
tenants:
  - name: team-a
    agents: ["spiffe://example.org/ns/team-a/sa/{{sa}}"]
    namespaces: ["a-*"]
    projects: ["a-*"]
    repositories: ["a-*"]
    repoCreds: ["a-*"]
    gpgKeys: ["AAAA*"]
    quotas:
      applications: 3
      applicationsPerAgent: 2
  - name: team-b
    agents: ["spiffe://example.org/ns/team-b/sa/{{sa}}"]
    namespaces: ["b-*"]
    projects: ["b-*"{b_projects_extra}]
"#
    )
}

fn id(team: &str, agent: &str) -> String {
    format!("spiffe://example.org/ns/{team}/sa/{agent}")
}

/// A principal and four agents, each with its own spoke.
struct Tenancy {
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    _spiffe: DevWorkloadApiHandle,
    hub: KubeTestServer,
    spokes: Vec<(&'static str, KubeTestServer)>,
    principal: Proc,
    agents: Vec<Proc>,
    metrics_port: u16,
}

/// Extra arguments: for the principal, for every agent, and per agent.
#[derive(Default)]
struct Extra {
    principal: Vec<String>,
    agents: Vec<String>,
    per_agent: Vec<(&'static str, Vec<String>)>,
}

impl Tenancy {
    async fn start() -> Result<Tenancy, HarnessError> {
        Tenancy::start_with(Extra::default()).await
    }

    async fn start_with(extra: Extra) -> Result<Tenancy, HarnessError> {
        let (dir, tmp) = work_dir(None, "argocd-agent-tenancy")?;
        let mut builder =
            DevWorkloadApi::builder(dir.join("spiffe"), TrustDomain::new("example.org")?)
                .socket(dir.join("principal.sock"), SpiffeId::parse(PRINCIPAL_ID)?);
        for (agent, team, _) in AGENTS {
            builder = builder.socket(
                dir.join(format!("{agent}.sock")),
                SpiffeId::parse(&id(team, agent))?,
            );
        }
        let spiffe = builder.serve().await?;
        let hub =
            KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
        hub.write_kubeconfig(&dir.join("hub.kubeconfig"), "hub")?;
        for ns in [HUB_ARGOCD_NS, A_MANAGED, A_AUTO, B_MANAGED, B_AUTO] {
            create_namespace(&hub, ns).await?;
        }
        let mut spokes = Vec::new();
        for (agent, _, _) in AGENTS {
            let spoke =
                KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
            spoke.write_kubeconfig(&dir.join(format!("{agent}.kubeconfig")), agent)?;
            create_namespace(&spoke, SPOKE_NS).await?;
            spokes.push((agent, spoke));
        }
        std::fs::write(dir.join("rules.yaml"), rules(""))?;
        let bin = binary("argocd-agent")?;
        let port = argocd_agent_testkit::envoy::free_loopback_port()?;
        let metrics_port = argocd_agent_testkit::envoy::free_loopback_port()?;
        let proxy_port = argocd_agent_testkit::envoy::free_loopback_port()?;
        let mut args = principal_args(
            port,
            &dir.join("hub.kubeconfig"),
            metrics_port,
            &spiffe.endpoint(&dir.join("principal.sock")),
        );
        args.extend([
            "--identity-rules".into(),
            dir.join("rules.yaml").display().to_string(),
            "--admin-address".into(),
            format!("unix://{}", dir.join("admin.sock").display()),
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{proxy_port}"),
            "--enable-self-cluster-registration".into(),
        ]);
        args.extend(extra.principal.iter().cloned());
        // The Redis proxy is on by default on :6379: off unless the test places it.
        if !extra.principal.iter().any(|a| a == "--redis-proxy-address") {
            args.push("--disable-redis-proxy".into());
        }
        let mut principal = Proc::new("principal", bin.clone(), args, dir.join("principal.log"));
        principal.start()?;
        wait_port(format!("127.0.0.1:{port}").parse()?).await?;
        let mut agents = Vec::new();
        for (agent, _, mode) in AGENTS {
            let mut p = Proc::new(
                agent,
                bin.clone(),
                agent_args(&dir, &spiffe, agent, mode, port)?
                    .into_iter()
                    .chain(extra.agents.iter().cloned())
                    .chain(
                        extra
                            .per_agent
                            .iter()
                            .filter(|(a, _)| *a == agent)
                            .flat_map(|(_, args)| args.iter().cloned()),
                    )
                    .collect(),
                dir.join(format!("{agent}.log")),
            );
            p.start()?;
            agents.push(p);
        }
        let t = Tenancy {
            dir,
            _tmp: tmp,
            _spiffe: spiffe,
            hub,
            spokes,
            principal,
            agents,
            metrics_port,
        };
        for (agent, _, _) in AGENTS {
            let needle = format!("agent={agent}");
            eventually(&format!("{agent} connected"), T, || async {
                t.principal
                    .log()
                    .lines()
                    .any(|l| l.contains("agent connected") && l.contains(&needle))
                    .then_some(())
            })
            .await
            .map_err(|e| format!("{e}\n{}", t.logs()))?;
        }
        Ok(t)
    }

    fn spoke(&self, agent: &str) -> &KubeTestServer {
        &self
            .spokes
            .iter()
            .find(|(a, _)| *a == agent)
            .expect("an agent of the topology")
            .1
    }

    fn logs(&self) -> String {
        let mut out = format!("--- principal ---\n{}\n", self.principal.log());
        for a in &self.agents {
            out.push_str(&format!("--- {} ---\n{}\n", a.name, a.log()));
        }
        out
    }

    async fn finish(mut self, r: Result<(), HarnessError>) {
        let logs = self.logs();
        for a in &mut self.agents {
            a.stop().await;
        }
        self.principal.stop().await;
        if let Err(e) = r {
            panic!("{e}\n{logs}");
        }
    }
}

fn agent_args(
    dir: &Path,
    spiffe: &DevWorkloadApiHandle,
    agent: &str,
    mode: &str,
    port: u16,
) -> Result<Vec<String>, HarnessError> {
    Ok(vec![
        "agent".into(),
        "--agent-mode".into(),
        mode.into(),
        "--server-address".into(),
        "127.0.0.1".into(),
        "--server-port".into(),
        port.to_string(),
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
        "--metrics-host".into(),
        "127.0.0.1".into(),
        "--metrics-port".into(),
        argocd_agent_testkit::envoy::free_loopback_port()?.to_string(),
        "--keep-alive-ping-interval".into(),
        "5s".into(),
    ])
}

/// A project whose destinations match every agent.
fn wide_project(name: &str) -> kube::api::DynamicObject {
    object(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name, "namespace": HUB_ARGOCD_NS},
        "spec": {"sourceNamespaces": ["*"], "sourceRepos": ["*"],
                 "destinations": [{"name": "*", "namespace": "*", "server": "*"}]}
    }))
}

fn repo_secret(name: &str, secret_type: &str, project: &str) -> kube::api::DynamicObject {
    object(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": HUB_ARGOCD_NS,
                     "labels": {"argocd.argoproj.io/secret-type": secret_type}},
        "type": "Opaque",
        "stringData": {"project": project, "url": format!("https://git.example/{name}"), "password": "s3cr3t"}
    }))
}

/// Stays quiet for a moment, then checks that `f` still says nothing arrived.
async fn never(what: &str, f: impl Fn() -> bool) -> Result<(), HarnessError> {
    tokio::time::sleep(Duration::from_millis(2000)).await;
    if f() {
        return Err(format!("{what}: it arrived").into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_projects_repositories_creds_and_keys_reach_its_agents_only() {
    let t = Tenancy::start().await.unwrap();
    let r = objects(&t).await;
    t.finish(r).await;
}

async fn objects(t: &Tenancy) -> Result<(), HarnessError> {
    let pp = PostParams::default();
    let hub_projects = projects(&t.hub, HUB_ARGOCD_NS)?;
    let hub_secrets = secrets(&t.hub, HUB_ARGOCD_NS)?;
    let (a, b) = (t.spoke(A_MANAGED), t.spoke(B_MANAGED));

    // Tenant A's project matches every agent by its destinations; so does the platform's.
    hub_projects.create(&pp, &wide_project("a-apps")).await?;
    hub_projects.create(&pp, &wide_project("b-apps")).await?;
    hub_projects.create(&pp, &wide_project("shared")).await?;
    hub_projects.create(&pp, &wide_project("moving")).await?;
    // Secrets of the platform's project: A's repository and repo-creds by name, and the
    // platform's own.
    hub_secrets
        .create(&pp, &repo_secret("a-repo", "repository", "shared"))
        .await?;
    hub_secrets
        .create(&pp, &repo_secret("a-creds", "repo-creds", "shared"))
        .await?;
    hub_secrets
        .create(&pp, &repo_secret("platform-repo", "repository", "shared"))
        .await?;
    configmaps(&t.hub, HUB_ARGOCD_NS)?
        .create(&pp, &object(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "argocd-gpg-keys-cm", "namespace": HUB_ARGOCD_NS},
            "data": {"AAAA18F83AFDEB23": "key of team-a", "CCCC18F83AFDEB23": "key of the platform"}})))
        .await?;

    for (spoke, own, other) in [(a, "a-apps", "b-apps"), (b, "b-apps", "a-apps")] {
        for p in [own, "shared", "moving"] {
            eventually(
                &format!("project {p} on its tenant's or any agent"),
                T,
                || async { stored_project(spoke, SPOKE_NS, p) },
            )
            .await?;
        }
        assert!(
            stored_project(spoke, SPOKE_NS, other).is_none(),
            "{other} leaked"
        );
    }
    eventually(
        "A's repository, repo-creds and the platform's repository on A's spoke",
        T,
        || async {
            ["a-repo", "a-creds", "platform-repo"]
                .iter()
                .all(|s| stored_secret(a, SPOKE_NS, s).is_some())
                .then_some(())
        },
    )
    .await?;
    eventually("the platform's repository on B's spoke", T, || async {
        stored_secret(b, SPOKE_NS, "platform-repo")
    })
    .await?;
    let keys = |spoke| {
        stored_configmap(spoke, SPOKE_NS, "argocd-gpg-keys-cm").map(|c| {
            c["data"]
                .as_object()
                .map(|m| m.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default()
        })
    };
    eventually("both keys on A's spoke", T, || async {
        (keys(a)? == ["AAAA18F83AFDEB23", "CCCC18F83AFDEB23"]).then_some(())
    })
    .await?;
    eventually("only the platform's key on B's spoke", T, || async {
        (keys(b)? == ["CCCC18F83AFDEB23"]).then_some(())
    })
    .await?;

    // An autonomous agent's project is published on the hub and reaches nobody.
    projects(t.spoke(A_AUTO), SPOKE_NS)?
        .create(&pp, &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": "team", "namespace": SPOKE_NS},
            "spec": {"sourceRepos": ["*"], "destinations": [{"name": "*", "namespace": "*", "server": "*"}]}})))
        .await?;
    eventually("a-auto's project on the hub", T, || async {
        stored_project(&t.hub, HUB_ARGOCD_NS, "a-auto-team")
    })
    .await?;
    never("A's objects on B's spoke", || {
        stored_project(b, SPOKE_NS, "a-apps").is_some()
            || stored_project(b, SPOKE_NS, "a-auto-team").is_some()
            || stored_project(a, SPOKE_NS, "a-auto-team").is_some()
            || ["a-repo", "a-creds"]
                .iter()
                .any(|s| stored_secret(b, SPOKE_NS, s).is_some())
    })
    .await?;

    // Cluster Secrets name each agent's tenant.
    let clusters = secrets(&t.hub, HUB_ARGOCD_NS)?;
    for (agent, team, _) in AGENTS {
        eventually(
            &format!("{agent}'s cluster Secret labelled {team}"),
            T,
            || async {
                let list = clusters
                    .list(&ListParams::default().labels(&format!("{TENANT_LABEL}={team}")))
                    .await
                    .ok()?;
                list.items
                    .iter()
                    .any(|s| s.metadata.name.as_deref() == Some(&format!("cluster-{agent}")))
                    .then_some(())
            },
        )
        .await?;
    }

    // A reload gives project `moving` to tenant B: A's copy is deleted, B's stays.
    std::fs::write(t.dir.join("rules.yaml"), rules(", \"moving\""))?;
    eventually(
        "moving deleted from A's spoke after the reload",
        T,
        || async {
            stored_project(a, SPOKE_NS, "moving")
                .is_none()
                .then_some(())
        },
    )
    .await?;
    assert!(
        stored_project(b, SPOKE_NS, "moving").is_some(),
        "B keeps it"
    );
    assert!(
        stored_project(a, SPOKE_NS, "shared").is_some(),
        "the platform's stay"
    );
    Ok(())
}

fn condition_of(app: &Value) -> Option<String> {
    app["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "QuotaExceededError")?["message"]
        .as_str()
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_quotas_refuse_agents_and_hold_back_hub_applications_of_one_tenant_only() {
    let t = Tenancy::start().await.unwrap();
    let r = quotas(&t).await;
    t.finish(r).await;
}

async fn quotas(t: &Tenancy) -> Result<(), HarnessError> {
    let pp = PostParams::default();
    let auto_apps = apps(t.spoke(A_AUTO), SPOKE_NS)?;
    // a-auto writes two Applications (its applicationsPerAgent), then a third: refused.
    for name in ["auto-1", "auto-2"] {
        auto_apps
            .create(&pp, &sample_app(name, SPOKE_NS, "guestbook"))
            .await?;
        eventually(&format!("{name} on the hub"), T, || async {
            stored_app(&t.hub, A_AUTO, name)
        })
        .await?;
    }
    auto_apps
        .create(&pp, &sample_app("auto-3", SPOKE_NS, "guestbook"))
        .await?;
    let refused = format!(
        "argocd_principal_events_refused_total{{agent=\"{A_AUTO}\",reason=\"TenantApplicationsPerAgentQuota\",tenant=\"team-a\"}}"
    );
    eventually("a-auto's third Application refused", T, || async {
        (metric_sum(t.metrics_port, &refused).await >= 1.0).then_some(())
    })
    .await?;
    assert!(stored_app(&t.hub, A_AUTO, "auto-3").is_none());
    assert!(
        t.principal
            .log()
            .lines()
            .any(|l| l.contains("over the tenant's quota refused") && l.contains("auto-3"))
    );

    // Hub-authored: the tenant holds 2, its quota is 3: hub-1 goes, hub-2 is held back.
    let hub_a = apps(&t.hub, A_MANAGED)?;
    hub_a
        .create(&pp, &sample_app("hub-1", A_MANAGED, "guestbook"))
        .await?;
    eventually("hub-1 on A's managed spoke", T, || async {
        stored_app(t.spoke(A_MANAGED), SPOKE_NS, "hub-1")
    })
    .await?;
    hub_a
        .create(&pp, &sample_app("hub-2", A_MANAGED, "guestbook"))
        .await?;
    let message = eventually("hub-2 marked over quota on the hub", T, || async {
        condition_of(&stored_app(&t.hub, A_MANAGED, "hub-2")?)
    })
    .await?;
    assert!(
        message.contains("tenant \"team-a\" quotas.applications is 3"),
        "{message}"
    );

    // Tenant B is not held up: its Application goes at once.
    apps(&t.hub, B_MANAGED)?
        .create(&pp, &sample_app("b-1", B_MANAGED, "guestbook"))
        .await?;
    eventually("b-1 on B's managed spoke", T, || async {
        stored_app(t.spoke(B_MANAGED), SPOKE_NS, "b-1")
    })
    .await?;
    never("hub-2 on A's spoke while over quota", || {
        stored_app(t.spoke(A_MANAGED), SPOKE_NS, "hub-2").is_some()
    })
    .await?;
    let held =
        "argocd_principal_applications_held_back_total{tenant=\"team-a\",quota=\"applications\"}";
    assert!(
        metric_sum(t.metrics_port, held).await >= 1.0,
        "held back counted"
    );
    assert!(
        t.principal
            .log()
            .lines()
            .any(|l| l.contains("held back from the agent") && l.contains("hub-2"))
    );

    // The count drops (a-auto deletes one): hub-2 flows and loses its condition.
    auto_apps.delete("auto-1", &DeleteParams::default()).await?;
    eventually(
        "hub-2 on A's spoke once the tenant holds fewer",
        T,
        || async { stored_app(t.spoke(A_MANAGED), SPOKE_NS, "hub-2") },
    )
    .await?;
    eventually("hub-2's condition removed", T, || async {
        condition_of(&stored_app(&t.hub, A_MANAGED, "hub-2")?)
            .is_none()
            .then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_and_redis_keys_of_a_tenants_namespace_never_reach_another_tenants_agent() {
    use argocd_agent_testkit::redis::{RedisServer, redis_cli, redis_cli_bin};
    redis_cli_bin().unwrap();
    let dir = tempfile::Builder::new()
        .prefix("argocd-agent-tenancy-redis")
        .tempdir()
        .unwrap();
    let hub_redis = RedisServer::start(dir.path(), "redis-hub").await.unwrap();
    let a_redis = RedisServer::start(dir.path(), "redis-a").await.unwrap();
    let b_redis = RedisServer::start(dir.path(), "redis-b").await.unwrap();
    let proxy_port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let mapping = || "--destination-based-mapping".to_string();
    let t = Tenancy::start_with(Extra {
        principal: vec![
            mapping(),
            "--redis-proxy-address".into(),
            format!("127.0.0.1:{proxy_port}"),
            "--redis-server-address".into(),
            hub_redis.addr(),
            "--redis-proxy-request-timeout".into(),
            "5s".into(),
        ],
        // The spoke copies live in the hub namespace's name (created on the spoke).
        agents: vec![
            mapping(),
            "--allowed-namespaces".into(),
            "*-managed".into(),
            "--create-namespace".into(),
        ],
        per_agent: vec![
            (A_MANAGED, vec!["--redis-addr".into(), a_redis.addr()]),
            (B_MANAGED, vec!["--redis-addr".into(), b_redis.addr()]),
        ],
    })
    .await
    .unwrap();
    let r = async {
        let pp = PostParams::default();
        // In tenant B's namespace: one Application for B's agent, one whose destination
        // names tenant A's agent.
        let mut own = sample_app("own", B_MANAGED, "guestbook");
        own.data["spec"]["destination"] = json!({"name": B_MANAGED, "namespace": "own"});
        let mut cross = sample_app("cross", B_MANAGED, "guestbook");
        cross.data["spec"]["destination"] = json!({"name": A_MANAGED, "namespace": "cross"});
        let hub_b = apps(&t.hub, B_MANAGED)?;
        hub_b.create(&pp, &cross).await?;
        hub_b.create(&pp, &own).await?;
        eventually("own on B's spoke", T, || async {
            stored_app(t.spoke(B_MANAGED), B_MANAGED, "own")
        })
        .await?;
        never("cross on A's spoke", || {
            stored_app(t.spoke(A_MANAGED), B_MANAGED, "cross").is_some()
        })
        .await?;
        assert!(
            t.principal
                .log()
                .lines()
                .any(|l| l.contains("destination names an agent of another tenant"))
        );

        // Redis keys of both: B's from B's Redis; A's Redis is never asked for `cross`.
        let set = |server: &RedisServer, key: String, value: &'static [u8]| {
            let addr = server.addr();
            async move {
                let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
                let out = redis_cli(port, &[b"SET", key.as_bytes(), value])
                    .await
                    .unwrap();
                assert!(out.status.success());
            }
        };
        // Each spoke's Argo CD names keys `<namespace>_<name>` outside its own namespace.
        set(
            &b_redis,
            format!("app|resources-tree|{B_MANAGED}_own|1.8.3"),
            b"b-tree",
        )
        .await;
        set(
            &a_redis,
            format!("app|resources-tree|{B_MANAGED}_cross|1.8.3"),
            b"LEAK-from-tenant-a",
        )
        .await;
        let get = |key: String| async move {
            let out = redis_cli(proxy_port, &[b"GET", key.as_bytes()])
                .await
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
        };
        eventually("B's key through the proxy", T, || async {
            (get(format!("app|resources-tree|{B_MANAGED}_own|1.8.3")).await == "b-tree")
                .then_some(())
        })
        .await?;
        let cross_value = get(format!("app|resources-tree|{B_MANAGED}_cross|1.8.3")).await;
        assert!(
            !cross_value.contains("LEAK"),
            "tenant A's agent answered: {cross_value}"
        );
        Ok(())
    }
    .await;
    t.finish(r).await;
}
