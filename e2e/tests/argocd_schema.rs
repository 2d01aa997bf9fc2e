//! Every Application and AppProject the sync leaves on the hub and the spokes validates against
//! Argo CD's own CRD schemas, checked by a validator we did not write
//! (`@kubernetes-models/argo-cd`, run with node; `.ci/run` installs it): hub-authored and
//! spoke-authored Applications with status written by the Argo CD stand-in and a sync
//! operation, distributed and renamed AppProjects, in both modes.

use std::time::Duration;

use argocd_agent_testkit::argocd_schema::{self, Invalid};
use argocd_agent_testkit::harness::*;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

const T: Duration = Duration::from_secs(30);

fn project(name: &str, ns: &str, destination: &str) -> kube::api::DynamicObject {
    object(
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"sourceRepos": ["*"], "sourceNamespaces": [destination],
            "destinations": [{"name": destination, "namespace": "*", "server": "*"}],
            "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_synced_argo_cd_object_validates_against_argo_cds_schemas() {
    // The validator itself refuses what Argo CD's schema refuses (a control).
    let bad = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "bad", "namespace": "argocd"},
        "spec": {"project": "default", "destination": "not-an-object",
            "source": {"repoURL": "https://example.com/r.git"}}});
    let refused = argocd_schema::validate(&[bad])
        .await
        .expect("the validator runs");
    assert_eq!(refused.len(), 1, "the control object must be refused");

    let topo = Topology::start(TopologyOptions::default()).await.unwrap();
    let r = async {
        topo.wait_connected(MANAGED, T).await?;
        topo.wait_connected(AUTONOMOUS, T).await?;
        // The Argo CD stand-in on both spokes writes status and completes operations.
        let sims = [
            tokio::spawn(argocd_agent_testkit::fake_argocd::run(
                apps(&topo.managed_spoke, SPOKE_NS)?,
                Duration::from_millis(300),
            )),
            tokio::spawn(argocd_agent_testkit::fake_argocd::run(
                apps(&topo.autonomous_spoke, SPOKE_NS)?,
                Duration::from_millis(300),
            )),
        ];
        let pp = PostParams::default();
        projects(&topo.hub, HUB_ARGOCD_NS)?
            .create(&pp, &project("team-a", HUB_ARGOCD_NS, MANAGED))
            .await?;
        projects(&topo.autonomous_spoke, SPOKE_NS)?
            .create(&pp, &project("edge", SPOKE_NS, "in-cluster"))
            .await?;
        let mut hub_app = sample_app("guestbook", MANAGED, "guestbook");
        hub_app.data["spec"]["project"] = json!("team-a");
        apps(&topo.hub, MANAGED)?.create(&pp, &hub_app).await?;
        apps(&topo.autonomous_spoke, SPOKE_NS)?
            .create(&pp, &sample_app("edge-guestbook", SPOKE_NS, "guestbook"))
            .await?;
        // A sync requested on the hub for the managed Application.
        eventually("guestbook on the managed spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
        })
        .await?;
        apps(&topo.hub, MANAGED)?
            .patch(
                "guestbook",
                &PatchParams::default(),
                &Patch::Merge(json!({"operation": {"sync": {"revision": "HEAD"},
                    "initiatedBy": {"username": "admin"}}})),
            )
            .await?;
        eventually("status on the hub (managed)", T, || async {
            stored_app(&topo.hub, MANAGED, "guestbook")
                .filter(|a| a["status"]["sync"]["status"] == "Synced")
                .filter(|a| a["status"]["operationState"]["phase"] == "Succeeded")
        })
        .await?;
        eventually("the autonomous app with status on the hub", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "edge-guestbook")
                .filter(|a| a["status"]["sync"]["status"] == "Synced")
        })
        .await?;
        eventually("project edge on the hub", T, || async {
            stored_project(&topo.hub, HUB_ARGOCD_NS, &format!("{AUTONOMOUS}-edge"))
        })
        .await?;
        eventually("project team-a on the managed spoke", T, || async {
            stored_project(&topo.managed_spoke, SPOKE_NS, "team-a")
        })
        .await?;
        for s in sims {
            s.abort();
        }

        let mut checked = 0;
        let mut invalid: Vec<(&str, Invalid)> = Vec::new();
        for (side, server) in [
            ("hub", &topo.hub),
            ("managed spoke", &topo.managed_spoke),
            ("autonomous spoke", &topo.autonomous_spoke),
        ] {
            let objects = argocd_schema::argocd_objects(server).await?;
            checked += objects.len();
            invalid.extend(
                argocd_schema::validate(&objects)
                    .await?
                    .into_iter()
                    .map(|i| (side, i)),
            );
        }
        assert!(
            invalid.is_empty(),
            "objects Argo CD's schema refuses: {invalid:#?}"
        );
        // guestbook and edge-guestbook on both sides, team-a on hub and spoke, edge on its
        // spoke and renamed on the hub.
        assert!(checked >= 8, "only {checked} objects checked");
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
