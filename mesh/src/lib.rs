//! Identities forwarded by a service mesh, and the configuration that makes them safe to
//! believe.
//!
//! - [`xfcc`]: Envoy/Istio `x-forwarded-client-cert`, strictly parsed; the identity comes
//!   from the element added by the nearest proxy.
//! - [`linkerd`]: Linkerd `l5d-client-id`, mapped onto `spiffe://<td>/ns/<ns>/sa/<sa>`.
//! - [`header`]: the `--auth header:...` presets and the refusal of identity headers on
//!   the mTLS listener.
//! - [`guard`]: header identities only on loopback/Unix listeners and from trusted peers.
//! - [`generate`]: Envoy bootstrap, Istio and Linkerd objects for the principal.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms, unused_must_use, missing_docs)]

mod error;
pub mod generate;
pub mod guard;
pub mod header;
pub mod linkerd;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod xfcc;

pub use error::MeshError;
pub use generate::AllowedAgents;
pub use generate::envoy::{EnvoyOptions, EnvoyTls, envoy_principal_config};
pub use generate::istio::{IstioOptions, istio_objects};
pub use generate::linkerd::{LinkerdOptions, linkerd_objects};
pub use guard::{
    GuardError, GuardWarning, HeaderListenerPolicy, ListenAddr, check_listen_addr, check_peer,
};
pub use header::{HeaderAuth, IDENTITY_HEADERS};
pub use linkerd::LinkerdId;
pub use xfcc::{XfccElement, XfccError, parse_xfcc};
