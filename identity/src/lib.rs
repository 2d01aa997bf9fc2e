//! Who is talking, in SPIFFE's terms only: SPIFFE IDs and trust domains, X.509-SVID sources
//! with live rotation, rustls configs for the principal and the agent, the peer's SPIFFE ID
//! from a verified chain, JWT-SVIDs, and the TLS handshake of the authenticated listeners (run
//! by the listener crate's accept loop, which bounds every connection). What an identity may
//! do in Argo CD (agent names, mapping rules, authorization) is the domain crate's.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// Functions under 80 lines (the threshold is in clippy.toml); unit tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
#![deny(rust_2018_idioms, unused_must_use)]

pub mod id;
pub mod jwt;
pub mod peer;
pub mod source;
pub mod svid;
pub mod text;
pub mod tls;
pub mod transport;
pub mod websocket;

pub use id::IdError;
pub use id::{SpiffeId, TrustDomain};
pub use source::{SvidSource, inspect};
pub use svid::{SvidState, TrustBundles, X509Svid};
pub use tls::PeerPolicy;

pub use text::{error_chain, quoted, quoted_list, rfc3339};
