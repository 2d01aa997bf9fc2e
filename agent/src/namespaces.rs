//! Applications in any namespace on a spoke: which namespaces the agent takes Applications
//! from (its Argo CD namespace and `--allowed-namespaces`), and the names under which an
//! autonomous agent publishes Applications of other namespaces into its single hub
//! namespace.
//!
//! Patterns follow Argo CD's list matching (`util/glob`, regexp mode, as upstream
//! argocd-agent's namespace filter uses it): a pattern wrapped in slashes (`/^team-.*$/`) is
//! a regular expression, matched anywhere in the name unless anchored; any other pattern is
//! a shell glob over the whole name: `*` (any run of characters), `?` (one character),
//! `[abc]`, `[a-z]`, `[!abc]` (a character of, or not of, a set), `{a,b}` (either
//! alternative), `\x` (`x` literally). Regular expressions use Rust's `regex` syntax (no
//! look-around or back-references, which Argo CD's engine has); a pattern that does not
//! compile is refused at start rather than silently matching nothing.

use argocd_agent_domain::pattern::compile;
use argocd_agent_identity::text::quoted;
use regex::Regex;

/// An `--allowed-namespaces` pattern that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("pattern {pattern}: {reason}")]
pub struct PatternError {
    /// The pattern, quoted.
    pub pattern: String,
    /// Why it does not compile.
    pub reason: String,
}

/// Longest Application name: a DNS subdomain (RFC 1123), as every Kubernetes object name.
pub const MAX_NAME_LEN: usize = 253;

/// One compiled `--allowed-namespaces` pattern.
#[derive(Debug, Clone)]
struct Pattern {
    source: String,
    regex: Regex,
}

/// The namespaces an agent takes Applications from: its Argo CD namespace, always, and
/// those matching one of the `--allowed-namespaces` patterns.
#[derive(Debug, Clone)]
pub struct AllowedNamespaces {
    argocd: String,
    patterns: Vec<Pattern>,
}

impl AllowedNamespaces {
    /// Only the Argo CD namespace `argocd`.
    pub fn only(argocd: &str) -> AllowedNamespaces {
        AllowedNamespaces {
            argocd: argocd.to_owned(),
            patterns: Vec::new(),
        }
    }

    /// The Argo CD namespace and the namespaces matching `patterns` (empty entries, as an
    /// empty environment variable gives, are skipped). `Err` names the first pattern that
    /// does not compile, and why.
    pub fn new(argocd: &str, patterns: &[String]) -> Result<AllowedNamespaces, PatternError> {
        let mut out = AllowedNamespaces::only(argocd);
        for source in patterns.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
            let regex = compile(source).map_err(|e| PatternError {
                pattern: quoted(&source).to_string(),
                reason: String::from(e),
            })?;
            out.patterns.push(Pattern {
                source: source.to_owned(),
                regex,
            });
        }
        Ok(out)
    }

    /// The Argo CD namespace.
    pub fn argocd(&self) -> &str {
        &self.argocd
    }

    /// Whether any `--allowed-namespaces` pattern was given (the agent then watches
    /// Applications in every namespace and keeps those allowed).
    pub fn has_patterns(&self) -> bool {
        !self.patterns.is_empty()
    }

    /// Whether Applications in `namespace` are the agent's to take.
    pub fn allows(&self, namespace: &str) -> bool {
        namespace == self.argocd || self.patterns.iter().any(|p| p.regex.is_match(namespace))
    }

    /// The patterns as given, comma-separated (`(none)` without any), for messages.
    pub fn describe(&self) -> String {
        if self.patterns.is_empty() {
            return "(none)".into();
        }
        self.patterns
            .iter()
            .map(|p| p.source.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Why a local Application cannot be published under a hub name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HubNameError {
    /// `<namespace>.<name>` is longer than an object name may be.
    #[error(
        "hub name {q0} would be longer than {MAX_NAME_LEN} characters (an Application name is a DNS subdomain)", q0 = quoted(.0)
    )]
    TooLong(String),
}

/// The hub name of an autonomous agent's Application `name` in namespace `namespace`: the
/// name itself in the Argo CD namespace `argocd`, `<namespace>.<name>` in any other. A
/// namespace is a DNS label (no dots) and a name a DNS subdomain, so the result is a valid
/// Application name when it is short enough, and [`split_hub_name`] finds the namespace
/// again at the first dot.
pub fn hub_name(argocd: &str, namespace: &str, name: &str) -> Result<String, HubNameError> {
    if namespace == argocd {
        return Ok(name.to_owned());
    }
    let hub = format!("{namespace}.{name}");
    if hub.len() > MAX_NAME_LEN {
        return Err(HubNameError::TooLong(hub));
    }
    Ok(hub)
}

/// The `(namespace, name)` a hub name of the form `<namespace>.<name>` stands for, if it has
/// that form (a DNS label before the first dot, something after it). A hub name is first the
/// name of an Application in the Argo CD namespace; only when there is none does this
/// reading apply.
pub fn split_hub_name(hub: &str) -> Option<(&str, &str)> {
    let (ns, name) = hub.split_once('.')?;
    let label = !ns.is_empty()
        && ns.len() <= 63
        && ns
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !ns.starts_with('-')
        && !ns.ends_with('-');
    (label && !name.is_empty()).then_some((ns, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(patterns: &[&str]) -> AllowedNamespaces {
        let p: Vec<String> = patterns.iter().map(|s| s.to_string()).collect();
        AllowedNamespaces::new("argocd", &p).unwrap()
    }

    #[test]
    fn the_argo_cd_namespace_is_always_allowed_and_nothing_else_by_default() {
        let a = allowed(&[]);
        assert!(a.allows("argocd"));
        assert!(!a.allows("team-a"));
        assert!(!a.has_patterns());
        // Empty entries (an empty environment variable) add nothing.
        let a = allowed(&["", " "]);
        assert!(!a.has_patterns());
        assert!(!a.allows(""));
    }

    #[test]
    fn globs_match_the_whole_name() {
        let a = allowed(&["team-*", "app?", "exact"]);
        for ok in ["team-a", "team-", "team-a-b", "app1", "exact", "argocd"] {
            assert!(a.allows(ok), "{ok}");
        }
        for no in ["xteam-a", "team", "app", "app12", "exactly", "my-exact"] {
            assert!(!a.allows(no), "{no}");
        }
    }

    #[test]
    fn glob_classes_alternatives_and_escapes() {
        let a = allowed(&["env-[a-c]", "x[!0-9]", "{dev,qa}-*", "lit\\*"]);
        for ok in ["env-a", "env-c", "xa", "dev-1", "qa-team", "lit*"] {
            assert!(a.allows(ok), "{ok}");
        }
        for no in ["env-d", "x1", "prod-1", "dev", "lit", "litx"] {
            assert!(!a.allows(no), "{no}");
        }
        // Characters special to regular expressions are literal in a glob.
        let a = allowed(&["a.b", "c+"]);
        assert!(a.allows("a.b") && a.allows("c+"));
        assert!(!a.allows("axb") && !a.allows("cc"));
    }

    #[test]
    fn slashes_make_a_regular_expression_matched_anywhere_unless_anchored() {
        let a = allowed(&["/^prod-[0-9]+$/"]);
        assert!(a.allows("prod-12"));
        assert!(!a.allows("prod-x") && !a.allows("xprod-1"));
        // Unanchored, as Argo CD matches it.
        let a = allowed(&["/team/"]);
        assert!(a.allows("my-team-a"));
        assert!(!a.allows("other"));
        // A lone slash is a glob, not an empty expression.
        assert!(!allowed(&["/"]).allows("x"));
    }

    #[test]
    fn patterns_that_do_not_compile_are_refused_with_the_pattern_named() {
        for bad in ["/(/", "team-[a", "{a,b", "x\\"] {
            let e = AllowedNamespaces::new("argocd", &[bad.to_string()]).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn describe_lists_the_patterns() {
        assert_eq!(allowed(&[]).describe(), "(none)");
        assert_eq!(allowed(&["a-*", "/b/"]).describe(), "a-*,/b/");
    }

    #[test]
    fn hub_names_keep_the_argo_cd_namespace_bare_and_prefix_others() {
        assert_eq!(hub_name("argocd", "argocd", "web").unwrap(), "web");
        assert_eq!(hub_name("argocd", "team-a", "web").unwrap(), "team-a.web");
        assert_eq!(
            hub_name("argocd", "team-a", "web.v2").unwrap(),
            "team-a.web.v2"
        );
        let long = "n".repeat(250);
        assert!(matches!(
            hub_name("argocd", "team-a", &long),
            Err(HubNameError::TooLong(_))
        ));
        // Exactly at the limit is fine.
        let fits = "n".repeat(MAX_NAME_LEN - "team-a.".len());
        assert_eq!(
            hub_name("argocd", "team-a", &fits).unwrap().len(),
            MAX_NAME_LEN
        );
    }

    #[test]
    fn hub_names_split_back_at_the_first_dot() {
        assert_eq!(split_hub_name("team-a.web"), Some(("team-a", "web")));
        assert_eq!(split_hub_name("team-a.web.v2"), Some(("team-a", "web.v2")));
        for not in ["web", ".web", "team-a.", "Team.web", "-a.web", "a-.web"] {
            assert_eq!(split_hub_name(not), None, "{not}");
        }
        // Round trip.
        let hub = hub_name("argocd", "x", "y.z").unwrap();
        assert_eq!(split_hub_name(&hub), Some(("x", "y.z")));
    }
}
