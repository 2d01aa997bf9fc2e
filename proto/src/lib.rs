//! Wire types for argocd-agent: the CloudEvents 1.0 protobuf envelope, the agent <->
//! principal event stream, the version service, the principal's admin API, and the SPIFFE Workload API (vendored so the
//! development Workload API server can implement it).
//!
//! The generated code under `src/gen/` is committed; `tests/generated_code.rs` keeps it in
//! step with `proto/*.proto`.
#![forbid(unsafe_code)]

pub mod codec;

pub mod admin {
    #![allow(clippy::all)]
    include!("gen/argocdagent.admin.v1.rs");
}

pub mod cloudevents {
    #![allow(clippy::all)]
    include!("gen/io.cloudevents.v1.rs");
}

pub mod eventstream {
    #![allow(clippy::all)]
    include!("gen/argocdagent.eventstream.v1.rs");
}

pub mod version {
    #![allow(clippy::all)]
    include!("gen/argocdagent.version.v1.rs");
}

/// SPIFFE Workload API (`workload.proto` has no package: RPC paths are `/SpiffeWorkloadAPI/...`).
pub mod workload {
    #![allow(clippy::all)]
    include!("gen/_.rs");
}

pub use prost;
pub use prost_types;
