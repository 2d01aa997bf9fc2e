//! Agents' Argo CD cluster secrets against the Kubernetes API test server: created once,
//! current while valid, renewed before the token expires and when the CA data changes, and
//! someone else's secret for the agent left alone.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use argocd_agent_domain::AgentName;
use argocd_agent_kubernetes::{Kind, Resources};
use argocd_agent_principal::clustersecret::{ClusterSecrets, Ensured};
use argocd_agent_principal::partition::Partition;
use argocd_agent_principal::resourceproxy::ResourceProxyConfig;
use argocd_agent_principal::resourceproxy::credentials::ProxyKeys;
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::Value;

mod common;
use common::setup;

fn config_of(s: &Secret) -> Value {
    serde_json::from_slice(&s.data.as_ref().unwrap()["config"].0).unwrap()
}

#[tokio::test]
async fn cluster_secrets_are_created_renewed_and_others_left_alone() {
    let (server, client) = setup().await;
    let keys = Arc::new(
        ProxyKeys::load_or_create(&Resources::new(client.clone(), Kind::Secret), "argocd")
            .await
            .unwrap(),
    );
    // The keys survive a restart: a second load reads the same Secret.
    let again = ProxyKeys::load_or_create(&Resources::new(client.clone(), Kind::Secret), "argocd")
        .await
        .unwrap();
    assert_eq!(again.ca_pem(), keys.ca_pem());
    let mut config = ResourceProxyConfig::new(
        "127.0.0.1:9090".parse().unwrap(),
        "https://proxy.argocd.svc:9090".into(),
    );
    config.token_ttl = Duration::from_secs(3);
    let (ca_tx, ca_rx) = tokio::sync::watch::channel(keys.ca_pem().to_owned());
    let secrets = ClusterSecrets::new(
        Arc::new(Resources::new(client.clone(), Kind::Secret)),
        "argocd",
        keys.clone(),
        config,
        ca_rx,
        Arc::new(Partition::whole_hub()),
    );
    let agent = AgentName::new("edge-1").unwrap();
    let api: Api<Secret> = Api::namespaced(client.clone(), "argocd");

    assert_eq!(secrets.ensure(&agent).await.unwrap(), Ensured::Created);
    let s = api.get("cluster-edge-1").await.unwrap();
    let labels = s.metadata.labels.clone().unwrap();
    assert_eq!(labels["argocd.argoproj.io/secret-type"], "cluster");
    assert_eq!(labels["argocd-agent.argoproj-labs.io/agent-name"], "edge-1");
    let data = s.data.clone().unwrap();
    assert_eq!(
        String::from_utf8(data["server"].0.clone()).unwrap(),
        "https://proxy.argocd.svc:9090/agents/edge-1"
    );
    let c = config_of(&s);
    let token = c["bearerToken"].as_str().unwrap().to_owned();
    assert_eq!(keys.verify(&token, SystemTime::now()).unwrap(), agent);
    let ca = base64::engine::general_purpose::STANDARD
        .decode(c["tlsClientConfig"]["caData"].as_str().unwrap())
        .unwrap();
    assert_eq!(String::from_utf8(ca).unwrap(), keys.ca_pem());

    // Current while the token is young.
    assert_eq!(secrets.ensure(&agent).await.unwrap(), Ensured::Current);
    // Renewed in the last third of the token's life (3 s: after 2 s).
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(secrets.ensure(&agent).await.unwrap(), Ensured::Renewed);
    let renewed = config_of(&api.get("cluster-edge-1").await.unwrap());
    assert_ne!(renewed["bearerToken"], c["bearerToken"]);
    assert_eq!(secrets.ensure(&agent).await.unwrap(), Ensured::Current);
    // The CA data follows the serving certificate's CA.
    ca_tx.send_replace("-----BEGIN CERTIFICATE-----\nrotated\n-----END CERTIFICATE-----\n".into());
    assert_eq!(secrets.ensure(&agent).await.unwrap(), Ensured::Renewed);
    let rotated = config_of(&api.get("cluster-edge-1").await.unwrap());
    let ca = base64::engine::general_purpose::STANDARD
        .decode(rotated["tlsClientConfig"]["caData"].as_str().unwrap())
        .unwrap();
    assert!(String::from_utf8(ca).unwrap().contains("rotated"));

    // Known secrets cost a reconnect no API call; one pass lists once and renews only
    // what is stale; a deleted secret is forgotten and made again on the next connect.
    secrets.ensure_logged(&agent).await;
    server.clear_requests();
    secrets.ensure_logged(&agent).await;
    assert!(server.requests().is_empty(), "{:?}", server.requests());
    tokio::time::sleep(Duration::from_millis(2100)).await;
    secrets.pass().await;
    let verbs: Vec<String> = server.requests().iter().map(|r| r.verb.clone()).collect();
    assert_eq!(verbs, ["list", "update"], "one list, one renewal");
    api.delete("cluster-edge-1", &Default::default())
        .await
        .unwrap();
    secrets.pass().await;
    secrets.ensure_logged(&agent).await;
    assert!(api.get_opt("cluster-edge-1").await.unwrap().is_some());

    // A secret someone else made for an agent wins.
    let other = AgentName::new("edge-2").unwrap();
    let manual = Secret {
        metadata: ObjectMeta {
            name: Some("my-edge-2".into()),
            labels: Some(
                [
                    (
                        "argocd.argoproj.io/secret-type".to_string(),
                        "cluster".to_string(),
                    ),
                    (
                        "argocd-agent.argoproj-labs.io/agent-name".to_string(),
                        "edge-2".to_string(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        },
        string_data: Some([("server".to_string(), "https://elsewhere".to_string())].into()),
        ..Default::default()
    };
    api.create(&PostParams::default(), &manual).await.unwrap();
    assert_eq!(secrets.ensure(&other).await.unwrap(), Ensured::LeftAlone);
    assert!(api.get_opt("cluster-edge-2").await.unwrap().is_none());
    let kept = api.get("my-edge-2").await.unwrap();
    assert_eq!(kept.data.unwrap()["server"].0, b"https://elsewhere");
}

/// Two principals on one hub, partitioned by label: each keeps only its own agents'
/// secrets, and an agent that moves takes its secret to the principal it now connects to.
#[tokio::test]
async fn partitioned_principals_keep_only_their_own_agents_secrets() {
    let (server, client) = setup().await;
    let keys = Arc::new(
        ProxyKeys::load_or_create(&Resources::new(client.clone(), Kind::Secret), "argocd")
            .await
            .unwrap(),
    );
    let principal = |url: &str, selector: &str| {
        let mut config = ResourceProxyConfig::new("127.0.0.1:9090".parse().unwrap(), url.into());
        config.token_ttl = Duration::from_secs(3);
        // The CA never changes here: the receiver keeps the value after its sender goes.
        let (_, ca_rx) = tokio::sync::watch::channel(keys.ca_pem().to_owned());
        let partition = Partition::new(&[], Some(selector), "argocd", false).unwrap();
        ClusterSecrets::new(
            Arc::new(Resources::new(client.clone(), Kind::Secret)),
            "argocd",
            keys.clone(),
            config,
            ca_rx,
            Arc::new(partition),
        )
    };
    let a = principal("https://a.example", "partition-a=true");
    let b = principal("https://b.example", "partition-b=true");
    let api: Api<Secret> = Api::namespaced(client.clone(), "argocd");
    let (x, y) = (AgentName::new("x").unwrap(), AgentName::new("y").unwrap());
    assert_eq!(a.ensure(&x).await.unwrap(), Ensured::Created);
    assert_eq!(b.ensure(&y).await.unwrap(), Ensured::Created);
    let labels = |name: &str| {
        let api = api.clone();
        let name = name.to_owned();
        async move { api.get(&name).await.unwrap().metadata.labels.unwrap() }
    };
    assert_eq!(labels("cluster-x").await["partition-a"], "true");
    assert_eq!(labels("cluster-y").await["partition-b"], "true");

    // Both stale: each pass renews its own, and never the other principal's.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    server.clear_requests();
    a.pass().await;
    let updates: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.verb == "update")
        .filter_map(|r| r.name.clone())
        .collect();
    assert_eq!(updates, ["cluster-x"]);
    let server_of = |name: &str| {
        let api = api.clone();
        let name = name.to_owned();
        async move {
            let s = api.get(&name).await.unwrap();
            String::from_utf8(s.data.unwrap()["server"].0.clone()).unwrap()
        }
    };
    assert_eq!(server_of("cluster-y").await, "https://b.example/agents/y");

    // x moves to B: B takes its secret over (its URL, its labels); A's passes no longer
    // see it.
    assert_eq!(b.ensure(&x).await.unwrap(), Ensured::Renewed);
    assert_eq!(server_of("cluster-x").await, "https://b.example/agents/x");
    let moved = labels("cluster-x").await;
    assert_eq!(moved.get("partition-b").map(String::as_str), Some("true"));
    assert!(!moved.contains_key("partition-a"), "{moved:?}");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    server.clear_requests();
    a.pass().await;
    assert!(
        server.requests().iter().all(|r| r.verb != "update"),
        "{:?}",
        server.requests()
    );
    assert_eq!(server_of("cluster-x").await, "https://b.example/agents/x");
}
