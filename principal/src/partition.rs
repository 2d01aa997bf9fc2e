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
//! - **Excluding terms.** The selector's terms an object satisfies by lacking a label or a
//!   value (`k!=v`, `!k`, `k notin (a,b)`) are enforced on what the principal writes too:
//!   a label of an agent's object that would fail one of them is dropped from the hub copy.
//!   Otherwise an agent could label its Application `tier: x` under `tier!=x` and hide its
//!   hub copy from the principal's own watch, so that edits on the hub were never reverted.

use argocd_agent_identity::text::quoted;
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
    /// Labels the selector excludes.
    excluded: BTreeMap<String, Excluded>,
    unstampable: Vec<String>,
}

/// What an excluding selector term rules out of one label.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Excluded {
    /// The label itself (`!k`).
    Label,
    /// These values of it (`k!=v`, `k notin (a,b)`).
    Values(Vec<String>),
}

impl Excluded {
    fn excludes(&self, value: &str) -> bool {
        match self {
            Excluded::Label => true,
            Excluded::Values(values) => values.iter().any(|v| v == value),
        }
    }

    /// Both terms at once (`!k` covers every value).
    fn and(self, other: Excluded) -> Excluded {
        match (self, other) {
            (Excluded::Values(mut a), Excluded::Values(b)) => {
                a.extend(b);
                Excluded::Values(a)
            }
            _ => Excluded::Label,
        }
    }
}

/// Why an agent is outside the partition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "agent {agent} maps to hub namespace {namespace} (rule {rule}), which this principal does not serve: --allowed-namespaces is {allowed}; connect it to the principal whose partition holds {namespace}, or change the rule", rule = quoted(.rule)
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

/// Why `--allowed-namespaces` or `--label-selector` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    /// A namespace pattern that does not compile.
    #[error("--allowed-namespaces pattern {}: {reason}", quoted(.pattern))]
    Pattern {
        /// The pattern as given.
        pattern: String,
        /// Why it does not compile.
        reason: argocd_agent_domain::pattern::PatternError,
    },
    /// A label selector the principal cannot honour.
    #[error("--label-selector {}: {problem}", quoted(.selector))]
    Selector {
        /// The selector as given.
        selector: String,
        /// The first term that cannot be used.
        problem: SelectorProblem,
    },
}

/// What is wrong with a label selector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorProblem {
    /// More `)` than `(`.
    #[error("a ) closes nothing")]
    UnopenedParen,
    /// A `(` without its `)`.
    #[error("a ( is not closed")]
    UnclosedParen,
    /// Two commas in a row, or one at an end.
    #[error("empty term")]
    EmptyTerm,
    /// A set-based term without its `(values)`.
    #[error("expected (values) in {}", quoted(.0))]
    NoValues(String),
    /// A term without a label name.
    #[error("term {} names no label", quoted(.0))]
    NoLabel(String),
    /// Two equality terms fixing one label to different values.
    #[error("label {} is required to have two values", quoted(.0))]
    TwoValues(String),
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
    ) -> Result<Partition, PartitionError> {
        let mut out = Partition::default();
        for source in patterns
            .iter()
            .flat_map(|p| p.split(','))
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let (regex, literal) = compile(source).map_err(|reason| PartitionError::Pattern {
                pattern: source.to_owned(),
                reason,
            })?;
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
            let terms = partition_labels(sel).map_err(|problem| PartitionError::Selector {
                selector: sel.to_owned(),
                problem,
            })?;
            out.selector = Some(sel.to_owned());
            out.labels = terms.labels;
            out.excluded = terms.excluded;
            out.unstampable = terms.unstampable;
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

    /// Adds the partition labels to `labels` (replacing other values of them) and drops
    /// the labels the selector excludes, so the object is within the selector's reach
    /// (unless an [`Self::unstampable`] term keeps it out). Returns the labels dropped.
    pub fn stamp_labels(&self, labels: &mut BTreeMap<String, String>) -> Vec<(String, String)> {
        for (k, v) in &self.labels {
            labels.insert(k.clone(), v.clone());
        }
        let mut dropped = Vec::new();
        for (k, excluded) in &self.excluded {
            if labels.get(k).is_some_and(|v| excluded.excludes(v))
                && let Some(v) = labels.remove(k)
            {
                dropped.push((k.clone(), v));
            }
        }
        dropped
    }

    /// Stamps `obj`'s labels ([`Self::stamp_labels`]); labels dropped are logged.
    pub fn stamp(&self, obj: &mut DynamicObject) {
        if self.labels.is_empty() && self.excluded.is_empty() {
            return;
        }
        let dropped = self.stamp_labels(obj.metadata.labels.get_or_insert_with(Default::default));
        if !dropped.is_empty() {
            tracing::warn!(
                object = obj.metadata.name.as_deref().unwrap_or_default(),
                namespace = obj.metadata.namespace.as_deref().unwrap_or_default(),
                dropped = %argocd_agent_identity::text::quoted_list(dropped.iter().map(|(k, v)| format!("{k}={v}"))),
                selector = self.selector().unwrap_or_default(),
                "labels the --label-selector excludes dropped from the hub copy: they would hide it from this principal"
            );
        }
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
fn compile(pattern: &str) -> Result<(Regex, bool), argocd_agent_domain::pattern::PatternError> {
    let literal = pattern
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    Ok((argocd_agent_domain::pattern::compile(pattern)?, literal))
}

/// The terms of a label selector (commas inside `( )` do not split).
fn terms(selector: &str) -> Result<Vec<&str>, SelectorProblem> {
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
            return Err(SelectorProblem::UnopenedParen);
        }
    }
    if depth != 0 {
        return Err(SelectorProblem::UnclosedParen);
    }
    out.push(selector[start..].trim());
    if out.iter().any(|t| t.is_empty()) {
        return Err(SelectorProblem::EmptyTerm);
    }
    Ok(out)
}

/// What a selector asks of the objects the principal writes.
#[derive(Debug, Default)]
struct SelectorTerms {
    /// Equality terms: the partition labels.
    labels: BTreeMap<String, String>,
    /// Excluding terms, by label.
    excluded: BTreeMap<String, Excluded>,
    /// Terms naming a label without fixing its value.
    unstampable: Vec<String>,
}

/// The `(a, b)` of a set-based term, as values.
fn set_values<'a>(set: &'a str, term: &str) -> Result<Vec<&'a str>, SelectorProblem> {
    Ok(set
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| SelectorProblem::NoValues(term.to_owned()))?
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect())
}

/// The excluding term `term` (`!k`, `k!=v`, `k notin (a,b)`) as a key and what it
/// excludes; `None` for any other term.
fn excluding(term: &str) -> Result<Option<(&str, Excluded)>, SelectorProblem> {
    let owned =
        |values: Vec<&str>| Excluded::Values(values.into_iter().map(str::to_owned).collect());
    let (key, excluded) = if let Some(k) = term.strip_prefix('!') {
        (k.trim(), Excluded::Label)
    } else if let Some((k, v)) = term.split_once("!=") {
        (k.trim(), owned(vec![v.trim()]))
    } else if let Some((k, set)) = term.split_once(" notin ") {
        (k.trim(), owned(set_values(set, term)?))
    } else {
        return Ok(None);
    };
    if key.is_empty() {
        return Err(SelectorProblem::NoLabel(term.to_owned()));
    }
    Ok(Some((key, excluded)))
}

/// The partition labels of a selector (its equality terms), the labels it excludes, and the
/// terms that name a label without fixing its value.
fn partition_labels(selector: &str) -> Result<SelectorTerms, SelectorProblem> {
    let mut out = SelectorTerms::default();
    for term in terms(selector)? {
        if let Some((key, excluded)) = excluding(term)? {
            let both = match out.excluded.remove(key) {
                Some(earlier) => earlier.and(excluded),
                None => excluded,
            };
            out.excluded.insert(key.to_owned(), both);
            continue;
        }
        let pair = if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            Some((k.trim(), v.trim()))
        } else if let Some((k, set)) = term.split_once(" in ") {
            let values = set_values(set, term)?;
            match values.as_slice() {
                [one] => Some((k.trim(), *one)),
                _ => None,
            }
        } else {
            None
        };
        match pair {
            Some((k, v)) if !k.is_empty() => {
                if out
                    .labels
                    .insert(k.to_owned(), v.to_owned())
                    .is_some_and(|o| o != v)
                {
                    return Err(SelectorProblem::TwoValues(k.to_owned()));
                }
            }
            Some(_) => return Err(SelectorProblem::NoLabel(term.to_owned())),
            None => out.unstampable.push(term.to_owned()),
        }
    }
    Ok(out)
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
        let err = Partition::new(&["/(/".into()], None, "argocd", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"/(/\""), "{err}");
        let err = Partition::new(&["a{b".into()], None, "argocd", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not closed"), "{err}");
        let err = Partition::new(&[], Some("a=1,a=2"), "argocd", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("two values"), "{err}");
        let err = Partition::new(&[], Some("a in (1"), "argocd", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not closed"), "{err}");
        let err = Partition::new(&[], Some("a,,b=1"), "argocd", false)
            .unwrap_err()
            .to_string();
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

    /// An agent labelling its Application `tier: x` under `tier!=x` hid the hub copy from
    /// its own principal's watch, so hub edits to it were never reverted.
    #[test]
    fn labels_the_selector_excludes_are_dropped_so_an_agent_cannot_hide_its_copies() {
        let p = part(
            &[],
            Some("partition-a=true,tier!=x,!legacy,zone notin (moon, mars)"),
        );
        let app = |labels: serde_json::Value| {
            let mut obj = DynamicObject::new(
                "app",
                &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            );
            obj.metadata.labels = serde_json::from_value(labels).unwrap();
            obj
        };
        let mut hiding = app(serde_json::json!({
            "partition-a": "false", "tier": "x", "legacy": "", "zone": "mars", "team": "t"
        }));
        p.stamp(&mut hiding);
        assert_eq!(
            hiding.metadata.labels,
            Some(BTreeMap::from([
                ("partition-a".into(), "true".into()),
                ("team".into(), "t".into()),
            ])),
            "forced to the partition's value; excluded labels dropped; others kept"
        );
        assert!(p.owns(hiding.metadata.labels.as_ref()));
        // Labels the selector allows stay as the agent sent them.
        let mut fine = app(serde_json::json!({"tier": "gold", "zone": "eu"}));
        p.stamp(&mut fine);
        let labels = fine.metadata.labels.unwrap();
        assert_eq!(labels.get("tier").map(String::as_str), Some("gold"));
        assert_eq!(labels.get("zone").map(String::as_str), Some("eu"));
        // `!k` and `k!=v` together exclude every value; a selector of excluding terms alone
        // still stamps.
        let p = part(&[], Some("tier!=x,!tier"));
        let mut obj = app(serde_json::json!({"tier": "gold"}));
        p.stamp(&mut obj);
        assert_eq!(obj.metadata.labels, Some(BTreeMap::new()));
        let err = Partition::new(&[], Some("!"), "argocd", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("names no label"), "{err}");
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
            tenant: None,
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
