//! Why a rule file or flag cannot be loaded ([`RuleError`]).

use argocd_agent_identity::text::quoted;
use std::path::PathBuf;

use crate::tenant::TenantError;

/// A rule file or flag that cannot be loaded. Messages carry their cause, so no variant has a
/// `source` (a chain would print it twice).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// The YAML does not parse or has the wrong shape.
    #[error("mapping rules YAML: {0}")]
    Yaml(String),
    /// One rule of a YAML document is invalid.
    #[error("mapping rule {index} (\"{name}\"): {reason}")]
    Rule {
        /// 1-based position in the file.
        index: usize,
        /// Its name (given or default).
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// One tenant of a YAML document is invalid.
    #[error("mapping rules YAML: {0}")]
    Tenant(TenantError),
    /// One rule flag is invalid.
    #[error("mapping rule flag {flag}: {reason}", flag = quoted(.flag))]
    Flag {
        /// The flag as given (truncated when very long).
        flag: String,
        /// What is wrong.
        reason: String,
    },
    /// The rules file cannot be read.
    #[error("mapping rules file {}: {cause}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// [`LiveRules::start`](crate::mapping::LiveRules::start) was called outside a tokio runtime.
    #[error("LiveRules::start must be called inside a tokio runtime")]
    NoRuntime,
    /// The rules file is invalid.
    #[error("mapping rules file {}: {cause}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        cause: Box<RuleError>,
    },
}

impl From<TenantError> for RuleError {
    fn from(e: TenantError) -> Self {
        RuleError::Tenant(e)
    }
}
