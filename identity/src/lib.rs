//! Who is talking: SPIFFE IDs, SVID sources with live rotation, rustls configs for the
//! principal and the agent, peer identity from a verified chain, the mapping rules from a
//! SPIFFE ID to an agent and its hub namespace, per-message authorization, JWT-SVIDs, and a
//! development Workload API server.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms, unused_must_use)]

pub mod authz;
pub mod client;
#[cfg(feature = "devserver")]
pub mod devserver;
pub mod id;
pub mod jwt;
pub mod listener;
pub mod mapping;
pub mod names;
pub mod peer;
pub mod source;
pub mod svid;
pub mod tls;
pub mod transport;

pub use authz::{Action, Denied, ObjectRef, Owner, authorize};
pub use client::ClientIdentity;
pub use id::IdError;
pub use id::{SpiffeId, TrustDomain};
pub use mapping::{AgentIdentity, LiveRules, MappingDenied, RuleError, RuleSet};
pub use names::AllowedModes;
pub use names::{AgentMode, AgentName, Namespace, ResourceKind};
pub use source::{SvidSource, inspect};
pub use svid::{SvidState, TrustBundles, X509Svid};
pub use tls::PeerPolicy;
