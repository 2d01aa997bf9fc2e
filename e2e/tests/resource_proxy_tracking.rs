//! The resource proxy follows the spoke Argo CD's tracking settings (argocd-cm:
//! `application.resourceTrackingMethod`, `application.instanceLabelKey`, `installationID`)
//! as Argo CD's own controller reads them: the real principal and a real managed agent,
//! kubectl with the kubeconfig from the agent's cluster secret.

use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::json;

const T: Duration = Duration::from_secs(30);
const NS: &str = "guestbook";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_resource_proxy_reads_objects_as_the_spokes_argo_cd_tracks_them() {
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        principal_args: vec![
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{port}"),
            "--enable-self-cluster-registration".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    topo.wait_connected(MANAGED, T).await.unwrap();
    let spoke = &topo.managed_spoke;
    // The spoke's Argo CD: annotation tracking of installation "edge", a custom label key.
    configmaps(spoke, SPOKE_NS)
        .unwrap()
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "argocd-cm", "namespace": SPOKE_NS},
                "data": {"application.resourceTrackingMethod": "annotation+label",
                    "application.instanceLabelKey": "example.com/app",
                    "installationID": "edge"}})),
        )
        .await
        .unwrap();
    apps(&topo.hub, MANAGED)
        .unwrap()
        .create(&PostParams::default(), &sample_app("web", MANAGED, NS))
        .await
        .unwrap();
    eventually("the Application on the spoke", T, || async {
        stored_app(spoke, SPOKE_NS, "web")
    })
    .await
    .unwrap();
    create_namespace(spoke, NS).await.unwrap();
    let tracked = |name: &str, id: &str, installation: Option<&str>| {
        let mut annotations = json!({"argocd.argoproj.io/tracking-id": id});
        if let Some(i) = installation {
            annotations["argocd.argoproj.io/installation-id"] = json!(i);
        }
        object(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations,
                "labels": {"example.com/app": "web"}}}))
    };
    let cms = core_api(spoke, NS, "configmaps", "ConfigMap");
    let pp = PostParams::default();
    // Tracked by this installation, naming itself.
    cms.create(
        &pp,
        &tracked(
            "web-config",
            &format!("web:/ConfigMap:{NS}/web-config"),
            Some("edge"),
        ),
    )
    .await
    .unwrap();
    // Another installation's object, a copied annotation, and a label alone.
    cms.create(
        &pp,
        &tracked(
            "other-install",
            &format!("web:/ConfigMap:{NS}/other-install"),
            Some("hub"),
        ),
    )
    .await
    .unwrap();
    cms.create(
        &pp,
        &tracked(
            "copied",
            &format!("web:/ConfigMap:{NS}/web-config"),
            Some("edge"),
        ),
    )
    .await
    .unwrap();
    cms.create(
        &pp,
        &object(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "label-only", "namespace": NS,
                "labels": {"example.com/app": "web", "app.kubernetes.io/instance": "web"}}})),
    )
    .await
    .unwrap();

    eventually("the cluster secret", T, || async {
        stored_secret(&topo.hub, HUB_ARGOCD_NS, &format!("cluster-{MANAGED}"))
    })
    .await
    .unwrap();
    let kc = agent_kubeconfig(&topo.dir, MANAGED).await;
    let o = run_kubectl(&kc, &["get", "configmap", "web-config", "-n", NS]).await;
    assert!(
        o.status.success(),
        "tracked by this installation: {}",
        output_text(&o)
    );
    for name in ["other-install", "copied", "label-only"] {
        let o = run_kubectl(&kc, &["get", "configmap", name, "-n", NS]).await;
        assert!(
            !o.status.success(),
            "{name} must be refused: {}",
            output_text(&o)
        );
        assert!(
            output_text(&o).to_lowercase().contains("forbidden"),
            "{name}: {}",
            output_text(&o)
        );
    }
    let o = run_kubectl(&kc, &["get", "configmaps", "-n", NS, "-o", "name"]).await;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "configmap/web-config",
        "{}",
        output_text(&o)
    );
    topo.stop().await;
}
