//! The principal's partition of the hub: which agent hub namespaces it serves
//! (`--allowed-namespaces`) and which objects it owns (`--label-selector`), so that two
//! principals on one hub (a side-by-side migration, one agent moved at a time) never touch
//! the same object.
//!
//! - **Namespaces.** With `--allowed-namespaces`, Applications are watched only in the
//!   namespaces the patterns match (one watch per namespace when every pattern is a plain
//!   name, otherwise a cluster-wide watch filtered here), and an agent whose mapping rule
//!   gives it a hub namespace outside them is refused at connect, naming the namespace and
//!   the patterns. With destination-based mapping Argo CD's namespace is always allowed (as
//!   upstream does). Patterns are upstream's (Argo CD's `util/glob`, regexp mode): a shell
//!   glob over the whole name (`*`, `?`, `[a-z]`, `[!a]`, `{a,b}`, `\x`), or `/regex/`
//!   matched anywhere unless anchored.
//! - **Labels.** The label selector narrows every watch (Applications, AppProjects,
//!   repository Secrets, ConfigMaps of Argo CD's namespace, the cluster Secrets the
//!   principal keeps, Leases). Its equality terms (`k=v`, `k==v`, `k in (v)`) are also the
//!   *partition labels*: stamped on every object the principal creates or rewrites
//!   (autonomous agents' hub copies, cluster Secrets, Leases), so the principal sees what it
//!   writes and the other principal, whose selector differs, never does. An object of the
//!   principal's kind that exists on the hub but lacks them belongs to someone else and is
//!   left alone when the principal would otherwise revert or renew it.

use std::collections::BTreeMap;

use argocd_agent_domain::AgentIdentity;
use kube::api::DynamicObject;
use regex::Regex;

/// One compiled `--allowed-namespaces` pattern.
#[derive(Debug, Clone)]
struct Pattern {
    source: String,
    regex: Regex,
    /// A plain namespace name (no glob or regex syntax).
    literal: bool,
}

/// The principal's partition: allowed hub namespaces and partition labels.
#[derive(Debug, Clone, Default)]
pub struct Partition {
    patterns: Vec<Pattern>,
    /// Argo CD's namespace, allowed with destination-based mapping.
    argocd: Option<String>,
    selector: Option<String>,
    labels: BTreeMap<String, String>,
    unstampable: Vec<String>,
}

/// Why an agent is outside the partition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "agent {agent} maps to hub namespace {namespace} (rule {rule:?}), which this principal does not serve: --allowed-namespaces is {allowed}; connect it to the principal whose partition holds {namespace}, or change the rule"
)]
pub struct OutsidePartition {
    /// The agent refused.
    pub agent: String,
    /// Its hub namespace.
    pub namespace: String,
    /// The mapping rule that produced it.
    pub rule: String,
    /// The patterns, comma-separated.
    pub allowed: String,
}

impl Partition {
    /// The whole hub: every namespace, no selector (a principal without a partition).
    pub fn whole_hub() -> Partition {
        Partition::default()
    }

    /// The partition of `--allowed-namespaces` `patterns` (empty entries skipped) and
    /// `--label-selector` `selector`; `argocd` is Argo CD's namespace, allowed too with
    /// destination-based mapping (`by_destination`). `Err` names the first pattern or
    /// selector term that cannot be used.
    pub fn new(
        patterns: &[String],
        selector: Option<&str>,
        argocd: &str,
        by_destination: bool,
    ) -> Result<Partition, String> {
        let mut out = Partition::default();
        for source in patterns
            .iter()
            .flat_map(|p| p.split(','))
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let (regex, literal) = compile(source)
                .map_err(|e| format!("--allowed-namespaces pattern {source:?}: {e}"))?;
            out.patterns.push(Pattern {
                source: source.to_owned(),
                regex,
                literal,
            });
        }
        if by_destination && !out.patterns.is_empty() {
            out.argocd = Some(argocd.to_owned());
        }
        if let Some(sel) = selector.map(str::trim).filter(|s| !s.is_empty()) {
            let (labels, unstampable) =
                partition_labels(sel).map_err(|e| format!("--label-selector {sel:?}: {e}"))?;
            out.selector = Some(sel.to_owned());
            out.labels = labels;
            out.unstampable = unstampable;
        }
        Ok(out)
    }

    /// Whether `--allowed-namespaces` limits the namespaces served.
    pub fn limits_namespaces(&self) -> bool {
        !self.patterns.is_empty()
    }

    /// Whether Applications (and agents) of hub namespace `ns` are this principal's.
    pub fn allows_namespace(&self, ns: &str) -> bool {
        self.patterns.is_empty()
            || self.argocd.as_deref() == Some(ns)
            || self.patterns.iter().any(|p| p.regex.is_match(ns))
    }

    /// The namespaces to watch Applications in, when every pattern is a plain name (one
    /// watch each); `None`: watch every namespace and filter with [`Self::allows_namespace`].
    pub fn literal_namespaces(&self) -> Option<Vec<String>> {
        if self.patterns.is_empty() || !self.patterns.iter().all(|p| p.literal) {
            return None;
        }
        let mut out: Vec<String> = self.patterns.iter().map(|p| p.source.clone()).collect();
        out.extend(self.argocd.clone());
        out.sort();
        out.dedup();
        Some(out)
    }

    /// The patterns as given, comma-separated (`(any)` without any), for messages.
    pub fn describe(&self) -> String {
        if self.patterns.is_empty() {
            return "(any)".into();
        }
        let mut out: Vec<&str> = self.patterns.iter().map(|p| p.source.as_str()).collect();
        out.extend(self.argocd.as_deref());
        out.join(",")
    }

    /// Refuses an agent whose hub namespace is outside the partition.
    pub fn admit(&self, identity: &AgentIdentity) -> Result<(), OutsidePartition> {
        if self.allows_namespace(identity.namespace.as_str()) {
            return Ok(());
        }
        Err(OutsidePartition {
            agent: identity.agent.to_string(),
            namespace: identity.namespace.to_string(),
            rule: identity.rule.clone(),
            allowed: self.describe(),
        })
    }

    /// The `--label-selector`, if any.
    pub fn selector(&self) -> Option<&str> {
        self.selector.as_deref()
    }

    /// `extra` and the label selector joined, as one selector (`None`: neither).
    pub fn selector_with(&self, extra: Option<&str>) -> Option<String> {
        let parts: Vec<&str> = extra.into_iter().chain(self.selector()).collect();
        (!parts.is_empty()).then(|| parts.join(","))
    }

    /// The partition labels: the selector's equality terms.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// Selector terms no label value satisfies by itself (`k`, `k in (a,b)` with several
    /// values, `k!=v`, `k notin (..)` are satisfied by absence and not listed): objects the
    /// principal creates miss them, and its own watch would not see those objects.
    pub fn unstampable(&self) -> &[String] {
        &self.unstampable
    }

    /// Adds the partition labels to `labels`.
    pub fn stamp_labels(&self, labels: &mut BTreeMap<String, String>) {
        for (k, v) in &self.labels {
            labels.insert(k.clone(), v.clone());
        }
    }

    /// Adds the partition labels to `obj`.
    pub fn stamp(&self, obj: &mut DynamicObject) {
        if self.labels.is_empty() {
            return;
        }
        self.stamp_labels(obj.metadata.labels.get_or_insert_with(Default::default));
    }

    /// Whether `labels` carry every partition label (always, without any): an object this
    /// principal may write.
    pub fn owns(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.labels
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    }
}

/// A pattern as a regular expression ([`argocd_agent_domain::pattern::compile`]) and
/// whether it is a plain name (then watched by namespace rather than filtered).
fn compile(pattern: &str) -> Result<(Regex, bool), String> {
    let literal = pattern
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    Ok((argocd_agent_domain::pattern::compile(pattern)?, literal))
}

/// The terms of a label selector (commas inside `( )` do not split).
fn terms(selector: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(selector[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            return Err("a ) closes nothing".into());
        }
    }
    if depth != 0 {
        return Err("a ( is not closed".into());
    }
    out.push(selector[start..].trim());
    if out.iter().any(|t| t.is_empty()) {
        return Err("empty term".into());
    }
    Ok(out)
}

/// The partition labels of a selector (its equality terms) and the terms that name a
/// label without fixing its value.
fn partition_labels(selector: &str) -> Result<(BTreeMap<String, String>, Vec<String>), String> {
    let mut labels = BTreeMap::new();
    let mut unstampable = Vec::new();
    for term in terms(selector)? {
        if term.starts_with('!') || term.contains("!=") || term.contains(" notin ") {
            continue; // satisfied by an object without the label
        }
        let pair = if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            Some((k.trim(), v.trim()))
        } else if let Some((k, set)) = term.split_once(" in ") {
            let values: Vec<&str> = set
                .trim()
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| format!("expected (values) in {term:?}"))?
                .split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .collect();
            match values.as_slice() {
                [one] => Some((k.trim(), *one)),
                _ => None,
            }
        } else {
            None
        };
        match pair {
            Some((k, v)) if !k.is_empty() => {
                if labels
                    .insert(k.to_owned(), v.to_owned())
                    .is_some_and(|o| o != v)
                {
                    return Err(format!("label {k:?} is required to have two values"));
                }
            }
            Some(_) => return Err(format!("term {term:?} names no label")),
            None => unstampable.push(term.to_owned()),
        }
    }
    Ok((labels, unstampable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_domain::{AgentName, AllowedModes, ClientIdentity, Namespace};

    fn part(patterns: &[&str], selector: Option<&str>) -> Partition {
        let p: Vec<String> = patterns.iter().map(|s| s.to_string()).collect();
        Partition::new(&p, selector, "argocd", false).unwrap()
    }

    #[test]
    fn namespaces_match_globs_regexes_and_plain_names() {
        let p = part(&["team-a-*", "/^ops-[0-9]+$/", "single"], None);
        assert!(p.allows_namespace("team-a-prod"));
        assert!(!p.allows_namespace("team-b-prod"));
        assert!(p.allows_namespace("ops-12"));
        assert!(!p.allows_namespace("ops-x"));
        assert!(p.allows_namespace("single"));
        assert!(!p.allows_namespace("single-2"));
        assert_eq!(p.literal_namespaces(), None);
        assert_eq!(
            part(&["b,a", "a"], None).literal_namespaces(),
            Some(vec!["a".into(), "b".into()])
        );
        let whole = Partition::whole_hub();
        assert!(whole.allows_namespace("anything"));
        assert!(!whole.limits_namespaces());
        assert_eq!(whole.literal_namespaces(), None);
    }

    #[test]
    fn destination_mapping_always_allows_argocds_namespace() {
        let p = Partition::new(&["agent-*".into()], None, "argocd", true).unwrap();
        assert!(p.allows_namespace("argocd"));
        assert!(p.allows_namespace("agent-x"));
        let p = Partition::new(&["agent-x".into()], None, "argocd", true).unwrap();
        assert_eq!(
            p.literal_namespaces(),
            Some(vec!["agent-x".into(), "argocd".into()])
        );
        // Without patterns nothing is limited either way.
        let p = Partition::new(&[], None, "argocd", true).unwrap();
        assert!(p.allows_namespace("elsewhere"));
    }

    #[test]
    fn bad_patterns_and_selectors_are_refused_naming_them() {
        let err = Partition::new(&["/(/".into()], None, "argocd", false).unwrap_err();
        assert!(err.contains("\"/(/\""), "{err}");
        let err = Partition::new(&["a{b".into()], None, "argocd", false).unwrap_err();
        assert!(err.contains("not closed"), "{err}");
        let err = Partition::new(&[], Some("a=1,a=2"), "argocd", false).unwrap_err();
        assert!(err.contains("two values"), "{err}");
        let err = Partition::new(&[], Some("a in (1"), "argocd", false).unwrap_err();
        assert!(err.contains("not closed"), "{err}");
        let err = Partition::new(&[], Some("a,,b=1"), "argocd", false).unwrap_err();
        assert!(err.contains("empty term"), "{err}");
    }

    #[test]
    fn equality_terms_are_the_partition_labels() {
        let p = part(
            &[],
            Some(
                "partition-a=true, tier==gold, zone in (eu), !legacy, x!=y, k notin (a,b), team, r in (a,b)",
            ),
        );
        assert_eq!(
            p.labels(),
            &BTreeMap::from([
                ("partition-a".into(), "true".into()),
                ("tier".into(), "gold".into()),
                ("zone".into(), "eu".into()),
            ])
        );
        assert_eq!(p.unstampable(), ["team", "r in (a,b)"]);
        let mut obj = DynamicObject::new(
            "x",
            &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()),
        );
        assert!(!p.owns(obj.metadata.labels.as_ref()));
        p.stamp(&mut obj);
        assert!(p.owns(obj.metadata.labels.as_ref()));
        assert!(Partition::whole_hub().owns(None));
        assert_eq!(
            p.selector_with(Some("lease")).as_deref(),
            Some(
                "lease,partition-a=true, tier==gold, zone in (eu), !legacy, x!=y, k notin (a,b), team, r in (a,b)"
            )
        );
        assert_eq!(Partition::whole_hub().selector_with(None), None);
    }

    #[test]
    fn agents_outside_the_namespaces_are_refused_with_the_rule_and_patterns() {
        let p = part(&["agent-a*"], None);
        let identity = |ns: &str| AgentIdentity {
            client: ClientIdentity::AgentName(AgentName::new("x").unwrap()),
            agent: AgentName::new("x").unwrap(),
            namespace: Namespace::new(ns).unwrap(),
            allowed_modes: AllowedModes::Both,
            rule: "agents".into(),
        };
        assert!(p.admit(&identity("agent-a1")).is_ok());
        let err = p.admit(&identity("agent-b1")).unwrap_err().to_string();
        assert!(
            err.contains("agent x maps to hub namespace agent-b1"),
            "{err}"
        );
        assert!(err.contains("\"agents\""), "{err}");
        assert!(err.contains("--allowed-namespaces is agent-a*"), "{err}");
    }
}
