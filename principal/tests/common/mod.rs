//! Shared by the principal's integration tests: a Kubernetes API test server with the
//! `argocd` namespace, and a client of it.

use argocd_agent_kube_test_server::KubeTestServer;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};

/// A test server with namespace `argocd`, and a client authenticated as `principal`.
pub async fn setup() -> (KubeTestServer, kube::Client) {
    let server = KubeTestServer::start().await.unwrap();
    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.headers.push((
        http::header::AUTHORIZATION,
        format!("Bearer {}", server.token_for("principal"))
            .parse()
            .unwrap(),
    ));
    config.root_cert = server.ca_certificate_der().map(|der| vec![der]);
    let client = kube::Client::try_from(config).unwrap();
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("argocd".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    (server, client)
}
