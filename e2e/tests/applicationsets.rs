//! ApplicationSets, end to end with the real binaries and the ApplicationSet controller
//! stand-in (`testkit/src/fake_appset.rs`), whose generated Applications are what we sync.
//!
//! Managed, on the hub with destination-based mapping: a cluster generator over the cluster
//! Secrets the principal registers for its agents, and a list generator, produce
//! Applications that reach the agent their `destination.name` names; a template change
//! reaches the spokes; an element moving between agents moves its Application; an element
//! removed deletes it on its spoke; deleting the ApplicationSet deletes everything it
//! generated. Autonomous: an ApplicationSet on the spoke generates Applications that reach
//! the hub copy namespace, and pruned ones leave it. ApplicationSets themselves are never
//! synced either way.

use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(25);

fn appset(
    name: &str,
    ns: &str,
    generators: Value,
    app_name: &str,
    destination: &str,
) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "generators": generators,
            "template": {
                "metadata": {"name": app_name},
                "spec": {
                    "project": "default",
                    "source": {
                        "repoURL": "https://github.com/argoproj/argocd-example-apps",
                        "path": "guestbook",
                        "targetRevision": "HEAD"
                    },
                    "destination": {"name": destination, "namespace": "guestbook"}
                }
            }
        }
    }))
    .unwrap()
}

fn revision(app: &Value) -> &str {
    app["spec"]["source"]["targetRevision"]
        .as_str()
        .unwrap_or_default()
}

async fn no_appsets(
    server: &argocd_agent_kube_test_server::KubeTestServer,
    ns: &str,
) -> Result<(), HarnessError> {
    let n = appsets(server, ns)?
        .list(&ListParams::default())
        .await?
        .items
        .len();
    if n != 0 {
        return Err(format!("{n} ApplicationSets were copied to namespace {ns}").into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_applicationsets_generate_applications_for_the_agents_their_destinations_name() {
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let mapping = || "--destination-based-mapping".to_string();
    let topo = Topology::start(TopologyOptions {
        principal_args: vec![
            mapping(),
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{port}"),
            "--enable-self-cluster-registration".into(),
        ],
        agent_args: vec![mapping()],
        second_agent_mode: Some("managed"),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = managed(&topo).await;
    topo.finish(r).await;
}

async fn managed(topo: &Topology) -> Result<(), HarnessError> {
    let ns = HUB_ARGOCD_NS;
    let (first, second) = (&topo.managed_spoke, &topo.autonomous_spoke);
    topo.wait_connected(MANAGED, T).await?;
    topo.wait_connected(AUTONOMOUS, T).await?;
    let clusters = secrets(&topo.hub, ns)?;
    eventually(
        "the principal registered both agents' cluster Secrets",
        T,
        || async {
            let list = clusters
                .list(&ListParams::default().labels("argocd.argoproj.io/secret-type=cluster"))
                .await
                .ok()?;
            (list.items.len() == 2).then_some(())
        },
    )
    .await?;
    let sets = appsets(&topo.hub, ns)?;
    let hub_apps = apps(&topo.hub, ns)?;
    let _controller = AbortOnDrop(tokio::spawn(argocd_agent_testkit::fake_appset::run(
        appsets(&topo.hub, ns)?,
        apps(&topo.hub, ns)?,
        secrets(&topo.hub, ns)?,
        Duration::from_millis(300),
    )));

    // A cluster generator over the agents' cluster Secrets: one Application per agent.
    sets.create(
        &PostParams::default(),
        &appset(
            "guestbooks",
            ns,
            json!([{"clusters": {}}]),
            "guestbook-{{name}}",
            "{{name}}",
        ),
    )
    .await?;
    for (spoke, agent) in [(first, MANAGED), (second, AUTONOMOUS)] {
        let name = format!("guestbook-{agent}");
        eventually(
            "a generated Application reaches the agent it names",
            T,
            || async { stored_app(spoke, SPOKE_NS, &name) },
        )
        .await?;
        let on_hub = stored_app(&topo.hub, ns, &name).ok_or("hub Application gone")?;
        if on_hub["metadata"]["ownerReferences"][0]["kind"] != "ApplicationSet" {
            return Err(format!("not owned by its ApplicationSet: {on_hub}").into());
        }
    }
    if stored_app(first, SPOKE_NS, &format!("guestbook-{AUTONOMOUS}")).is_some() {
        return Err("an Application reached an agent its destination does not name".into());
    }

    // A template change reaches both spokes.
    merge_patch(
        &sets,
        "guestbooks",
        json!({"spec": {"template": {"spec": {"source": {"targetRevision": "v2"}}}}}),
    )
    .await?;
    for (spoke, agent) in [(first, MANAGED), (second, AUTONOMOUS)] {
        let name = format!("guestbook-{agent}");
        eventually("the template change reaches the spoke", T, || async {
            stored_app(spoke, SPOKE_NS, &name).filter(|a| revision(a) == "v2")
        })
        .await?;
    }

    // A list generator; its element moves from one agent to the other.
    let element =
        |cluster: &str| json!([{"list": {"elements": [{"app": "web", "cluster": cluster}]}}]);
    sets.create(
        &PostParams::default(),
        &appset("pinned", ns, element(MANAGED), "{{app}}", "{{cluster}}"),
    )
    .await?;
    eventually(
        "the list element's Application reaches its agent",
        T,
        || async { stored_app(first, SPOKE_NS, "web") },
    )
    .await?;
    merge_patch(
        &sets,
        "pinned",
        json!({"spec": {"generators": element(AUTONOMOUS)}}),
    )
    .await?;
    eventually(
        "the element moved: deleted on one agent, created on the other",
        T,
        || async {
            (stored_app(first, SPOKE_NS, "web").is_none()
                && stored_app(second, SPOKE_NS, "web").is_some())
            .then_some(())
        },
    )
    .await?;

    // Regenerated without the element: pruned on the hub and on its spoke.
    merge_patch(
        &sets,
        "pinned",
        json!({"spec": {"generators": [{"list": {"elements": [{"app": "api", "cluster": MANAGED}]}}]}}),
    )
    .await?;
    eventually(
        "the new element created, the removed one pruned",
        T,
        || async {
            (stored_app(first, SPOKE_NS, "api").is_some()
                && stored_app(second, SPOKE_NS, "web").is_none()
                && stored_app(&topo.hub, ns, "web").is_none())
            .then_some(())
        },
    )
    .await?;

    // Deleting an ApplicationSet deletes what it generated, everywhere.
    sets.delete("guestbooks", &DeleteParams::default()).await?;
    eventually(
        "the deleted set's Applications are gone from hub and spokes",
        T,
        || async {
            let gone = [(first, MANAGED), (second, AUTONOMOUS)]
                .iter()
                .all(|(spoke, agent)| {
                    let name = format!("guestbook-{agent}");
                    stored_app(spoke, SPOKE_NS, &name).is_none()
                        && stored_app(&topo.hub, ns, &name).is_none()
                });
            gone.then_some(())
        },
    )
    .await?;
    if stored_app(first, SPOKE_NS, "api").is_none() || hub_apps.get_opt("api").await?.is_none() {
        return Err("the other set's Application went too".into());
    }
    no_appsets(first, SPOKE_NS).await?;
    no_appsets(second, SPOKE_NS).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autonomous_spoke_applicationsets_generated_applications_reach_the_hub() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![AUTONOMOUS]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = autonomous(&topo).await;
    topo.finish(r).await;
}

async fn autonomous(topo: &Topology) -> Result<(), HarnessError> {
    topo.wait_connected(AUTONOMOUS, T).await?;
    let spoke = &topo.autonomous_spoke;
    let sets = appsets(spoke, SPOKE_NS)?;
    let _controller = AbortOnDrop(tokio::spawn(argocd_agent_testkit::fake_appset::run(
        appsets(spoke, SPOKE_NS)?,
        apps(spoke, SPOKE_NS)?,
        secrets(spoke, SPOKE_NS)?,
        Duration::from_millis(300),
    )));
    let elements = |apps: &[&str]| {
        let e: Vec<Value> = apps.iter().map(|a| json!({"app": a})).collect();
        json!([{"list": {"elements": e}}])
    };
    sets.create(
        &PostParams::default(),
        &appset(
            "local",
            SPOKE_NS,
            elements(&["web", "api"]),
            "{{app}}",
            "in-cluster",
        ),
    )
    .await?;
    for name in ["web", "api"] {
        let copy = eventually("a generated Application reaches the hub", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, name)
        })
        .await?;
        if !copy["metadata"]["ownerReferences"].is_null() {
            return Err(format!("the hub copy holds the spoke's owner references: {copy}").into());
        }
    }
    merge_patch(
        &sets,
        "local",
        json!({"spec": {"generators": elements(&["web"])}}),
    )
    .await?;
    eventually("a pruned Application leaves the hub", T, || async {
        (stored_app(&topo.hub, AUTONOMOUS, "api").is_none()
            && stored_app(&topo.hub, AUTONOMOUS, "web").is_some())
        .then_some(())
    })
    .await?;
    no_appsets(&topo.hub, AUTONOMOUS).await?;
    Ok(())
}
