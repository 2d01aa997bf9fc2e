//! A side-by-side migration, end to end with real processes: two principals (A and B) on
//! one hub, partitioned by `--allowed-namespaces` and `--label-selector`, each with `--ha`
//! (Leases in the shared Argo CD namespace), each hub client its own Kubernetes user so the
//! hub's request log says who wrote what.
//!
//! - agent-x (autonomous) on A: its Application and AppProject land on the hub, labelled
//!   for A's partition; a label A's selector excludes (`tier!=hidden`) is not copied, so a
//!   hub edit is still reverted;
//! - agent-y (managed) on B: a hub AppProject and Application labelled for B reach its
//!   spoke, unlabelled ones never do;
//! - an agent whose rule maps it outside a principal's namespaces is refused at connect,
//!   with a message naming the namespace and the partition;
//! - no hub object is written by both principals;
//! - cut-over: agent-x moves to B (A restarted without agent-x's namespace, B with it, the
//!   agent restarted pointed at B); its Applications keep flowing, its hub copies move to
//!   B's partition, and every write of A to agent-x's objects precedes every write of B.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_kube_test_server::{KubeTestServer, RecordedRequest, ServerOptions};
use argocd_agent_testkit::envoy::free_loopback_port;
use argocd_agent_testkit::harness::*;
use argocd_agent_testkit::workload_api::DevWorkloadApi;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

const X: &str = "agent-x";
const Y: &str = "agent-y";
/// What stays on A after the cut-over (the agents still on upstream's principal, say).
const LEGACY: &str = "agent-legacy";

/// Starts a principal on `port` serving `namespaces` with label selector `selector`, as hub
/// user `user`.
async fn principal(
    dir: &Path,
    spiffe: &argocd_agent_testkit::workload_api::DevWorkloadApiHandle,
    name: &str,
    port: u16,
    namespaces: &str,
    selector: &str,
) -> Result<Proc, HarnessError> {
    let metrics_port = free_loopback_port()?;
    let mut args = principal_args(
        port,
        &dir.join(format!("hub-{name}.kubeconfig")),
        metrics_port,
        &spiffe.endpoint(&dir.join("principal.sock")),
    );
    args.extend(
        [
            "--identity-rule",
            RULE,
            "--admin-address",
            "off",
            "--disable-redis-proxy",
            "--allowed-namespaces",
            namespaces,
            "--label-selector",
            selector,
            "--ha",
            "--replica-id",
            name,
            "--replica-lease-duration",
            "3s",
        ]
        .map(String::from),
    );
    let mut p = Proc::new(
        name,
        binary("argocd-agent")?,
        args,
        dir.join(format!("{name}.log")),
    );
    p.start()?;
    // Until it is ready (its replica Lease written, its watches listed) a principal closes
    // connections before TLS: the test dials it itself, so it waits.
    wait_port(format!("127.0.0.1:{port}").parse()?).await?;
    eventually(
        &format!("principal {name} ready"),
        Duration::from_secs(30),
        || async move { (http_status(metrics_port, "/readyz").await == Some(200)).then_some(()) },
    )
    .await?;
    Ok(p)
}

/// Starts agent `agent` in `mode` against the principal on `port`.
fn agent(
    dir: &Path,
    spiffe: &argocd_agent_testkit::workload_api::DevWorkloadApiHandle,
    agent: &str,
    mode: &str,
    port: u16,
) -> Result<Proc, HarnessError> {
    let args = [
        "agent",
        "--agent-mode",
        mode,
        "--server-address",
        "127.0.0.1",
        "--server-port",
        &port.to_string(),
        "--principal-spiffe-id",
        PRINCIPAL_ID,
        "--spiffe-endpoint-socket",
        &spiffe.endpoint(&dir.join(format!("{agent}.sock"))),
        "--kubeconfig",
        &dir.join(format!("{agent}.kubeconfig"))
            .display()
            .to_string(),
        "--namespace",
        SPOKE_NS,
        "--metrics-port",
        "0",
        "--keep-alive-ping-interval",
        "5s",
        "--creds",
        "spiffe",
    ]
    .map(String::from)
    .to_vec();
    let mut p = Proc::new(
        agent,
        binary("argocd-agent")?,
        args,
        dir.join(format!("{agent}.log")),
    );
    p.start()?;
    Ok(p)
}

/// Waits until `p`'s log shows `agent` connected `n` times.
async fn connected(p: &Proc, agent: &str, n: usize) -> Result<(), HarnessError> {
    let needle = format!("agent={agent}");
    eventually(
        &format!("{agent} connected to {}", p.name),
        Duration::from_secs(30),
        || {
            let count = p
                .log()
                .lines()
                .filter(|l| l.contains("agent connected") && l.contains(&needle))
                .count();
            async move { (count >= n).then_some(()) }
        },
    )
    .await
}

/// The hub objects (resource, namespace, name) a user created, changed or deleted.
type Key = (String, String, String);

fn writes(requests: &[RecordedRequest], user: &str) -> Vec<Key> {
    requests
        .iter()
        .filter(|r| r.user.as_deref() == Some(user))
        .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .filter(|r| r.code < 300)
        .filter_map(|r| {
            let name = r.name.clone()?;
            Some((
                r.resource.clone(),
                r.namespace.clone().unwrap_or_default(),
                name,
            ))
        })
        .collect()
}

fn labels_of(v: &serde_json::Value) -> BTreeMap<String, String> {
    serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default()
}

/// A project on the hub (`labels`) for agent-y.
fn hub_project(name: &str, labels: serde_json::Value) -> kube::api::DynamicObject {
    object(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name, "namespace": HUB_ARGOCD_NS, "labels": labels},
        "spec": {
            "sourceRepos": ["*"],
            "destinations": [{"name": Y, "namespace": "*", "server": "*"}],
            "sourceNamespaces": [Y],
        }
    }))
}

fn app_in(
    name: &str,
    ns: &str,
    project: &str,
    labels: serde_json::Value,
) -> kube::api::DynamicObject {
    let mut app = sample_app(name, ns, "guestbook");
    app.data["spec"]["project"] = json!(project);
    app.metadata.labels = serde_json::from_value(labels).ok();
    app
}

struct World {
    dir: std::path::PathBuf,
    _tmp: Option<tempfile::TempDir>,
    spiffe: argocd_agent_testkit::workload_api::DevWorkloadApiHandle,
    hub: KubeTestServer,
    spokes: BTreeMap<&'static str, KubeTestServer>,
    procs: Vec<Proc>,
}

impl World {
    async fn start() -> Result<World, HarnessError> {
        let dir = std::env::var_os("E2E_DIR").map(std::path::PathBuf::from);
        let (dir, tmp) = work_dir(dir.as_deref(), "argocd-agent-partitions")?;
        let spiffe = DevWorkloadApi::builder(dir.join("spiffe"), TrustDomain::new(TRUST_DOMAIN)?)
            .socket(dir.join("principal.sock"), SpiffeId::parse(PRINCIPAL_ID)?)
            .socket(
                dir.join(format!("{X}.sock")),
                SpiffeId::parse(&agent_id(X))?,
            )
            .socket(
                dir.join(format!("{Y}.sock")),
                SpiffeId::parse(&agent_id(Y))?,
            )
            .serve()
            .await?;
        let hub =
            KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
        for user in ["a", "b"] {
            hub.write_kubeconfig_for_user(
                &dir.join(format!("hub-{user}.kubeconfig")),
                "hub",
                &format!("principal-{user}"),
            )?;
        }
        for ns in [X, Y, LEGACY, HUB_ARGOCD_NS] {
            create_namespace(&hub, ns).await?;
        }
        let mut spokes = BTreeMap::new();
        for a in [X, Y] {
            let spoke =
                KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
            spoke.write_kubeconfig(&dir.join(format!("{a}.kubeconfig")), a)?;
            create_namespace(&spoke, SPOKE_NS).await?;
            spokes.insert(a, spoke);
        }
        Ok(World {
            dir,
            _tmp: tmp,
            spiffe,
            hub,
            spokes,
            procs: Vec::new(),
        })
    }

    fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|p| format!("--- {} ---\n{}\n", p.name, p.log()))
            .collect()
    }

    async fn stop(&mut self) {
        for p in &mut self.procs {
            p.stop().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_partitioned_principals_share_a_hub_and_an_agent_moves_between_them() {
    let mut w = World::start().await.unwrap();
    let r = scenario(&mut w).await;
    let logs = w.logs();
    w.stop().await;
    if let Err(e) = r {
        panic!("{e}\n{logs}");
    }
}

async fn scenario(w: &mut World) -> Result<(), HarnessError> {
    let (port_a, port_b) = (free_loopback_port()?, free_loopback_port()?);
    // `tier!=hidden`: a label an agent could set to hide its copies from A's own watch.
    let (sel_a, sel_b) = ("partition-a=true,tier!=hidden", "partition-b=true");
    w.procs.push(
        principal(
            &w.dir,
            &w.spiffe,
            "a",
            port_a,
            &format!("{X},{LEGACY}"),
            sel_a,
        )
        .await?,
    );
    w.procs
        .push(principal(&w.dir, &w.spiffe, "b", port_b, Y, sel_b).await?);

    // Hub objects for agent-y (managed, on B): labelled for B, and decoys without it.
    let hub_projects = projects(&w.hub, HUB_ARGOCD_NS)?;
    let pp = PostParams::default();
    hub_projects
        .create(&pp, &hub_project("team-y", json!({"partition-b": "true"})))
        .await?;
    hub_projects
        .create(&pp, &hub_project("team-y-unlabelled", json!({})))
        .await?;
    let hub_y = apps(&w.hub, Y)?;
    hub_y
        .create(
            &pp,
            &app_in("app-y", Y, "team-y", json!({"partition-b": "true"})),
        )
        .await?;
    hub_y
        .create(&pp, &app_in("app-y-unlabelled", Y, "team-y", json!({})))
        .await?;

    // agent-x (autonomous, on A) authors its project and Application on its spoke.
    let spoke_x = &w.spokes[X];
    let x_project = object(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "proj-x", "namespace": SPOKE_NS},
        "spec": {"sourceRepos": ["*"], "destinations": [{"namespace": "*", "server": "*"}]}
    }));
    projects(spoke_x, SPOKE_NS)?.create(&pp, &x_project).await?;
    apps(spoke_x, SPOKE_NS)?
        .create(
            &pp,
            &app_in("app-x", SPOKE_NS, "proj-x", json!({"tier": "hidden"})),
        )
        .await?;

    w.procs
        .push(agent(&w.dir, &w.spiffe, X, "autonomous", port_a)?);
    w.procs
        .push(agent(&w.dir, &w.spiffe, Y, "managed", port_b)?);
    connected(&w.procs[0], X, 1).await?;
    connected(&w.procs[1], Y, 1).await?;

    // Both partitions flow.
    let hub = &w.hub;
    let app_x = eventually(
        "agent-x's Application on the hub",
        Duration::from_secs(30),
        || async { stored_app(hub, X, "app-x") },
    )
    .await?;
    assert_eq!(
        labels_of(&app_x).get("partition-a").map(String::as_str),
        Some("true")
    );
    // The label A's selector excludes is not copied, so A still sees (and reverts) edits.
    assert_eq!(labels_of(&app_x).get("tier"), None, "{app_x}");
    apps(hub, X)?
        .patch(
            "app-x",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"path": "hub-edit"}}})),
        )
        .await?;
    eventually(
        "the hub edit of agent-x's Application reverted by A",
        Duration::from_secs(30),
        || async {
            stored_app(hub, X, "app-x")
                .filter(|a| a["spec"]["source"]["path"] == app_x["spec"]["source"]["path"])
        },
    )
    .await?;
    let proj_x = eventually(
        "agent-x's project on the hub",
        Duration::from_secs(30),
        || async { stored_project(hub, HUB_ARGOCD_NS, "agent-x-proj-x") },
    )
    .await?;
    assert_eq!(
        labels_of(&proj_x).get("partition-a").map(String::as_str),
        Some("true")
    );
    let spoke_y = &w.spokes[Y];
    eventually(
        "agent-y's Application and project on its spoke",
        Duration::from_secs(30),
        || async {
            (stored_app(spoke_y, SPOKE_NS, "app-y").is_some()
                && stored_project(spoke_y, SPOKE_NS, "team-y").is_some())
            .then_some(())
        },
    )
    .await?;
    // What B's selector does not match never reaches agent-y.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(stored_app(spoke_y, SPOKE_NS, "app-y-unlabelled").is_none());
    assert!(stored_project(spoke_y, SPOKE_NS, "team-y-unlabelled").is_none());

    // Outside a principal's namespaces: refused at connect, saying why.
    let refused = refusal(
        w,
        Y,
        port_a,
        argocd_agent_proto::eventstream::AgentMode::Managed,
    )
    .await?
    .ok_or("agent-y was admitted by principal A")?;
    assert!(
        refused.contains("maps to hub namespace agent-y")
            && refused.contains("does not serve")
            && refused.contains("--allowed-namespaces is agent-x,agent-legacy"),
        "{refused}"
    );

    // No hub object written by both.
    let before = w.hub.requests();
    let (wa, wb) = (
        writes(&before, "principal-a"),
        writes(&before, "principal-b"),
    );
    let (sa, sb): (BTreeSet<_>, BTreeSet<_>) = (wa.iter().collect(), wb.iter().collect());
    assert!(
        !sa.is_empty() && !sb.is_empty(),
        "A wrote {sa:?}, B wrote {sb:?}"
    );
    let both: Vec<_> = sa.intersection(&sb).collect();
    assert!(both.is_empty(), "written by both principals: {both:?}");
    assert!(
        sa.iter().all(|(_, ns, _)| ns != Y),
        "A wrote in agent-y: {sa:?}"
    );
    assert!(
        sb.iter().all(|(_, ns, _)| ns != X),
        "B wrote in agent-x: {sb:?}"
    );
    // Each replica's Leases carry its partition's label: neither sees the other's.
    let leases = w
        .hub
        .list_objects("coordination.k8s.io", "v1", "leases", Some(HUB_ARGOCD_NS));
    let lease_labels: BTreeMap<String, BTreeMap<String, String>> = leases
        .iter()
        .map(|l| {
            (
                l["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                labels_of(l),
            )
        })
        .collect();
    for (lease, partition) in [
        ("argocd-agent-replica-a", "partition-a"),
        ("argocd-agent-replica-b", "partition-b"),
        ("argocd-agent-session-agent-x", "partition-a"),
        ("argocd-agent-session-agent-y", "partition-b"),
    ] {
        let l = lease_labels
            .get(lease)
            .ok_or(format!("no Lease {lease}: {lease_labels:?}"))?;
        assert_eq!(
            l.get(partition).map(String::as_str),
            Some("true"),
            "{lease}: {l:?}"
        );
    }

    // Cut-over of agent-x from A to B.
    w.procs[2].stop().await; // agent-x (A releases its Lease)
    w.procs[0].stop().await; // A
    let cut = w.hub.requests().len();
    w.procs[0] = principal(&w.dir, &w.spiffe, "a", port_a, LEGACY, sel_a).await?;
    w.procs[1].stop().await; // B
    w.procs[1] = principal(&w.dir, &w.spiffe, "b", port_b, &format!("{Y},{X}"), sel_b).await?;
    // agent-x is now refused by A...
    let refused = refusal(
        w,
        X,
        port_a,
        argocd_agent_proto::eventstream::AgentMode::Autonomous,
    )
    .await?
    .ok_or("agent-x was admitted by principal A after the cut-over")?;
    assert!(
        refused.contains("maps to hub namespace agent-x"),
        "{refused}"
    );
    // ...and served by B.
    w.procs[2] = agent(&w.dir, &w.spiffe, X, "autonomous", port_b)?;
    connected(&w.procs[1], X, 1).await?;
    connected(&w.procs[1], Y, 1).await?;

    // Its hub copies move to B's partition, and its Applications keep flowing.
    eventually(
        "agent-x's copies relabelled for B",
        Duration::from_secs(30),
        || async {
            let app = stored_app(hub, X, "app-x")?;
            let proj = stored_project(hub, HUB_ARGOCD_NS, "agent-x-proj-x")?;
            let (la, lp) = (labels_of(&app), labels_of(&proj));
            (la.contains_key("partition-b")
                && !la.contains_key("partition-a")
                && lp.contains_key("partition-b")
                && !lp.contains_key("partition-a"))
            .then_some(())
        },
    )
    .await?;
    apps(spoke_x, SPOKE_NS)?
        .patch(
            "app-x",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"path": "moved"}}})),
        )
        .await?;
    apps(spoke_x, SPOKE_NS)?
        .create(&pp, &app_in("app-x2", SPOKE_NS, "proj-x", json!({})))
        .await?;
    eventually(
        "agent-x's changes on the hub through B",
        Duration::from_secs(30),
        || async {
            let app = stored_app(hub, X, "app-x")?;
            (app["spec"]["source"]["path"] == "moved" && stored_app(hub, X, "app-x2").is_some())
                .then_some(())
        },
    )
    .await?;
    // agent-y is still served by B: a hub change reaches its spoke.
    hub_y
        .patch(
            "app-y",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"path": "after-cut"}}})),
        )
        .await?;
    eventually(
        "agent-y's change on its spoke",
        Duration::from_secs(30),
        || async {
            let app = stored_app(spoke_y, SPOKE_NS, "app-y")?;
            (app["spec"]["source"]["path"] == "after-cut").then_some(())
        },
    )
    .await?;

    // After the cut: A wrote none of agent-x's or agent-y's objects; every object both
    // principals ever wrote is one of agent-x's (it moved), and A's writes to it all came
    // before the cut, B's after.
    let all = w.hub.requests();
    let after = &all[cut..];
    let a_after = writes(after, "principal-a");
    assert!(
        a_after.iter().all(|(res, ns, name)| ns != X
            && ns != Y
            && !name.contains(X)
            && !name.contains(Y)
            || res == "leases" && name == "argocd-agent-replica-a"),
        "A wrote after the cut: {a_after:?}"
    );
    let (sa, sb): (BTreeSet<_>, BTreeSet<_>) = (
        writes(&all, "principal-a").into_iter().collect(),
        writes(&all, "principal-b").into_iter().collect(),
    );
    for (res, ns, name) in sa.intersection(&sb) {
        assert!(
            ns == X || name.contains(X),
            "written by both principals, not agent-x's: {res} {ns}/{name}"
        );
        let by = |user: &str| -> Vec<usize> {
            all.iter()
                .enumerate()
                .filter(|(_, r)| {
                    r.user.as_deref() == Some(user)
                        && r.name.as_deref() == Some(name.as_str())
                        && r.resource == *res
                        && matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete")
                })
                .map(|(i, _)| i)
                .collect()
        };
        let (last_a, first_b) = (
            by("principal-a").into_iter().max(),
            by("principal-b").into_iter().min(),
        );
        assert!(
            last_a < first_b,
            "{res} {ns}/{name}: A's last write #{last_a:?} after B's first #{first_b:?}"
        );
    }
    Ok(())
}

/// Why the principal on `port` refused `agent`'s stream; `None` if it admitted it.
async fn refusal(
    w: &World,
    agent: &str,
    port: u16,
    mode: argocd_agent_proto::eventstream::AgentMode,
) -> Result<Option<String>, HarnessError> {
    let source = svid(w, agent).await?;
    let addr = format!("127.0.0.1:{port}").parse()?;
    Ok(open_agent_stream(&source, addr, mode)
        .await
        .err()
        .map(|e| e.to_string()))
}

async fn svid(
    w: &World,
    agent: &str,
) -> Result<argocd_agent_identity::source::SvidSource, HarnessError> {
    let source = argocd_agent_identity::source::SvidSource::workload_api(Some(
        w.spiffe.endpoint(&w.dir.join(format!("{agent}.sock"))),
    ))
    .await?;
    source.wait_ready(Duration::from_secs(30)).await?;
    Ok(source)
}
