//! The Istio and Linkerd generators produce well-formed Kubernetes objects: every YAML
//! document parses, and each object has the apiVersion, kind and fields its CRD requires.

use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_mesh::{
    AllowedAgents, IstioOptions, LinkerdOptions, istio_objects, linkerd_objects,
};
use serde_json::Value;

fn docs(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(yaml).unwrap_or_else(|e| panic!("output is not YAML: {e}\n{yaml}"))
}

fn find<'a>(docs: &'a [Value], api: &str, kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["apiVersion"] == api && d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {api} {kind} in {docs:#?}"))
}

fn agents() -> AllowedAgents {
    AllowedAgents::Ids(vec![
        SpiffeId::parse("spiffe://edge.example/ns/argocd/sa/agent-1").unwrap(),
        SpiffeId::parse("spiffe://edge.example/agents/agent-2").unwrap(),
    ])
}

#[test]
fn istio_objects_have_required_fields() {
    let yaml = istio_objects(IstioOptions::new(agents()));
    let docs = docs(&yaml);
    assert_eq!(docs.len(), 4, "{yaml}");
    for d in &docs {
        assert_eq!(d["metadata"]["namespace"], "argocd");
        assert_eq!(d["metadata"]["name"], "argocd-agent-principal");
    }
    let selector = serde_json::json!({ "app.kubernetes.io/name": "argocd-agent-principal" });

    let pa = find(&docs, "security.istio.io/v1", "PeerAuthentication");
    assert_eq!(pa["spec"]["mtls"]["mode"], "STRICT");
    assert_eq!(pa["spec"]["selector"]["matchLabels"], selector);

    let sc = find(&docs, "networking.istio.io/v1", "Sidecar");
    assert_eq!(sc["spec"]["workloadSelector"]["labels"], selector);
    assert_eq!(sc["spec"]["ingress"][0]["port"]["number"], 8443);
    assert_eq!(
        sc["spec"]["ingress"][0]["defaultEndpoint"],
        "127.0.0.1:8404"
    );

    let dr = find(&docs, "networking.istio.io/v1", "DestinationRule");
    assert_eq!(
        dr["spec"]["host"],
        "argocd-agent-principal.argocd.svc.cluster.local"
    );
    let pool = &dr["spec"]["trafficPolicy"]["connectionPool"];
    assert_eq!(pool["http"]["h2UpgradePolicy"], "UPGRADE");
    assert_eq!(pool["http"]["idleTimeout"], "24h");

    let ap = find(&docs, "security.istio.io/v1", "AuthorizationPolicy");
    assert_eq!(ap["spec"]["action"], "ALLOW");
    assert_eq!(ap["spec"]["selector"]["matchLabels"], selector);
    let rule = &ap["spec"]["rules"][0];
    assert_eq!(
        rule["from"][0]["source"]["principals"],
        serde_json::json!([
            "edge.example/ns/argocd/sa/agent-1",
            "edge.example/agents/agent-2"
        ])
    );
    assert_eq!(
        rule["to"][0]["operation"]["ports"],
        serde_json::json!(["8443"])
    );
}

#[test]
fn istio_trust_domain_becomes_wildcard_principal() {
    let td = AllowedAgents::TrustDomain(TrustDomain::new("edge.example").unwrap());
    let docs = docs(&istio_objects(IstioOptions::new(td)));
    let ap = find(&docs, "security.istio.io/v1", "AuthorizationPolicy");
    assert_eq!(
        ap["spec"]["rules"][0]["from"][0]["source"]["principals"],
        serde_json::json!(["edge.example/*"])
    );
}

#[test]
fn linkerd_objects_have_required_fields() {
    let yaml = linkerd_objects(LinkerdOptions::new(agents()));
    assert!(yaml.contains("linkerd.io/inject: enabled"), "{yaml}");
    let docs = docs(&yaml);
    assert_eq!(docs.len(), 3, "{yaml}");

    let server = find(&docs, "policy.linkerd.io/v1beta3", "Server");
    assert_eq!(server["spec"]["port"], 8443);
    assert_eq!(server["spec"]["proxyProtocol"], "gRPC");
    assert_eq!(
        server["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "argocd-agent-principal"
    );

    let authn = find(&docs, "policy.linkerd.io/v1alpha1", "MeshTLSAuthentication");
    assert_eq!(
        authn["spec"]["identities"],
        serde_json::json!([
            "agent-1.argocd.serviceaccount.identity.linkerd.edge.example",
            "spiffe://edge.example/agents/agent-2"
        ])
    );

    let authz = find(&docs, "policy.linkerd.io/v1alpha1", "AuthorizationPolicy");
    assert_eq!(authz["spec"]["targetRef"]["kind"], "Server");
    assert_eq!(
        authz["spec"]["targetRef"]["name"],
        server["metadata"]["name"]
    );
    let req = &authz["spec"]["requiredAuthenticationRefs"][0];
    assert_eq!(req["kind"], "MeshTLSAuthentication");
    assert_eq!(req["name"], authn["metadata"]["name"]);
}

#[test]
fn linkerd_trust_domain_becomes_suffix_wildcard() {
    let td = AllowedAgents::TrustDomain(TrustDomain::new("cluster.local").unwrap());
    let docs = docs(&linkerd_objects(LinkerdOptions::new(td)));
    let authn = find(&docs, "policy.linkerd.io/v1alpha1", "MeshTLSAuthentication");
    assert_eq!(
        authn["spec"]["identities"],
        serde_json::json!(["*.serviceaccount.identity.linkerd.cluster.local"])
    );
}
