//! Kubernetes backend of argocd-agent, shared by the principal (hub) and the agent
//! (spoke).
//!
//! - [`client`] builds a [`kube::Client`] from the usual kubeconfig / in-cluster sources
//!   with a client-side QPS/burst limit.
//! - [`watch`] watches one [`Kind`] within a [`Scope`] and keeps a [`Cache`], emitting
//!   de-duplicated [`Change`]s.
//! - [`ObjectStore`] (writes) and [`ObjectView`] (the watch cache's reads) are the
//!   backend's interfaces, which the principal's and the agent's logic hold as trait
//!   objects. [`Resources`] is the API server's store: it reads and writes one kind with
//!   optimistic concurrency and writes status only through `/status`; [`Cache`] is the
//!   view, fed by a [`watch`] (or by hand through a [`Feed`]). `memory` (feature `memory`)
//!   is an in-memory store for tests that feeds the same [`Change`]s.
//! - [`object`] has helpers over [`DynamicObject`](kube::api::DynamicObject): checksums,
//!   deletion state, the stripped copy that travels between clusters.
//!
//! Objects are always [`kube::api::DynamicObject`], so fields this crate does not model
//! survive every read-modify-write.
#![forbid(unsafe_code)]
#![deny(missing_docs, rust_2018_idioms, unreachable_pub)]

mod client;
mod error;
mod kind;
mod lease;
#[cfg(feature = "memory")]
pub mod memory;
pub mod object;
mod ratelimit;
mod resources;
mod scope;
mod store;
mod view;
mod watch;

pub use client::{
    ClientOptions, ConfigSource, DEFAULT_BURST, DEFAULT_QPS, WATCH_PAGE_FACTOR, bounded_client,
    client, client_from_config, clients, load_config,
};
pub use error::{Error, ObjectRef};
pub use kind::{ARGOPROJ_GROUP, ARGOPROJ_VERSION, Kind};
pub use lease::CompactLease;
pub use ratelimit::{TokenBucket, TokenBucketLayer};
pub use resources::{Resources, ensure_namespace};
pub use scope::{IGNORE_SYNC_LABEL, Namespaces, Scope, is_sync_ignored};
pub use store::{
    DeleteOutcome, Keep, Known, MAX_UPDATE_ATTEMPTS, Mutate, Mutation, ObjectStore, UpdateOutcome,
    UpsertOutcome,
};
pub use view::ObjectView;
pub use watch::Feed;
pub use watch::{ADMIN_LIST_PAGE_SIZE, Cache, Change, LIST_PAGE_SIZE, list_page_size, watch};

/// Label naming the agent an object on the hub belongs to (upstream's): hub copies of
/// autonomous agents' Applications and projects, managed agents' spoke-authored children,
/// agents' cluster Secrets.
pub const AGENT_NAME_LABEL: &str = "argocd-agent.argoproj-labs.io/agent-name";

/// Argo CD's label giving a Secret's type: `cluster`, `repository`, `repo-creds`.
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
