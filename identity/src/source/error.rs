//! Why an SVID source could not be built or produced no SVID ([`SourceError`]).

use std::time::Duration;

use crate::svid::SvidError;
use crate::text;

/// Why a source could not be built or produced no SVID.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Neither an endpoint nor `SPIFFE_ENDPOINT_SOCKET` was given.
    #[error("no Workload API endpoint: pass one or set SPIFFE_ENDPOINT_SOCKET")]
    NoEndpoint,
    /// No SVID arrived in time.
    #[error("no X.509-SVID from {from} within {timeout}{}", last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default(), timeout = text::duration(*.timeout))]
    Timeout {
        /// Where it was expected from.
        from: String,
        /// How long we waited.
        timeout: Duration,
        /// The most recent failure, if any.
        last_error: Option<String>,
    },
    /// The source's background task has stopped.
    #[error("SVID source stopped")]
    Closed,
    /// A file could not be read.
    #[error("cannot read {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The material is not a usable SVID or bundle. The message carries the cause, so it is
    /// no `source` (a chain would print it twice).
    #[error("{from}: {cause}")]
    Invalid {
        /// Where the material came from.
        from: String,
        /// What is wrong with it.
        cause: SvidError,
    },
    /// Sources run a background task and must be created inside a tokio runtime.
    #[error("SVID sources must be created inside a tokio runtime")]
    NoRuntime,
}

/// Why a source cannot serve a handshake now (the readiness probes' answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SvidNotReady {
    /// No SVID has come yet.
    #[error("no X.509-SVID yet from {from}")]
    NoSvid {
        /// Where the source reads from.
        from: String,
    },
    /// The current SVID expired: rotation stopped.
    #[error("X.509-SVID {id} expired (rotation from {from} stopped)")]
    Expired {
        /// The SVID's SPIFFE ID.
        id: String,
        /// Where the source reads from.
        from: String,
    },
}
