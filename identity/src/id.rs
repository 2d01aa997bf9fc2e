//! SPIFFE ID and trust domain types (placeholder signatures; the real rules are being written).

/// A trust domain name, e.g. `example.org`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrustDomain(String);

/// A SPIFFE ID, e.g. `spiffe://example.org/ns/argocd/sa/agent`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    uri: String,
    trust_domain: TrustDomain,
}
