//! A hybrid hub: the principal next to the hub's own Argo CD, whose application controller
//! watches the same `argocd` namespace the agents' Applications live in (destination-based
//! mapping). The principal's self-registered cluster Secrets carry Argo CD's
//! `argocd.argoproj.io/skip-reconcile: "true"`, so the hub's controller (the stand-in,
//! modelling Argo CD's rule) reconciles the hub's own Applications and never an agent's,
//! whose status comes only from its spoke.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_testkit::fake_argocd::{self, HubController};
use argocd_agent_testkit::harness::*;
use kube::api::{ListParams, PostParams};
use serde_json::json;

const T: Duration = Duration::from_secs(25);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_own_argo_cd_reconciles_its_applications_and_never_an_agents() {
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
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = hybrid(&topo).await;
    topo.finish(r).await;
}

async fn hybrid(topo: &Topology) -> Result<(), HarnessError> {
    topo.wait_connected(MANAGED, T).await?;
    let clusters = secrets(&topo.hub, HUB_ARGOCD_NS)?;
    eventually(
        "the agent's cluster Secret asks Argo CD to skip it",
        T,
        || async {
            let list = clusters
                .list(&ListParams::default().labels("argocd.argoproj.io/secret-type=cluster"))
                .await
                .ok()?;
            list.items.iter().find(|s| {
                s.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("argocd.argoproj.io/skip-reconcile"))
                    == Some(&"true".to_owned())
            })?;
            Some(())
        },
    )
    .await?;

    let hub = apps(&topo.hub, HUB_ARGOCD_NS)?;
    // The hub's own Application (in-cluster) and an agent's (its destination names the agent).
    hub.create(
        &PostParams::default(),
        &sample_app("hub-local", HUB_ARGOCD_NS, "guestbook"),
    )
    .await?;
    let mut edge = sample_app("edge", HUB_ARGOCD_NS, "guestbook");
    edge.data["spec"]["destination"] = json!({"name": MANAGED, "namespace": "guestbook"});
    hub.create(&PostParams::default(), &edge).await?;

    let reconciled = Arc::new(Mutex::new(BTreeSet::new()));
    let _hub_controller = AbortOnDrop(tokio::spawn(fake_argocd::run_with(
        apps(&topo.hub, HUB_ARGOCD_NS)?,
        Duration::from_millis(300),
        Some(HubController {
            clusters: secrets(&topo.hub, HUB_ARGOCD_NS)?,
            namespace: HUB_ARGOCD_NS.into(),
            reconciled: reconciled.clone(),
            application_namespaces: Vec::new(),
        }),
    )));
    let _spoke_controller = AbortOnDrop(tokio::spawn(fake_argocd::run(
        apps(&topo.managed_spoke, SPOKE_NS)?,
        Duration::from_millis(300),
    )));

    eventually(
        "the hub's own Application is reconciled by the hub's Argo CD",
        T,
        || async {
            stored_app(&topo.hub, HUB_ARGOCD_NS, "hub-local")
                .filter(|a| a["status"]["sync"]["status"] == "Synced")
        },
    )
    .await?;
    eventually(
        "the agent's Application runs on its spoke and its status comes back",
        T,
        || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "edge")?;
            stored_app(&topo.hub, HUB_ARGOCD_NS, "edge")
                .filter(|a| a["status"]["health"]["status"] == "Healthy")
        },
    )
    .await?;
    // A few more passes of the hub's controller.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = reconciled.lock().unwrap().clone();
    if !seen.contains("hub-local") || seen.contains("edge") {
        return Err(format!(
            "the hub's controller reconciled {seen:?}: it must take hub-local and never edge"
        )
        .into());
    }
    Ok(())
}

/// With the default mapping, agents' Applications live in their own hub namespaces: a hub
/// controller whose `--application-namespaces` leaves those out never sees them, while it
/// reconciles the hub's own Applications in its namespace and in the namespaces it lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_controller_limited_by_application_namespaces_never_sees_agent_namespaces() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        create_namespace(&topo.hub, "team-a").await?;
        let pp = PostParams::default();
        apps(&topo.hub, HUB_ARGOCD_NS)?
            .create(&pp, &sample_app("hub-local", HUB_ARGOCD_NS, "guestbook"))
            .await?;
        apps(&topo.hub, "team-a")?
            .create(&pp, &sample_app("team-app", "team-a", "guestbook"))
            .await?;
        // The agent's, in its hub namespace (its destination is the spoke's in-cluster).
        apps(&topo.hub, MANAGED)?
            .create(&pp, &sample_app("edge", MANAGED, "guestbook"))
            .await?;
        let reconciled = Arc::new(Mutex::new(BTreeSet::new()));
        let _hub_controller = AbortOnDrop(tokio::spawn(fake_argocd::run_with(
            apps(&topo.hub, HUB_ARGOCD_NS)?,
            Duration::from_millis(300),
            Some(HubController {
                clusters: secrets(&topo.hub, HUB_ARGOCD_NS)?,
                namespace: HUB_ARGOCD_NS.into(),
                reconciled: reconciled.clone(),
                application_namespaces: vec!["team-*".into()],
            }),
        )));
        let _spoke_controller = AbortOnDrop(tokio::spawn(fake_argocd::run(
            apps(&topo.managed_spoke, SPOKE_NS)?,
            Duration::from_millis(300),
        )));
        for (ns, name) in [(HUB_ARGOCD_NS, "hub-local"), ("team-a", "team-app")] {
            eventually(
                &format!("{ns}/{name} reconciled by the hub's Argo CD"),
                T,
                || async {
                    stored_app(&topo.hub, ns, name)
                        .filter(|a| a["status"]["sync"]["status"] == "Synced")
                },
            )
            .await?;
        }
        eventually(
            "the agent's Application reports its spoke's status",
            T,
            || async {
                stored_app(&topo.hub, MANAGED, "edge")
                    .filter(|a| a["status"]["health"]["status"] == "Healthy")
            },
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let seen = reconciled.lock().unwrap().clone();
        let want: BTreeSet<String> = ["hub-local".to_owned(), "team-a/team-app".to_owned()].into();
        if seen != want {
            return Err(
                format!("the hub's controller reconciled {seen:?}, expected {want:?}").into(),
            );
        }
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
