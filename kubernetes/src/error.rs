//! The one error type of this crate: says which object failed and why.

use std::fmt;

use kube::core::Status;

use crate::Kind;

/// The object an operation was about: kind plus `namespace/name` (or just `name` for
/// cluster-scoped kinds).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// Kind of the object.
    pub kind: Kind,
    /// Namespace, `None` for cluster-scoped kinds.
    pub namespace: Option<String>,
    /// Object name.
    pub name: String,
}

impl ObjectRef {
    /// Builds a reference from borrowed parts.
    pub fn new(kind: Kind, namespace: Option<&str>, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub fn key(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} \"{}\"", self.kind, self.key())
    }
}

/// Errors from reading, writing or configuring access to Kubernetes objects.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object does not exist (HTTP 404 `NotFound`).
    #[error("{object}: not found: {message}")]
    NotFound {
        /// The object.
        object: ObjectRef,
        /// Message from the API server.
        message: String,
    },
    /// A create found an object with the same name (HTTP 409 `AlreadyExists`).
    #[error("{object}: already exists: {message}")]
    AlreadyExists {
        /// The object.
        object: ObjectRef,
        /// Message from the API server.
        message: String,
    },
    /// A write carried a stale `resourceVersion` (HTTP 409 `Conflict`).
    #[error("{object}: conflict: {message}")]
    Conflict {
        /// The object.
        object: ObjectRef,
        /// Message from the API server.
        message: String,
    },
    /// An optimistic-concurrency update kept conflicting and was given up.
    #[error("{object}: still conflicting after {attempts} attempts; giving up")]
    ConflictRetriesExhausted {
        /// The object.
        object: ObjectRef,
        /// How many PUTs were tried.
        attempts: u32,
    },
    /// The requested `resourceVersion` is too old (HTTP 410 `Gone`/`Expired`).
    #[error("{object}: gone: {message}")]
    Gone {
        /// The object.
        object: ObjectRef,
        /// Message from the API server.
        message: String,
    },
    /// The API server rejected the object as invalid (HTTP 422 `Invalid`).
    #[error("{object}: invalid: {message}")]
    Invalid {
        /// The object.
        object: ObjectRef,
        /// Message from the API server.
        message: String,
    },
    /// Any other `Status` failure from the API server (403, 429, 500, ...).
    #[error("{object}: API server answered {code} {reason}: {message}")]
    Api {
        /// The object.
        object: ObjectRef,
        /// HTTP status code.
        code: u16,
        /// Machine-readable reason (`Forbidden`, `TooManyRequests`, ...).
        reason: String,
        /// Message from the API server.
        message: String,
    },
    /// The request did not produce an API answer (connection, TLS, decoding). The message
    /// carries the cause's whole chain, so it is no `source` (a chain would print it twice).
    #[error("{object}: request failed: {}", argocd_agent_domain::error_chain(&**.cause))]
    Request {
        /// The object.
        object: ObjectRef,
        /// Underlying client error.
        cause: Box<kube::Error>,
    },
    /// The call itself was wrong (e.g. no namespace for a namespaced kind).
    #[error("{object}: invalid request: {reason}")]
    InvalidRequest {
        /// The object.
        object: ObjectRef,
        /// What was wrong.
        reason: String,
    },
    /// The client configuration (kubeconfig, context, in-cluster) could not be loaded.
    #[error("kubernetes client configuration: {0}")]
    Config(String),
}

impl Error {
    /// Maps a kube-rs error for `object` onto the variant named after the API `Status`.
    pub fn from_kube(object: ObjectRef, err: kube::Error) -> Self {
        match err {
            kube::Error::Api(status) => Self::from_status(object, &status),
            other => Self::Request {
                object,
                cause: Box::new(other),
            },
        }
    }

    /// Maps a Kubernetes `Status` failure body onto a variant.
    pub fn from_status(object: ObjectRef, status: &Status) -> Self {
        let message = status.message.clone();
        if status.is_not_found() {
            Self::NotFound { object, message }
        } else if status.is_already_exists() {
            Self::AlreadyExists { object, message }
        } else if status.is_conflict() {
            Self::Conflict { object, message }
        } else if status.code == 410 || status.reason == "Gone" || status.reason == "Expired" {
            Self::Gone { object, message }
        } else if status.is_invalid() {
            Self::Invalid { object, message }
        } else {
            Self::Api {
                object,
                code: status.code,
                reason: status.reason.clone(),
                message,
            }
        }
    }

    /// True for a 404: the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// True for a stale-write conflict (including exhausted retries), not for `AlreadyExists`.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Self::Conflict { .. } | Self::ConflictRetriesExhausted { .. }
        )
    }

    /// True when the same request may well succeed later: the API server was unavailable
    /// or overloaded (5xx, 429), the request got no answer (connection, timeout), or a
    /// write met a newer version of the object (conflict; a later attempt reads it
    /// afresh). False for answers that stay the same (not found, invalid, forbidden, ...).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Api { code, .. } => *code >= 500 || *code == 429,
            Self::Request { .. }
            | Self::Conflict { .. }
            | Self::ConflictRetriesExhausted { .. } => true,
            _ => false,
        }
    }

    /// True when a create found an existing object.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Self::AlreadyExists { .. })
    }

    /// The object the error is about, if any.
    pub fn object(&self) -> Option<&ObjectRef> {
        match self {
            Self::NotFound { object, .. }
            | Self::AlreadyExists { object, .. }
            | Self::Conflict { object, .. }
            | Self::ConflictRetriesExhausted { object, .. }
            | Self::Gone { object, .. }
            | Self::Invalid { object, .. }
            | Self::Api { object, .. }
            | Self::Request { object, .. }
            | Self::InvalidRequest { object, .. } => Some(object),
            Self::Config(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str) -> Status {
        Status {
            status: Some(kube::core::response::StatusSummary::Failure),
            code,
            message: format!("{reason} message"),
            metadata: None,
            reason: reason.to_string(),
            details: None,
        }
    }

    #[test]
    fn status_bodies_map_to_named_variants() {
        let obj = ObjectRef::new(Kind::Application, Some("agent-a"), "guestbook");
        assert!(Error::from_status(obj.clone(), &status(404, "NotFound")).is_not_found());
        assert!(Error::from_status(obj.clone(), &status(409, "AlreadyExists")).is_already_exists());
        assert!(Error::from_status(obj.clone(), &status(409, "Conflict")).is_conflict());
        assert!(matches!(
            Error::from_status(obj.clone(), &status(410, "Expired")),
            Error::Gone { .. }
        ));
        assert!(matches!(
            Error::from_status(obj.clone(), &status(422, "Invalid")),
            Error::Invalid { .. }
        ));
        assert!(matches!(
            Error::from_status(obj, &status(403, "Forbidden")),
            Error::Api { code: 403, .. }
        ));
    }

    #[test]
    fn unavailable_overloaded_and_conflicting_writes_are_transient() {
        let obj = ObjectRef::new(Kind::Application, Some("agent-a"), "guestbook");
        for (code, reason) in [
            (500, "InternalError"),
            (503, "ServiceUnavailable"),
            (504, "Timeout"),
            (429, "TooManyRequests"),
            (409, "Conflict"),
        ] {
            assert!(
                Error::from_status(obj.clone(), &status(code, reason)).is_transient(),
                "{code} {reason}"
            );
        }
        for (code, reason) in [
            (404, "NotFound"),
            (409, "AlreadyExists"),
            (410, "Gone"),
            (422, "Invalid"),
            (403, "Forbidden"),
            (400, "BadRequest"),
        ] {
            assert!(
                !Error::from_status(obj.clone(), &status(code, reason)).is_transient(),
                "{code} {reason}"
            );
        }
        let no_answer = Error::from_kube(obj, kube::Error::Service("connection reset".into()));
        assert!(no_answer.is_transient());
    }

    #[test]
    fn error_message_names_kind_namespace_and_name() {
        let obj = ObjectRef::new(Kind::Application, Some("agent-a"), "guestbook");
        let err = Error::from_status(obj, &status(404, "NotFound"));
        assert_eq!(
            err.to_string(),
            "Application \"agent-a/guestbook\": not found: NotFound message"
        );
    }
}
