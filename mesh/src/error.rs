//! The crate's error type.

use crate::guard::GuardError;
use argocd_agent_identity::text::quoted;

/// Why a mesh-forwarded identity (or a mesh setting) was refused.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// The XFCC value does not parse.
    #[error(transparent)]
    Xfcc(#[from] XfccError),
    /// A custom header rule captured something that is neither a SPIFFE ID nor a valid
    /// agent name (DNS-1123 label).
    #[error("header identity {value} is not a valid agent name: {reason}", value = quoted(.value))]
    InvalidAgentName {
        /// The captured value.
        value: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// The nearest XFCC element names no URI SAN.
    #[error(
        "x-forwarded-client-cert element {element} (added by the nearest proxy) has no URI SAN; the client certificate must carry a SPIFFE ID"
    )]
    XfccNoUri {
        /// Index of the element.
        element: usize,
    },
    /// The nearest XFCC element names several URI SANs.
    #[error(
        "x-forwarded-client-cert element {element} (added by the nearest proxy) has {} URI SANs {uris}; an SVID has exactly one",
        uris.len(), uris = argocd_agent_identity::text::quoted_list(.uris)
    )]
    XfccSeveralUris {
        /// Index of the element.
        element: usize,
        /// The URIs found.
        uris: Vec<String>,
    },
    /// `By` of the nearest element is not the principal's own SPIFFE ID.
    #[error(
        "x-forwarded-client-cert was not added by a proxy holding the principal's identity: By is {found}, expected \"{expected}\"", found = .found.as_ref().map_or_else(|| "absent".to_owned(), |f| quoted(f).to_string())
    )]
    XfccByMismatch {
        /// The configured SPIFFE ID.
        expected: String,
        /// What the element carries.
        found: Option<String>,
    },
    /// A header value that should hold a SPIFFE ID does not.
    #[error("{header}: {value} is not a valid SPIFFE ID: {reason}", value = quoted(.value))]
    InvalidSpiffeId {
        /// The header it came from.
        header: &'static str,
        /// The value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A Linkerd identity that does not have the form
    /// `<sa>.<ns>.serviceaccount.identity.<linkerd-ns>.<trust-domain>`.
    #[error("l5d-client-id: {value} is not a Linkerd workload identity: {reason}", value = quoted(.value))]
    InvalidLinkerdId {
        /// The value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The identity header is absent: the request did not come through an mTLS-verifying
    /// proxy.
    #[error(
        "request has no {header} header; header authentication needs the mesh proxy to forward the client identity"
    )]
    MissingHeader {
        /// The header name.
        header: String,
    },
    /// The identity header appears more than once; which one the proxy wrote is unknowable.
    #[error("request has {count} {header} headers; exactly one is accepted")]
    SeveralHeaderValues {
        /// The header name.
        header: String,
        /// How many there were.
        count: usize,
    },
    /// The identity header is not visible ASCII.
    #[error("{header} header is not visible ASCII text")]
    HeaderNotText {
        /// The header name.
        header: String,
    },
    /// A custom `header:<name>:<regex>` rule did not match or captured nothing.
    #[error(
        "{header} value {value} does not match {regex} (or its first group captured nothing)", value = quoted(.value), regex = quoted(.regex)
    )]
    NoMatch {
        /// The header name.
        header: String,
        /// The header value.
        value: String,
        /// The configured expression.
        regex: String,
    },
    /// An `--auth` value this crate does not understand.
    #[error("invalid --auth {value}: {reason}", value = quoted(.value))]
    InvalidAuth {
        /// The flag value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A listener or peer address the trusted-proxy guard refuses.
    #[error(transparent)]
    Guard(#[from] GuardError),
}

/// Why an XFCC value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XfccError {
    /// The value is longer than [`MAX_XFCC_BYTES`](crate::xfcc::MAX_XFCC_BYTES).
    #[error("x-forwarded-client-cert is {len} bytes, more than the limit of {max}")]
    TooLong {
        /// Length of the value.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More than [`MAX_XFCC_ELEMENTS`](crate::xfcc::MAX_XFCC_ELEMENTS) elements.
    #[error("x-forwarded-client-cert has more than {max} elements")]
    TooManyElements {
        /// The limit.
        max: usize,
    },
    /// More than [`MAX_XFCC_PAIRS`](crate::xfcc::MAX_XFCC_PAIRS) pairs in one element.
    #[error("x-forwarded-client-cert element {element} has more than {max} key=value pairs")]
    TooManyPairs {
        /// Index of the element (0 = first).
        element: usize,
        /// The limit.
        max: usize,
    },
    /// An element (or the whole value) is empty, e.g. `a=b,,c=d` or a trailing `,`.
    #[error("x-forwarded-client-cert element {element} is empty")]
    EmptyElement {
        /// Index of the element.
        element: usize,
    },
    /// A pair has no key, e.g. `=x` or `;;`.
    #[error("x-forwarded-client-cert element {element}: empty key at byte {at}")]
    EmptyKey {
        /// Index of the element.
        element: usize,
        /// Byte offset into the value.
        at: usize,
    },
    /// A pair has no `=`.
    #[error("x-forwarded-client-cert element {element}: key {key} has no '=' (at byte {at})", key = quoted(.key))]
    MissingEquals {
        /// Index of the element.
        element: usize,
        /// The key read so far.
        key: String,
        /// Byte offset into the value.
        at: usize,
    },
    /// A key Envoy never writes.
    #[error(
        "x-forwarded-client-cert element {element}: unknown key {key} (expected By, Hash, Cert, Chain, Subject, URI or DNS)", key = quoted(.key)
    )]
    UnknownKey {
        /// Index of the element.
        element: usize,
        /// The key.
        key: String,
    },
    /// A key other than `URI`/`DNS` appears twice in one element.
    #[error("x-forwarded-client-cert element {element}: key {key} appears more than once", key = quoted(.key))]
    DuplicateKey {
        /// Index of the element.
        element: usize,
        /// The key (canonical spelling).
        key: &'static str,
    },
    /// A quoted value has no closing quote.
    #[error(
        "x-forwarded-client-cert element {element}: unterminated quoted value starting at byte {at}"
    )]
    UnterminatedQuote {
        /// Index of the element.
        element: usize,
        /// Byte offset of the opening quote.
        at: usize,
    },
    /// A character that is not allowed where it appears (a `"` inside an unquoted value,
    /// text after a closing quote, a control character).
    #[error("x-forwarded-client-cert element {element}: unexpected {found} at byte {at}", found = format!("'{}'", .found.escape_debug()))]
    Unexpected {
        /// Index of the element.
        element: usize,
        /// The offending character.
        found: char,
        /// Byte offset into the value.
        at: usize,
    },
}
