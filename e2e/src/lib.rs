//! End-to-end support: the Kubernetes API test server and the harness that starts the real
//! binaries, the development Workload API server, Envoy and fault-injecting proxies.
#![forbid(unsafe_code)]

pub mod argocd_schema;
pub mod bench;
pub mod chaos;
pub mod envoy;
pub mod fake_argocd;
pub mod ha;
pub mod harness;
pub mod redis;
