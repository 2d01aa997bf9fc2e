//! Identity headers a mesh sidecar forwards, parsed once per agent stream (and per request
//! on the admin API): Envoy's `x-forwarded-client-cert` with one element as a sidecar writes
//! it (with and without the URL-encoded client certificate), three elements with quoted
//! subjects as after a chain of proxies, and Linkerd's `l5d-client-id`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rcgen::{CertificateParams, KeyPair, SanType};

use argocd_agent_identity::SpiffeId;
use argocd_agent_mesh::LinkerdId;
use argocd_agent_mesh::xfcc::{identity_from_xfcc, parse_xfcc};

const PRINCIPAL: &str = "spiffe://hub.example/ns/argocd/sa/argocd-agent-principal";
const AGENT: &str = "spiffe://edge.example/ns/argocd/sa/agent-edge-7";
const HASH: &str = "468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688";

/// The agent's SVID as PEM, URL-encoded as Envoy writes it into `Cert=`.
fn encoded_agent_cert() -> String {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![
        SanType::URI(AGENT.try_into().unwrap()),
        SanType::DnsName("agent-edge-7.argocd.svc".try_into().unwrap()),
    ];
    let cert = params.self_signed(&KeyPair::generate().unwrap()).unwrap();
    let mut out = String::new();
    for b in cert.pem().bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn one_element() -> String {
    format!("By={PRINCIPAL};Hash={HASH};URI={AGENT};DNS=agent-edge-7.argocd.svc")
}

fn one_element_with_cert() -> String {
    let cert = encoded_agent_cert();
    format!("By={PRINCIPAL};Hash={HASH};Cert=\"{cert}\";URI={AGENT};DNS=agent-edge-7.argocd.svc")
}

/// Three proxies: an edge gateway, an internal gateway, then the principal's sidecar.
fn three_elements() -> String {
    [
        format!(
            "By=spiffe://hub.example/ns/ingress/sa/edge-gateway;Hash={HASH};Subject=\"CN=agent-edge-7,OU=edge\\, west,O=Example Inc.,C=DE\";URI={AGENT};DNS=agent-edge-7.argocd.svc"
        ),
        format!(
            "By=spiffe://hub.example/ns/ingress/sa/internal-gateway;Hash={HASH};Subject=\"CN=edge-gateway,O=Example Inc.\";URI=spiffe://hub.example/ns/ingress/sa/edge-gateway"
        ),
        format!(
            "By={PRINCIPAL};Hash={HASH};Subject=\"CN=internal-gateway,O=Example Inc.\";URI={AGENT};DNS=\"internal-gateway.ingress.svc;port=8443\""
        ),
    ]
    .join(",")
}

fn xfcc(c: &mut Criterion) {
    let mut g = c.benchmark_group("xfcc");
    let cases = [
        ("parse/one_element", one_element(), 1),
        ("parse/one_element_with_cert", one_element_with_cert(), 1),
        ("parse/three_elements_quoted", three_elements(), 3),
    ];
    for (name, value, elements) in &cases {
        assert_eq!(parse_xfcc(value).unwrap().len(), *elements, "{name}");
        g.throughput(Throughput::Bytes(value.len() as u64));
        g.bench_function(*name, |b| b.iter(|| parse_xfcc(black_box(value)).unwrap()));
    }

    // What the principal does per stream: parse, check `By`, take the nearest element's URI.
    let principal = SpiffeId::parse(PRINCIPAL).unwrap();
    let value = three_elements();
    assert_eq!(
        identity_from_xfcc(&value, Some(&principal))
            .unwrap()
            .as_str(),
        AGENT
    );
    g.throughput(Throughput::Bytes(value.len() as u64));
    g.bench_function("identity/three_elements_quoted", |b| {
        b.iter(|| identity_from_xfcc(black_box(&value), Some(&principal)).unwrap())
    });
    g.finish();

    let mut g = c.benchmark_group("linkerd");
    let value = "agent-edge-7.argocd.serviceaccount.identity.linkerd.cluster.local";
    g.throughput(Throughput::Bytes(value.len() as u64));
    g.bench_function("parse/l5d_client_id", |b| {
        b.iter(|| LinkerdId::parse(black_box(value)).unwrap())
    });
    g.bench_function("to_spiffe_id/l5d_client_id", |b| {
        b.iter(|| {
            LinkerdId::parse(black_box(value))
                .unwrap()
                .to_spiffe_id()
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, xfcc);
criterion_main!(benches);
