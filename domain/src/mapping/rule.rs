//! One mapping rule: how it is written (YAML entry or flag), compiled once, and matched.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use regex::Regex;
use serde::Deserialize;

use crate::names::{AgentName, AllowedModes, Namespace};
use argocd_agent_identity::id::{IdError, SpiffeId, TrustDomain};

use super::decision::DenyReason;
use super::error::{RuleError, RuleProblem};

/// Placeholder every rule may use in its output templates: the ID's trust domain.
const TD_PLACEHOLDER: &str = "trust_domain";

/// One rule as written in the YAML file (`rules:` entries).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RuleSpec {
    pub(super) name: Option<String>,
    pub(super) template: Option<String>,
    pub(super) regex: Option<String>,
    pub(super) exact: Option<String>,
    pub(super) agent: Option<String>,
    pub(super) namespace: Option<String>,
    #[serde(default)]
    pub(super) trust_domains: Vec<String>,
    pub(super) mode: Option<String>,
    /// `agent` (default) or `admin`.
    pub(super) role: Option<String>,
}

/// How a rule recognises a SPIFFE ID.
#[derive(Debug, Clone)]
pub(super) enum Matcher {
    /// `spiffe://{trust_domain}/ns/{ns}/sa/{sa}`, compiled to an anchored regex with one
    /// named group per placeholder.
    Template { source: String, regex: Regex },
    /// Upstream-style regex over the whole ID; groups are `{1}`, `{2}`, ... and `{name}`.
    Regex { source: String, regex: Regex },
    /// Exactly this ID.
    Exact(SpiffeId),
}

impl Matcher {
    /// The regex of a template or regex rule (for the rule set's one-pass prefilter).
    pub(super) fn pattern(&self) -> Option<&str> {
        match self {
            Matcher::Template { regex, .. } | Matcher::Regex { regex, .. } => Some(regex.as_str()),
            Matcher::Exact(_) => None,
        }
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Matcher::Template { source, .. } => write!(f, "template {source}"),
            Matcher::Regex { source, .. } => write!(f, "regex {source}"),
            Matcher::Exact(id) => write!(f, "exact {id}"),
        }
    }
}

/// A piece of an output template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Var(String),
}

/// An output template such as `argocd-{sa}`.
#[derive(Debug, Clone)]
pub(super) struct OutputTemplate {
    source: String,
    pieces: Vec<Piece>,
}

impl OutputTemplate {
    fn render(&self, vars: &BTreeMap<String, String>) -> String {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Literal(s) => out.push_str(s),
                // Every variable was checked against the matcher's groups at load time; a
                // group that did not participate in the match renders empty and then fails
                // the DNS-1123 check with a clear reason.
                Piece::Var(v) => out.push_str(vars.get(v).map(String::as_str).unwrap_or("")),
            }
        }
        out
    }
}

impl fmt::Display for OutputTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// What a matching rule grants.
#[derive(Debug, Clone)]
pub(super) enum Target {
    /// The ID is this agent, with this hub namespace, in these modes.
    Agent {
        agent: OutputTemplate,
        /// `None`: the namespace is the agent name (as upstream).
        namespace: Option<OutputTemplate>,
        mode: AllowedModes,
    },
    /// The ID is an operator: it may call the admin API, never connect as an agent.
    Admin,
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub(super) struct Rule {
    pub(super) name: String,
    pub(super) matcher: Matcher,
    pub(super) target: Target,
    /// Empty: any trust domain.
    pub(super) trust_domains: Vec<TrustDomain>,
}

/// The result of trying one rule against one ID.
pub(super) enum RuleMatch {
    NoMatch,
    TrustDomainNotAllowed,
    Mapped(AgentName, Namespace, AllowedModes),
    Admin,
    Invalid(DenyReason),
}

impl Rule {
    /// Tries this rule against `id`.
    pub(super) fn apply(&self, id: &SpiffeId) -> RuleMatch {
        let mut vars = BTreeMap::new();
        match &self.matcher {
            Matcher::Exact(want) => {
                if want != id {
                    return RuleMatch::NoMatch;
                }
            }
            Matcher::Template { regex, .. } | Matcher::Regex { regex, .. } => {
                let Some(caps) = regex.captures(id.as_str()) else {
                    return RuleMatch::NoMatch;
                };
                for (i, name) in regex.capture_names().enumerate().skip(1) {
                    let value = caps
                        .get(i)
                        .map(|m| m.as_str().to_owned())
                        .unwrap_or_default();
                    if let Some(name) = name {
                        vars.insert(name.to_owned(), value.clone());
                    }
                    vars.insert(i.to_string(), value);
                }
            }
        }
        if !self.trust_domains.is_empty() && !self.trust_domains.contains(id.trust_domain()) {
            return RuleMatch::TrustDomainNotAllowed;
        }
        // Set last so a regex group named `trust_domain` cannot spoof it.
        vars.insert(
            TD_PLACEHOLDER.to_owned(),
            id.trust_domain().as_str().to_owned(),
        );
        let (agent, namespace, mode) = match &self.target {
            Target::Admin => return RuleMatch::Admin,
            Target::Agent {
                agent,
                namespace,
                mode,
            } => (agent, namespace, *mode),
        };
        let agent_str = agent.render(&vars);
        let agent = match AgentName::new(&agent_str) {
            Ok(a) => a,
            Err(e) => {
                return RuleMatch::Invalid(DenyReason::InvalidAgentName {
                    rule: self.name.clone(),
                    value: agent_str,
                    reason: name_reason(e),
                });
            }
        };
        let ns_str = match namespace {
            Some(t) => t.render(&vars),
            None => agent_str,
        };
        match Namespace::new(&ns_str) {
            Ok(ns) => RuleMatch::Mapped(agent, ns, mode),
            Err(e) => RuleMatch::Invalid(DenyReason::InvalidNamespace {
                rule: self.name.clone(),
                value: ns_str,
                reason: name_reason(e),
            }),
        }
    }
}

/// The rule-part of a name error, without repeating the value.
fn name_reason(e: IdError) -> String {
    match e {
        IdError::Name { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// Builds a rule from its written form; `default_name` is used when it has no `name`.
pub(super) fn compile(spec: RuleSpec, default_name: String) -> Result<Rule, RuleProblem> {
    let name = match spec.name {
        Some(n) if n.trim().is_empty() => return Err(RuleProblem::EmptyName),
        Some(n) => n,
        None => default_name,
    };
    let (matcher, groups, default_agent) = compile_matcher(spec.template, spec.regex, spec.exact)?;
    let mut trust_domains = Vec::new();
    for td in &spec.trust_domains {
        trust_domains.push(TrustDomain::new(td).map_err(RuleProblem::Id)?);
    }
    match spec.role.as_deref() {
        None | Some("agent") => {}
        Some("admin") => {
            for (field, given) in [
                ("agent", spec.agent.is_some()),
                ("namespace", spec.namespace.is_some()),
                ("mode", spec.mode.is_some()),
            ] {
                if given {
                    return Err(RuleProblem::AdminTarget { field });
                }
            }
            return Ok(Rule {
                name,
                matcher,
                target: Target::Admin,
                trust_domains,
            });
        }
        Some(other) => return Err(RuleProblem::Role(other.to_owned())),
    }
    let agent_src = match (spec.agent, default_agent) {
        (Some(a), _) => a,
        (None, Some(d)) => d,
        (None, None) => {
            return Err(match matcher {
                Matcher::Regex { .. } => RuleProblem::RegexNeedsAgent,
                Matcher::Template { .. } => RuleProblem::TemplateNeedsAgent,
                Matcher::Exact(_) => RuleProblem::ExactNeedsAgent,
            });
        }
    };
    let target = compile_agent_target(&agent_src, spec.namespace, spec.mode, &groups)?;
    Ok(Rule {
        name,
        matcher,
        target,
        trust_domains,
    })
}

/// Compiles the one matcher a rule names; returns it with the placeholder or group names it
/// defines and the agent template to use when the rule gives none.
fn compile_matcher(
    template: Option<String>,
    regex: Option<String>,
    exact: Option<String>,
) -> Result<(Matcher, BTreeSet<String>, Option<String>), RuleProblem> {
    match (template, regex, exact) {
        (Some(t), None, None) => {
            let (regex, names) = compile_id_template(&t)?;
            // A template that names an `{agent}` placeholder needs no `agent:` line.
            let default_agent = names.contains("agent").then(|| "{agent}".to_owned());
            Ok((Matcher::Template { source: t, regex }, names, default_agent))
        }
        (None, Some(r), None) => {
            let regex = match Regex::new(&format!("^(?:{r})$")) {
                Ok(regex) => regex,
                Err(cause) => return Err(RuleProblem::Regex { regex: r, cause }),
            };
            let mut groups = BTreeSet::new();
            for (i, n) in regex.capture_names().enumerate().skip(1) {
                groups.insert(i.to_string());
                if let Some(n) = n {
                    groups.insert(n.to_owned());
                }
            }
            // Upstream takes the agent name from the first capture group.
            let default_agent = (regex.captures_len() > 1).then(|| "{1}".to_owned());
            Ok((Matcher::Regex { source: r, regex }, groups, default_agent))
        }
        (None, None, Some(e)) => {
            let id = SpiffeId::parse(&e).map_err(RuleProblem::Id)?;
            Ok((Matcher::Exact(id), BTreeSet::new(), None))
        }
        (None, None, None) => Err(RuleProblem::NoMatcher),
        _ => Err(RuleProblem::ManyMatchers),
    }
}

/// Compiles an agent rule's target: its agent and namespace templates and its mode.
fn compile_agent_target(
    agent_src: &str,
    namespace: Option<String>,
    mode: Option<String>,
    groups: &BTreeSet<String>,
) -> Result<Target, RuleProblem> {
    let agent = compile_output("agent", agent_src, groups, |s| AgentName::new(s).map(drop))?;
    let namespace = namespace
        .map(|n| compile_output("namespace", &n, groups, |s| Namespace::new(s).map(drop)))
        .transpose()?;
    let mode = match mode {
        Some(m) => m.parse::<AllowedModes>().map_err(RuleProblem::Mode)?,
        // The hub decides: a rule that names no mode grants managed only.
        None => AllowedModes::default(),
    };
    Ok(Target::Agent {
        agent,
        namespace,
        mode,
    })
}

/// Splits `src` into literals and `{name}` placeholders.
fn split_placeholders(src: &str) -> Result<Vec<Piece>, RuleProblem> {
    let mut pieces = Vec::new();
    let mut rest = src;
    while !rest.is_empty() {
        match rest.find(['{', '}']) {
            None => {
                pieces.push(Piece::Literal(rest.to_owned()));
                break;
            }
            Some(i) if rest.as_bytes()[i] == b'}' => {
                return Err(RuleProblem::UnmatchedClose {
                    src: src.to_owned(),
                });
            }
            Some(i) => {
                if i > 0 {
                    pieces.push(Piece::Literal(rest[..i].to_owned()));
                }
                let after = &rest[i + 1..];
                let end = after.find('}').ok_or_else(|| RuleProblem::Unclosed {
                    src: src.to_owned(),
                })?;
                let var = &after[..end];
                let valid =
                    !var.is_empty() && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !valid {
                    return Err(RuleProblem::PlaceholderName {
                        var: var.to_owned(),
                        src: src.to_owned(),
                    });
                }
                pieces.push(Piece::Var(var.to_owned()));
                rest = &after[end + 1..];
            }
        }
    }
    Ok(pieces)
}

/// Compiles a SPIFFE ID template to an anchored regex; returns it with its placeholder names.
fn compile_id_template(src: &str) -> Result<(Regex, BTreeSet<String>), RuleProblem> {
    let Some(rest) = src.strip_prefix("spiffe://") else {
        return Err(RuleProblem::TemplateScheme {
            src: src.to_owned(),
        });
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let mut pattern = String::from("^spiffe://");
    let mut names = BTreeSet::new();
    // The structure (segments, characters) is checked by parsing a sample ID in which every
    // placeholder is replaced by a valid segment.
    let mut sample = String::from("spiffe://");
    match split_placeholders(authority)?.as_slice() {
        [Piece::Var(v)] if v == TD_PLACEHOLDER => {
            pattern.push_str("(?P<trust_domain>[a-z0-9._-]+)");
            sample.push_str("td");
            names.insert(TD_PLACEHOLDER.to_owned());
        }
        [Piece::Literal(l)] => {
            pattern.push_str(&regex::escape(l));
            sample.push_str(l);
        }
        _ => {
            return Err(RuleProblem::TemplateTrustDomain {
                src: src.to_owned(),
            });
        }
    }
    for piece in split_placeholders(path)? {
        match piece {
            Piece::Literal(l) => {
                pattern.push_str(&regex::escape(&l));
                sample.push_str(&l);
            }
            Piece::Var(v) => {
                if v == TD_PLACEHOLDER {
                    return Err(RuleProblem::TrustDomainInPath {
                        src: src.to_owned(),
                    });
                }
                if v.starts_with(|c: char| c.is_ascii_digit()) {
                    return Err(RuleProblem::PlaceholderDigit {
                        var: v,
                        src: src.to_owned(),
                    });
                }
                if !names.insert(v.clone()) {
                    return Err(RuleProblem::PlaceholderTwice {
                        var: v,
                        src: src.to_owned(),
                    });
                }
                // One placeholder never crosses a '/': it matches within one segment.
                pattern.push_str(&format!("(?P<{v}>[A-Za-z0-9._-]+)"));
                sample.push('x');
            }
        }
    }
    pattern.push('$');
    SpiffeId::parse(&sample).map_err(|cause| RuleProblem::TemplateUnmatchable {
        src: src.to_owned(),
        cause,
    })?;
    let regex = Regex::new(&pattern).map_err(|cause| RuleProblem::TemplateRegex {
        src: src.to_owned(),
        cause,
    })?;
    Ok((regex, names))
}

/// Compiles an output template, checking that it only uses known placeholders and that its
/// literal text can be part of a DNS-1123 label (otherwise the rule could never allow anyone).
fn compile_output(
    what: &'static str,
    src: &str,
    groups: &BTreeSet<String>,
    validate: impl Fn(&str) -> Result<(), IdError>,
) -> Result<OutputTemplate, RuleProblem> {
    let pieces = split_placeholders(src).map_err(|cause| RuleProblem::Output {
        what,
        cause: Box::new(cause),
    })?;
    if pieces.is_empty() {
        return Err(RuleProblem::EmptyOutput { what });
    }
    let mut has_var = false;
    for p in &pieces {
        match p {
            Piece::Var(v) => {
                has_var = true;
                if v != TD_PLACEHOLDER && !groups.contains(v) {
                    let known: Vec<String> = groups
                        .iter()
                        .map(|g| format!("{{{g}}}"))
                        .chain([format!("{{{TD_PLACEHOLDER}}}")])
                        .collect();
                    return Err(RuleProblem::UnknownPlaceholder {
                        what,
                        src: src.to_owned(),
                        var: v.clone(),
                        known: known.join(", "),
                    });
                }
            }
            Piece::Literal(l) => {
                if let Some(c) = l
                    .chars()
                    .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '-'))
                {
                    return Err(RuleProblem::NotDns {
                        what,
                        src: src.to_owned(),
                        c,
                    });
                }
            }
        }
    }
    if !has_var {
        validate(src).map_err(RuleProblem::Id)?;
    }
    Ok(OutputTemplate {
        source: src.to_owned(),
        pieces,
    })
}

/// Parses one rule flag (see the module docs of [`super`] for the syntax).
pub(super) fn parse_flag(flag: &str, default_name: String) -> Result<Rule, RuleError> {
    let err = |reason: RuleProblem| RuleError::Flag {
        flag: argocd_agent_identity::id::quote(flag),
        reason: Box::new(reason),
    };
    let mut spec = RuleSpec::default();
    if let Some(re) = flag.strip_prefix("mtls:uri:") {
        // The whole remainder is the regex: it may contain ',' and '=>', so no options.
        spec.regex = Some(re.to_owned());
        // Upstream's form, with upstream's behaviour: the agent chooses its mode. (A
        // `regex:` rule in a rules file can name one.)
        spec.mode = Some("both".into());
    } else if let Some(rest) = flag.strip_prefix("template:") {
        let (pattern, opts) = split_arrow(rest);
        spec.template = Some(pattern.to_owned());
        apply_options(&mut spec, opts).map_err(err)?;
    } else if let Some(rest) = flag.strip_prefix("admin:") {
        // `admin:<spiffe-id>[,name=<n>]`: one operator identity.
        let (id, opts) = match rest.split_once(',') {
            Some((id, opts)) => (id, Some(opts)),
            None => (rest, None),
        };
        spec.exact = Some(id.to_owned());
        spec.role = Some("admin".into());
        if let Some(opts) = opts {
            apply_options(&mut spec, Some(&format!(",{opts}"))).map_err(err)?;
        }
    } else if let Some(rest) = flag.strip_prefix("exact:") {
        let (id, opts) = split_arrow(rest);
        spec.exact = Some(id.to_owned());
        apply_options(&mut spec, opts).map_err(err)?;
    } else if flag.starts_with("mtls:") {
        return Err(err(RuleProblem::MtlsForm));
    } else {
        return Err(err(RuleProblem::FlagForm));
    }
    compile(spec, default_name).map_err(err)
}

/// Splits `<pattern>=><options>`; no arrow means no options.
fn split_arrow(s: &str) -> (&str, Option<&str>) {
    match s.split_once("=>") {
        Some((p, o)) => (p, Some(o)),
        None => (s, None),
    }
}

/// Applies `<agent>[,namespace=..][,mode=..][,trustDomains=a|b][,name=..][,role=..]`.
fn apply_options(spec: &mut RuleSpec, opts: Option<&str>) -> Result<(), RuleProblem> {
    let Some(opts) = opts else {
        return Ok(());
    };
    let mut parts = opts.split(',');
    let agent = parts.next().unwrap_or_default();
    if agent.contains('=') {
        return Err(RuleProblem::AgentFirst(agent.to_owned()));
    }
    if !agent.is_empty() {
        spec.agent = Some(agent.to_owned());
    }
    let mut seen = BTreeSet::new();
    for part in parts {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| RuleProblem::OptionNotKeyValue(part.to_owned()))?;
        if !seen.insert(k) {
            return Err(RuleProblem::OptionTwice(k.to_owned()));
        }
        match k {
            "namespace" => spec.namespace = Some(v.to_owned()),
            "mode" => spec.mode = Some(v.to_owned()),
            "name" => spec.name = Some(v.to_owned()),
            "role" => spec.role = Some(v.to_owned()),
            "trustDomains" => {
                spec.trust_domains = v.split('|').map(str::to_owned).collect();
            }
            other => {
                return Err(RuleProblem::UnknownOption(other.to_owned()));
            }
        }
    }
    Ok(())
}
