//! Least privilege, proven: runs the principal and both agents through the e2e scenarios
//! (managed and autonomous create / edit / delete / status / operation, drift revert, hub
//! namespace auto-create, resync after a restart of either side; AppProjects, repository
//! Secrets and the GPG keys ConfigMap distributed to the managed agent, reverted there and
//! deleted; an autonomous agent's AppProject copied to the hub, reverted there and deleted),
//! records every request each
//! of them makes to its Kubernetes API test server, and authorizes each one against the RBAC
//! that `kubectl kustomize deploy/overlays/spire/{principal,agent}` renders, the way the
//! apiserver's RBAC authorizer would. A request the rules do not grant fails the test; a
//! grant no request used is listed (printed), so over-broad rules show up.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use argocd_agent_kube_test_server::RecordedRequest;
use argocd_agent_testkit::harness::*;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);
/// The namespace every overlay installs into (RoleBindings grant only there); the spokes'
/// Argo CD namespace in the topology is the same.
const INSTALL_NS: &str = "argocd";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn render(dir: &str) -> Vec<Value> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(workspace_root().join("deploy").join(dir))
        .output()
        .unwrap_or_else(|e| panic!("running kubectl kustomize {dir}: {e} (run .ci/run once)"));
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_saphyr::from_multiple::<Value>(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
}

fn strings(v: &Value, field: &str) -> Vec<String> {
    v.get(field)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// One PolicyRule of a Role or ClusterRole, with where its binding applies.
#[derive(Debug, Clone)]
struct Grant {
    /// `ClusterRole/x` or `Role/x`.
    role: String,
    /// `None`: every namespace and cluster-scoped objects (ClusterRoleBinding); otherwise
    /// only this namespace (RoleBinding).
    namespace: Option<String>,
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    resource_names: Vec<String>,
}

fn any_or(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

impl Grant {
    /// Whether this rule allows the request, as the RBAC authorizer decides it.
    fn allows(&self, r: &RecordedRequest) -> bool {
        let resource = match &r.subresource {
            Some(sub) => format!("{}/{sub}", r.resource),
            None => r.resource.clone(),
        };
        // A namespace object is cluster-scoped although RequestInfo names it as namespace.
        let namespaced = r.resource != "namespaces" && r.namespace.is_some();
        let scope_ok = match (&self.namespace, namespaced) {
            (None, _) => true,
            (Some(ns), true) => r.namespace.as_deref() == Some(ns.as_str()),
            (Some(_), false) => false,
        };
        let name_ok = self.resource_names.is_empty()
            || r.name
                .as_ref()
                .is_some_and(|n| self.resource_names.contains(n));
        scope_ok
            && name_ok
            && any_or(&self.api_groups, &r.api_group)
            && any_or(&self.resources, &resource)
            && any_or(&self.verbs, &r.verb)
    }

    /// Every (group, resource, verb) this rule grants, for the "never used" list.
    fn triples(&self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for g in &self.api_groups {
            for res in &self.resources {
                for v in &self.verbs {
                    out.push((g.clone(), res.clone(), v.clone()));
                }
            }
        }
        out
    }
}

/// The rules bound to service account `sa` in the rendered objects.
fn grants_for(objects: &[Value], sa: &str) -> Vec<Grant> {
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name} is bound but not rendered"))
    };
    let mut out = Vec::new();
    for binding in objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
    {
        let bound = binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == sa
                    && s["namespace"].as_str() == Some(INSTALL_NS)
            });
        if !bound {
            continue;
        }
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or("");
        let role_name = binding["roleRef"]["name"].as_str().unwrap_or("");
        let role = find(role_kind, role_name);
        let namespace = (binding["kind"] == "RoleBinding").then(|| {
            binding["metadata"]["namespace"]
                .as_str()
                .expect("a RoleBinding of an overlay has a namespace")
                .to_owned()
        });
        for rule in role["rules"].as_array().into_iter().flatten() {
            out.push(Grant {
                role: format!("{role_kind}/{role_name}"),
                namespace: namespace.clone(),
                api_groups: strings(rule, "apiGroups"),
                resources: strings(rule, "resources"),
                verbs: strings(rule, "verbs"),
                resource_names: strings(rule, "resourceNames"),
            });
        }
    }
    assert!(!out.is_empty(), "no rules bound to service account {sa}");
    out
}

fn describe(r: &RecordedRequest) -> String {
    let group = if r.api_group.is_empty() {
        "core"
    } else {
        &r.api_group
    };
    let sub = r
        .subresource
        .as_deref()
        .map(|s| format!("/{s}"))
        .unwrap_or_default();
    format!(
        "{} {group} {}{sub} namespace={} name={} (HTTP {})",
        r.verb,
        r.resource,
        r.namespace.as_deref().unwrap_or("-"),
        r.name.as_deref().unwrap_or("-"),
        r.code
    )
}

/// Authorizes `requests` against `grants`: returns the requests no rule allows, and prints
/// the grants no request used.
fn audit(who: &str, grants: &[Grant], requests: &[RecordedRequest]) -> Vec<String> {
    let mut denied = BTreeSet::new();
    let mut used: BTreeSet<(String, String, String)> = BTreeSet::new();
    for r in requests {
        match grants.iter().find(|g| g.allows(r)) {
            Some(_) => {
                let resource = match &r.subresource {
                    Some(sub) => format!("{}/{sub}", r.resource),
                    None => r.resource.clone(),
                };
                used.insert((r.api_group.clone(), resource, r.verb.clone()));
            }
            None => {
                denied.insert(format!("{who}: {}", describe(r)));
            }
        }
    }
    let mut unused = Vec::new();
    for g in grants {
        for t in g.triples() {
            if !used.contains(&t) {
                unused.push(format!(
                    "{} {} {} ({})",
                    t.2,
                    if t.0.is_empty() { "core" } else { &t.0 },
                    t.1,
                    g.role
                ));
            }
        }
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests {
        *seen.entry(describe_kind(r)).or_default() += 1;
    }
    println!("{who}: {} requests: {seen:?}", requests.len());
    if unused.is_empty() {
        println!("{who}: every grant was used");
    } else {
        println!("{who}: grants never used in the scenarios:");
        for u in &unused {
            println!("  {u}");
        }
    }
    denied.into_iter().collect()
}

fn describe_kind(r: &RecordedRequest) -> String {
    let sub = r
        .subresource
        .as_deref()
        .map(|s| format!("/{s}"))
        .unwrap_or_default();
    format!("{} {}{sub}", r.verb, r.resource)
}

fn requests_of(
    server: &argocd_agent_kube_test_server::KubeTestServer,
    user: &str,
) -> Vec<RecordedRequest> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.user.as_deref() == Some(user))
        .collect()
}

fn rbac_objects(objects: &[Value]) -> Vec<Value> {
    objects
        .iter()
        .filter(|o| {
            matches!(
                o["kind"].as_str(),
                Some("Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding")
            )
        })
        .cloned()
        .collect()
}

#[test]
fn every_overlay_ships_the_same_rbac_as_the_audited_one() {
    for component in ["principal", "agent"] {
        let audited = rbac_objects(&render(&format!("overlays/spire/{component}")));
        for overlay in ["pem-files", "istio", "linkerd"] {
            let other = rbac_objects(&render(&format!("overlays/{overlay}/{component}")));
            assert_eq!(
                other, audited,
                "overlays/{overlay}/{component} RBAC differs from overlays/spire/{component}, which tests/rbac.rs audits"
            );
        }
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn projects_res() -> ApiResource {
    resource("argoproj.io", "v1alpha1", "AppProject", "appprojects")
}

fn secrets_res() -> ApiResource {
    resource("", "v1", "Secret", "secrets")
}

fn configmaps_res() -> ApiResource {
    resource("", "v1", "ConfigMap", "configmaps")
}

/// Objects of `ar` in `ns` of a test server, as the test (user `e2e`).
fn api(
    server: &argocd_agent_kube_test_server::KubeTestServer,
    ns: &str,
    ar: &ApiResource,
) -> Result<Api<DynamicObject>, HarnessError> {
    Ok(Api::namespaced_with(kube_client(server)?, ns, ar))
}

fn object(ar: &ApiResource, body: Value) -> Result<DynamicObject, HarnessError> {
    let mut v = body;
    v["apiVersion"] = json!(ar.api_version);
    v["kind"] = json!(ar.kind);
    Ok(serde_json::from_value(v)?)
}

/// Reads an object of `ar` straight from a test server's store.
fn stored(
    server: &argocd_agent_kube_test_server::KubeTestServer,
    ar: &ApiResource,
    ns: &str,
    name: &str,
) -> Option<Value> {
    server.get_object(&ar.group, &ar.version, &ar.plural, Some(ns), name)
}

/// Hub namespaces in this test are `hub-<agent>` and do not exist beforehand: the principal
/// must create them (`--namespace-create-enable`).
const RULES: &str = "rules:\n  - name: rbac-test\n    template: \"spiffe://{trust_domain}/ns/agents/sa/{sa}\"\n    agent: \"{sa}\"\n    namespace: \"hub-{sa}\"\n    trustDomains: [\"example.org\"]\n    mode: both\n";

fn hub_ns(agent: &str) -> String {
    format!("hub-{agent}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principal_and_agents_only_make_requests_their_rbac_grants() {
    let principal_objects = render("overlays/spire/principal");
    let agent_objects = render("overlays/spire/agent");
    let principal_grants = grants_for(&principal_objects, "argocd-agent-principal");
    let agent_grants = grants_for(&agent_objects, "argocd-agent-agent");

    let rules_dir = tempfile::tempdir().expect("temp dir");
    let rules_file = rules_dir.path().join("rules.yaml");
    std::fs::write(&rules_file, RULES).expect("writing rules");
    let mut topo = Topology::start(TopologyOptions {
        rules_file: Some(rules_file),
        // As deployed: a replica (Leases for itself and each session).
        principal_args: vec![
            "--namespace-create-enable".into(),
            "--ha".into(),
            "--replica-id".into(),
            "principal-0".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = scenarios(&mut topo).await;
    if let Err(e) = r {
        for (who, server, user) in [
            ("principal", &topo.hub, "hub"),
            ("managed agent", &topo.managed_spoke, "managed"),
            ("autonomous agent", &topo.autonomous_spoke, "autonomous"),
        ] {
            eprintln!("--- requests of the {who} ---");
            for r in requests_of(server, user) {
                eprintln!("  {}", describe(&r));
            }
        }
        let logs = topo.logs();
        topo.stop().await;
        panic!("{e}\n{logs}");
    }
    let hub = requests_of(&topo.hub, "hub");
    let managed = requests_of(&topo.managed_spoke, "managed");
    let autonomous = requests_of(&topo.autonomous_spoke, "autonomous");
    topo.stop().await;

    // The log must really hold the scenarios' traffic, or the audit proves nothing.
    for (who, reqs, must) in [
        (
            "principal",
            &hub,
            &[
                "list applications",
                "watch applications",
                "create applications",
                "patch applications/status",
                "create namespaces",
                "list namespaces",
                "watch namespaces",
                "list appprojects",
                "watch appprojects",
                "create appprojects",
                "update appprojects",
                "delete appprojects",
                "list secrets",
                "watch secrets",
                "list configmaps",
                "watch configmaps",
            ][..],
        ),
        (
            "managed agent",
            &managed,
            &[
                "list applications",
                "watch applications",
                "create applications",
                "delete applications",
                "list appprojects",
                "watch appprojects",
                "create appprojects",
                "list secrets",
                "watch secrets",
                "create secrets",
                "delete secrets",
                "delete appprojects",
                "delete configmaps",
                "list configmaps",
                "watch configmaps",
                "create configmaps",
            ][..],
        ),
        (
            "autonomous agent",
            &autonomous,
            &[
                "list applications",
                "watch applications",
                "list appprojects",
                "watch appprojects",
            ][..],
        ),
    ] {
        let kinds: BTreeSet<String> = reqs.iter().map(describe_kind).collect();
        for m in must {
            assert!(
                kinds.contains(*m),
                "{who}: no `{m}` request recorded; recorded: {kinds:?}"
            );
        }
    }

    let mut denied = audit("principal", &principal_grants, &hub);
    // Both agents run under the same Role: a grant is used if either mode uses it.
    let agents: Vec<RecordedRequest> = managed.iter().chain(&autonomous).cloned().collect();
    denied.extend(audit(
        "agents (managed + autonomous)",
        &agent_grants,
        &agents,
    ));
    assert!(
        denied.is_empty(),
        "requests the shipped RBAC does not grant (the apiserver would answer 403):\n  {}",
        denied.join("\n  ")
    );
}

async fn scenarios(topo: &mut Topology) -> Result<(), HarnessError> {
    let m_ns = hub_ns(MANAGED);
    let a_ns = hub_ns(AUTONOMOUS);
    // Namespace auto-create: the principal made the agents' hub namespaces.
    for ns in [&m_ns, &a_ns] {
        eventually(&format!("hub namespace {ns} created"), T, || async {
            topo.hub.get_object("", "v1", "namespaces", None, ns)
        })
        .await?;
    }

    config_scenarios(topo).await?;

    // Managed: hub create, edit, operation, spoke status, local drift revert, hub delete.
    let hub_m = apps(&topo.hub, &m_ns)?;
    let spoke_m = apps(&topo.managed_spoke, SPOKE_NS)?;
    hub_m
        .create(
            &PostParams::default(),
            &sample_app("guestbook", &m_ns, "guestbook"),
        )
        .await?;
    eventually("managed create reaches the spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
    })
    .await?;
    merge_patch(
        &hub_m,
        "guestbook",
        json!({"spec": {"source": {"targetRevision": "v2"}}}),
    )
    .await?;
    eventually("managed edit reaches the spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
            .filter(|a| a["spec"]["source"]["targetRevision"] == "v2")
    })
    .await?;
    let op = json!({"sync": {"revision": "v2"}, "initiatedBy": {"username": "admin"}});
    merge_patch(&hub_m, "guestbook", json!({"operation": op})).await?;
    eventually("managed operation reaches the spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
            .filter(|a| a["operation"]["sync"]["revision"] == "v2")
    })
    .await?;
    // Terminating the running operation on the hub reaches the spoke's status.
    set_status(
        &hub_m,
        "guestbook",
        json!({"operationState": {"phase": "Terminating"}}),
    )
    .await?;
    let op = json!({"sync": {"revision": "v2-stop"}, "initiatedBy": {"username": "admin"}});
    merge_patch(&hub_m, "guestbook", json!({"operation": op})).await?;
    eventually("managed terminate reaches the spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
            .filter(|a| a["status"]["operationState"]["phase"] == "Terminating")
    })
    .await?;
    set_status(
        &spoke_m,
        "guestbook",
        json!({"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}),
    )
    .await?;
    eventually("managed status reaches the hub", T, || async {
        stored_app(&topo.hub, &m_ns, "guestbook")
            .filter(|a| a["status"]["health"]["status"] == "Healthy")
    })
    .await?;
    merge_patch(
        &spoke_m,
        "guestbook",
        json!({"spec": {"source": {"targetRevision": "hacked"}}}),
    )
    .await?;
    eventually("managed local edit reverted", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
            .filter(|a| a["spec"]["source"]["targetRevision"] == "v2")
    })
    .await?;
    hub_m.delete("guestbook", &DeleteParams::default()).await?;
    eventually("managed delete reaches the spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
            .is_none()
            .then_some(())
    })
    .await?;

    // Autonomous: spoke create, edit, status, hub drift revert, hub operation, spoke delete.
    let hub_a = apps(&topo.hub, &a_ns)?;
    let spoke_a = apps(&topo.autonomous_spoke, SPOKE_NS)?;
    spoke_a
        .create(
            &PostParams::default(),
            &sample_app("edge-app", SPOKE_NS, "helm-guestbook"),
        )
        .await?;
    eventually("autonomous create reaches the hub", T, || async {
        stored_app(&topo.hub, &a_ns, "edge-app")
    })
    .await?;
    merge_patch(
        &spoke_a,
        "edge-app",
        json!({"spec": {"source": {"targetRevision": "v3"}}}),
    )
    .await?;
    eventually("autonomous edit reaches the hub", T, || async {
        stored_app(&topo.hub, &a_ns, "edge-app")
            .filter(|a| a["spec"]["source"]["targetRevision"] == "v3")
    })
    .await?;
    set_status(
        &spoke_a,
        "edge-app",
        json!({"sync": {"status": "OutOfSync"}, "health": {"status": "Progressing"}}),
    )
    .await?;
    eventually("autonomous status reaches the hub", T, || async {
        stored_app(&topo.hub, &a_ns, "edge-app")
            .filter(|a| a["status"]["health"]["status"] == "Progressing")
    })
    .await?;
    merge_patch(
        &hub_a,
        "edge-app",
        json!({"spec": {"source": {"targetRevision": "hub-hack"}}}),
    )
    .await?;
    eventually("hub edit of an autonomous app reverted", T, || async {
        stored_app(&topo.hub, &a_ns, "edge-app")
            .filter(|a| a["spec"]["source"]["targetRevision"] == "v3")
    })
    .await?;
    let op = json!({"sync": {"revision": "v3"}, "initiatedBy": {"username": "admin"}});
    merge_patch(&hub_a, "edge-app", json!({"operation": op})).await?;
    eventually("autonomous operation reaches the spoke", T, || async {
        stored_app(&topo.autonomous_spoke, SPOKE_NS, "edge-app")
            .filter(|a| a["operation"]["sync"]["revision"] == "v3")
    })
    .await?;

    // Resync after a principal restart: a spoke edit and create made meanwhile arrive.
    let before = topo.connect_count(AUTONOMOUS);
    topo.principal.stop().await;
    merge_patch(
        &spoke_a,
        "edge-app",
        json!({"spec": {"source": {"targetRevision": "away"}}}),
    )
    .await?;
    spoke_a
        .create(
            &PostParams::default(),
            &sample_app("while-away", SPOKE_NS, "guestbook"),
        )
        .await?;
    topo.principal.start()?;
    eventually("autonomous agent reconnected", T, || async {
        (topo.connect_count(AUTONOMOUS) > before).then_some(())
    })
    .await?;
    eventually(
        "edit made while the principal was down arrives",
        T,
        || async {
            stored_app(&topo.hub, &a_ns, "edge-app")
                .filter(|a| a["spec"]["source"]["targetRevision"] == "away")
        },
    )
    .await?;
    eventually(
        "create made while the principal was down arrives",
        T,
        || async { stored_app(&topo.hub, &a_ns, "while-away") },
    )
    .await?;

    // Resync after an agent restart: a hub create made meanwhile arrives.
    topo.wait_connected(MANAGED, T).await?;
    let before = topo.connect_count(MANAGED);
    topo.managed
        .as_mut()
        .ok_or("no managed agent")?
        .stop()
        .await;
    hub_m
        .create(
            &PostParams::default(),
            &sample_app("created-while-away", &m_ns, "guestbook"),
        )
        .await?;
    topo.managed.as_mut().ok_or("no managed agent")?.start()?;
    eventually("managed agent reconnected", T, || async {
        (topo.connect_count(MANAGED) > before).then_some(())
    })
    .await?;
    eventually(
        "hub create made while the agent was down arrives",
        T,
        || async { stored_app(&topo.managed_spoke, SPOKE_NS, "created-while-away") },
    )
    .await?;

    // Autonomous delete on the spoke reaches the hub.
    spoke_a.delete("edge-app", &DeleteParams::default()).await?;
    eventually("autonomous delete reaches the hub", T, || async {
        stored_app(&topo.hub, &a_ns, "edge-app")
            .is_none()
            .then_some(())
    })
    .await?;
    Ok(())
}

/// AppProjects, repository Secrets and the GPG keys ConfigMap: the hub's reach the managed
/// spoke, a local edit there is reverted, a hub delete reaches it; an autonomous agent's
/// project lands on the hub as `<agent>-<project>` and goes when the spoke deletes it.
async fn config_scenarios(topo: &mut Topology) -> Result<(), HarnessError> {
    // Argo CD's namespace on the hub (the principal's `--namespace`, default `argocd`).
    create_namespace(&topo.hub, INSTALL_NS).await?;
    let (pr, sr, cr) = (projects_res(), secrets_res(), configmaps_res());
    // The hub objects are created (and later deleted) while the principal is down, so they
    // reach the managed agent through the resync on reconnect. Changing them while the
    // managed agent is connected hangs the principal's worker for that agent: Hub::
    // reconcile_config (principal/src/config_objects.rs) calls config_event, which locks
    // AgentState::inner again through state.namespace() while reconcile_config still holds
    // it (std Mutex, same thread). Not worked around in product code here; see the report.
    let before = topo.connect_count(MANAGED);
    topo.principal.stop().await;
    let hub_projects = api(&topo.hub, INSTALL_NS, &pr)?;
    let hub_secrets = api(&topo.hub, INSTALL_NS, &sr)?;
    let hub_configmaps = api(&topo.hub, INSTALL_NS, &cr)?;
    hub_projects
        .create(
            &PostParams::default(),
            &object(
                &pr,
                json!({
                    "metadata": {"name": "team", "namespace": INSTALL_NS},
                    "spec": {
                        // Matches the managed agent by its hub namespace (`hub-<agent>`
                        // in this test) and by destination name.
                        "sourceNamespaces": [hub_ns(MANAGED)],
                        "destinations": [{"name": MANAGED, "namespace": "*", "server": "*"}],
                        "sourceRepos": ["*"]
                    }
                }),
            )?,
        )
        .await?;
    hub_secrets
        .create(
            &PostParams::default(),
            &object(
                &sr,
                json!({
                    "metadata": {
                        "name": "repo-x",
                        "namespace": INSTALL_NS,
                        "labels": {"argocd.argoproj.io/secret-type": "repository"}
                    },
                    "stringData": {"project": "team", "url": "https://git.example/x", "type": "git"}
                }),
            )?,
        )
        .await?;
    hub_configmaps
        .create(
            &PostParams::default(),
            &object(
                &cr,
                json!({
                    "metadata": {"name": "argocd-gpg-keys-cm", "namespace": INSTALL_NS},
                    "data": {"4AEE18F83AFDEB23": "-----BEGIN PGP PUBLIC KEY BLOCK-----\nx\n-----END PGP PUBLIC KEY BLOCK-----\n"}
                }),
            )?,
        )
        .await?;
    topo.principal.start()?;
    eventually("managed agent reconnected", T, || async {
        (topo.connect_count(MANAGED) > before).then_some(())
    })
    .await?;
    let spoke = &topo.managed_spoke;
    eventually("hub AppProject reaches the managed spoke", T, || async {
        stored(spoke, &pr, SPOKE_NS, "team")
    })
    .await?;
    eventually(
        "hub repository Secret reaches the managed spoke",
        T,
        || async { stored(spoke, &sr, SPOKE_NS, "repo-x") },
    )
    .await?;
    eventually(
        "hub GPG keys ConfigMap reaches the managed spoke",
        T,
        || async { stored(spoke, &cr, SPOKE_NS, "argocd-gpg-keys-cm") },
    )
    .await?;

    // Local edits on the managed spoke are reverted.
    merge_patch(
        &api(spoke, SPOKE_NS, &pr)?,
        "team",
        json!({"spec": {"sourceRepos": ["https://hacked.example/*"]}}),
    )
    .await?;
    eventually("managed local AppProject edit reverted", T, || async {
        stored(spoke, &pr, SPOKE_NS, "team").filter(|p| p["spec"]["sourceRepos"] == json!(["*"]))
    })
    .await?;
    merge_patch(
        &api(spoke, SPOKE_NS, &cr)?,
        "argocd-gpg-keys-cm",
        json!({"data": {"4AEE18F83AFDEB23": "hacked"}}),
    )
    .await?;
    eventually("managed local GPG keys edit reverted", T, || async {
        stored(spoke, &cr, SPOKE_NS, "argocd-gpg-keys-cm")
            .filter(|c| c["data"]["4AEE18F83AFDEB23"] != "hacked")
    })
    .await?;
    // base64 of https://hacked.example/x
    let hacked = "aHR0cHM6Ly9oYWNrZWQuZXhhbXBsZS94";
    merge_patch(
        &api(spoke, SPOKE_NS, &sr)?,
        "repo-x",
        json!({"data": {"url": hacked}}),
    )
    .await?;
    eventually("managed local repository edit reverted", T, || async {
        stored(spoke, &sr, SPOKE_NS, "repo-x").filter(|c| c["data"]["url"] != hacked)
    })
    .await?;

    // A hub delete reaches the managed spoke (made while the principal is down, see above).
    let before = topo.connect_count(MANAGED);
    topo.principal.stop().await;
    hub_secrets
        .delete("repo-x", &DeleteParams::default())
        .await?;
    hub_configmaps
        .delete("argocd-gpg-keys-cm", &DeleteParams::default())
        .await?;
    hub_projects
        .delete("team", &DeleteParams::default())
        .await?;
    topo.principal.start()?;
    eventually("managed agent reconnected", T, || async {
        (topo.connect_count(MANAGED) > before).then_some(())
    })
    .await?;
    let spoke = &topo.managed_spoke;
    for (what, ar, name) in [
        ("repository", &sr, "repo-x"),
        ("GPG keys", &cr, "argocd-gpg-keys-cm"),
        ("AppProject", &pr, "team"),
    ] {
        eventually(
            &format!("hub {what} delete reaches the managed spoke"),
            T,
            || async { stored(spoke, ar, SPOKE_NS, name).is_none().then_some(()) },
        )
        .await?;
    }

    // Autonomous: a spoke project lands on the hub as <agent>-<project>, and goes with it.
    let spoke_a = api(&topo.autonomous_spoke, SPOKE_NS, &pr)?;
    spoke_a
        .create(
            &PostParams::default(),
            &object(
                &pr,
                json!({
                    "metadata": {"name": "local", "namespace": SPOKE_NS},
                    "spec": {
                        "destinations": [{"namespace": "*", "server": "https://kubernetes.default.svc"}],
                        "sourceRepos": ["*"]
                    }
                }),
            )?,
        )
        .await?;
    let hub_name = format!("{AUTONOMOUS}-local");
    eventually("autonomous AppProject reaches the hub", T, || async {
        stored(&topo.hub, &pr, INSTALL_NS, &hub_name)
    })
    .await?;
    merge_patch(
        &spoke_a,
        "local",
        json!({"spec": {"sourceRepos": ["https://git.example/*"]}}),
    )
    .await?;
    eventually("autonomous AppProject edit reaches the hub", T, || async {
        stored(&topo.hub, &pr, INSTALL_NS, &hub_name)
            .filter(|p| p["spec"]["sourceRepos"] == json!(["https://git.example/*"]))
    })
    .await?;
    merge_patch(
        &hub_projects,
        &hub_name,
        json!({"spec": {"sourceRepos": ["https://hub-hack.example/*"]}}),
    )
    .await?;
    eventually(
        "hub edit of an autonomous AppProject reverted",
        T,
        || async {
            stored(&topo.hub, &pr, INSTALL_NS, &hub_name)
                .filter(|p| p["spec"]["sourceRepos"] == json!(["https://git.example/*"]))
        },
    )
    .await?;
    spoke_a.delete("local", &DeleteParams::default()).await?;
    eventually(
        "autonomous AppProject delete reaches the hub",
        T,
        || async {
            stored(&topo.hub, &pr, INSTALL_NS, &hub_name)
                .is_none()
                .then_some(())
        },
    )
    .await?;
    Ok(())
}
