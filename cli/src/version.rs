//! What `argocd-agent --version` and `argocd-agentctl version` print: the crate version, the
//! git commit it was built from and the protocol versions it speaks, so an operator can tell
//! from the binary alone whether a principal and an agent can talk.

use std::sync::OnceLock;

use argocd_agent_domain::event::{PROTOCOL_MIN, PROTOCOL_VERSION};

/// The crate version (the image tag the manifests in `deploy/` use).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit (12 hex digits) recorded by `build.rs`, or `unknown`.
pub const GIT_COMMIT: &str = env!("ARGOCD_AGENT_GIT_COMMIT");

/// The text after the program name, e.g.
/// `0.1.0 (commit 2db61c2a1b3c, protocol 1, accepts 1..=1)`.
pub fn text() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            "{VERSION} (commit {GIT_COMMIT}, protocol {PROTOCOL_VERSION}, accepts {PROTOCOL_MIN}..={PROTOCOL_VERSION})"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_text_names_version_commit_and_protocol_range() {
        let t = text();
        assert!(t.starts_with(VERSION), "{t}");
        assert!(t.contains(&format!("commit {GIT_COMMIT}")), "{t}");
        assert!(
            t.contains(&format!("accepts {PROTOCOL_MIN}..={PROTOCOL_VERSION}")),
            "{t}"
        );
        assert!(!GIT_COMMIT.is_empty());
    }
}
