//! The test kit: what the end-to-end suites, the load generator and the local demo use to run
//! the real binaries, and the stand-ins they run them against. The Kubernetes API test server
//! is its own crate (`argocd-agent-kube-test-server`). Nothing here is linked into the
//! shipped `argocd-agent` or `argocd-agentctl`.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod app_of_apps;
pub mod argocd_schema;
pub mod envoy;
pub mod fake_appset;
pub mod fake_argocd;
pub mod fake_notifications;
pub mod ha;
pub mod harness;
pub mod redis;
pub mod workload_api;
