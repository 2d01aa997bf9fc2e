//! The ordered rule list ([`RuleSet`]): parsing from YAML and flags, and mapping an ID to an
//! agent or an operator.

use crate::client::ClientIdentity;
use crate::names::{AllowedModes, Namespace};
use crate::tenant::{TenantSpec, Tenants};
use argocd_agent_identity::id::SpiffeId;

use super::decision::{
    AdminGrant, AdminScope, AgentIdentity, DenyReason, HEADER_NAME_RULE, MappingDenied,
};
use super::error::{RuleError, RuleProblem};
use super::explain::{Explanation, RuleStep, StepOutcome};
use super::rule::{self, Rule, RuleMatch, RuleSpec, Target};

/// The top level of a rules file. `rules` is required so that an empty (or truncated while
/// being written) file is an error, not "deny everyone".
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    rules: Vec<RuleSpec>,
    #[serde(default)]
    tenants: Vec<TenantSpec>,
}

/// Finds a rule whose name an earlier rule already uses: names exist to tell rules apart
/// in logs. Returns its 1-based index, its name and the reason.
fn duplicate_name(rules: &[Rule]) -> Option<(usize, String, RuleProblem)> {
    let mut seen = std::collections::BTreeMap::new();
    for (i, r) in rules.iter().enumerate() {
        if let Some(first) = seen.insert(r.name.as_str(), i + 1) {
            return Some((
                i + 1,
                r.name.clone(),
                RuleProblem::DuplicateName {
                    name: r.name.clone(),
                    first,
                },
            ));
        }
    }
    None
}

/// An ordered, immutable list of mapping rules. Cheap to share in an `Arc`.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    rules: Vec<Rule>,
    prefilter: Prefilter,
    tenants: std::sync::Arc<Tenants>,
}

/// Every template and regex rule's pattern in one `RegexSet`, so an ID is scanned once for
/// all of them instead of once per rule (1,000 template rules cost ~6 ms per ID one by one,
/// see docs/benchmarks.md); only the rules it says match run their own regex for captures.
#[derive(Debug, Clone, Default)]
struct Prefilter {
    set: Option<regex::RegexSet>,
    /// Rule index -> index in `set` (exact rules have none).
    of_rule: Vec<Option<usize>>,
}

impl Prefilter {
    fn new(rules: &[Rule]) -> Prefilter {
        let mut patterns = Vec::new();
        let of_rule = rules
            .iter()
            .map(|r| {
                r.matcher.pattern().map(|p| {
                    patterns.push(p.to_owned());
                    patterns.len() - 1
                })
            })
            .collect();
        // A set too large for the regex crate's limits falls back to one regex per rule.
        let set = (!patterns.is_empty())
            .then(|| regex::RegexSet::new(&patterns).ok())
            .flatten();
        Prefilter { set, of_rule }
    }
}

impl RuleSet {
    fn from_rules(rules: Vec<Rule>) -> RuleSet {
        let prefilter = Prefilter::new(&rules);
        RuleSet {
            rules,
            prefilter,
            tenants: Default::default(),
        }
    }

    /// The tenants declared with these rules (empty when none is).
    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// Which patterns match `id` (one pass over all of them).
    fn hits(&self, id: &SpiffeId) -> Option<regex::SetMatches> {
        self.prefilter.set.as_ref().map(|s| s.matches(id.as_str()))
    }

    /// Whether rule `i` can match, given [`RuleSet::hits`]: exact rules always can.
    fn may_match(&self, hits: &Option<regex::SetMatches>, i: usize) -> bool {
        match (hits, self.prefilter.of_rule.get(i).copied().flatten()) {
            (Some(hits), Some(si)) => hits.matched(si),
            _ => true,
        }
    }
}

impl RuleSet {
    /// Parses a YAML rules document (see the module docs for the format).
    pub fn from_yaml(text: &str) -> Result<RuleSet, RuleError> {
        let blank = text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
        if blank {
            return Err(RuleError::Yaml(
                "the document is empty; write `rules: []` to deny every SPIFFE ID".into(),
            ));
        }
        let file: RuleFile =
            serde_saphyr::from_str(text).map_err(|e| RuleError::Yaml(e.to_string()))?;
        let mut rules = Vec::with_capacity(file.rules.len());
        for (i, spec) in file.rules.into_iter().enumerate() {
            let index = i + 1;
            let default_name = format!("rule-{index}");
            let shown = spec.name.clone().unwrap_or_else(|| default_name.clone());
            let rule = rule::compile(spec, default_name).map_err(|reason| RuleError::Rule {
                index,
                name: shown,
                reason: Box::new(reason),
            })?;
            rules.push(rule);
        }
        if let Some((index, name, reason)) = duplicate_name(&rules) {
            return Err(RuleError::Rule {
                index,
                name,
                reason: Box::new(reason),
            });
        }
        let tenants = Tenants::from_specs(file.tenants)?;
        let mut set = RuleSet::from_rules(rules);
        set.tenants = std::sync::Arc::new(tenants);
        Ok(set)
    }

    /// Reads and parses a YAML rules file; errors name the file.
    pub fn from_file(path: &std::path::Path) -> Result<RuleSet, RuleError> {
        let text = std::fs::read_to_string(path).map_err(|cause| RuleError::Read {
            path: path.to_owned(),
            cause,
        })?;
        RuleSet::from_yaml(&text).map_err(|e| RuleError::File {
            path: path.to_owned(),
            cause: Box::new(e),
        })
    }

    /// Parses rule flags (see the module docs for the syntax), in order.
    pub fn from_flags(flags: &[String]) -> Result<RuleSet, RuleError> {
        let mut rules = Vec::with_capacity(flags.len());
        for (i, flag) in flags.iter().enumerate() {
            rules.push(rule::parse_flag(flag, format!("flag-{}", i + 1))?);
        }
        if let Some((index, _, reason)) = duplicate_name(&rules) {
            return Err(RuleError::Flag {
                flag: argocd_agent_identity::id::quote(&flags[index - 1]),
                reason: Box::new(reason),
            });
        }
        Ok(RuleSet::from_rules(rules))
    }

    /// This set's rules followed by `other`'s.
    /// Tenants come from the file only (flags declare none): `self`'s are kept.
    pub fn append(mut self, other: RuleSet) -> RuleSet {
        self.rules.extend(other.rules);
        let tenants = self.tenants;
        let mut set = RuleSet::from_rules(self.rules);
        set.tenants = tenants;
        set
    }

    /// Whether there are no rules (every ID is denied).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Maps `id` to an agent: the first matching rule decides; no match denies.
    pub fn map(&self, id: &SpiffeId) -> Result<AgentIdentity, MappingDenied> {
        self.evaluate(id, None)
    }

    /// Maps any caller: a SPIFFE ID through the rules ([`RuleSet::map`]); an agent name from
    /// an upstream-style header capture is its own agent and hub namespace, in either mode.
    pub fn map_client(&self, client: &ClientIdentity) -> Result<AgentIdentity, MappingDenied> {
        match client {
            ClientIdentity::Spiffe(id) => self.map(id),
            ClientIdentity::AgentName(agent) => {
                let namespace = Namespace::new(agent.as_str()).map_err(|e| MappingDenied {
                    client: client.clone(),
                    reason: DenyReason::InvalidNamespace {
                        rule: HEADER_NAME_RULE.into(),
                        value: agent.to_string(),
                        reason: e.to_string(),
                    },
                })?;
                let tenant =
                    self.tenants
                        .check_agent(None, &namespace)
                        .map_err(|r| MappingDenied {
                            client: client.clone(),
                            reason: DenyReason::Tenant(r),
                        })?;
                Ok(AgentIdentity {
                    client: client.clone(),
                    agent: agent.clone(),
                    namespace,
                    allowed_modes: AllowedModes::Both,
                    rule: HEADER_NAME_RULE.into(),
                    tenant,
                })
            }
        }
    }

    /// Whether `client` may call the admin API, and over what. A tenant's operator (its
    /// `admins` patterns) is admitted for that tenant only, whatever the rules say: the
    /// narrower grant wins. Otherwise the first rule that matches its SPIFFE ID decides, and
    /// only a `role: admin` rule allows, over every agent.
    pub fn authorize_admin(&self, client: &ClientIdentity) -> Result<AdminGrant, MappingDenied> {
        let denied = |reason| MappingDenied {
            client: client.clone(),
            reason,
        };
        let ClientIdentity::Spiffe(id) = client else {
            return Err(denied(DenyReason::NotAdmin { rule: None }));
        };
        if let Some(t) = self.tenants.of_admin(id) {
            return Ok(AdminGrant {
                rule: format!("tenant {}", t.name),
                scope: AdminScope::Tenant(t.name.clone()),
            });
        }
        let hits = self.hits(id);
        for (i, rule) in self.rules.iter().enumerate() {
            if !self.may_match(&hits, i) {
                continue;
            }
            match rule.apply(id) {
                RuleMatch::NoMatch | RuleMatch::TrustDomainNotAllowed => continue,
                RuleMatch::Admin => {
                    return Ok(AdminGrant {
                        rule: rule.name.clone(),
                        scope: AdminScope::Platform,
                    });
                }
                RuleMatch::Mapped(..) | RuleMatch::Invalid(_) => {
                    return Err(denied(DenyReason::NotAdmin {
                        rule: Some(rule.name.clone()),
                    }));
                }
            }
        }
        Err(denied(DenyReason::NoRuleMatched {
            tried: self.rules.len(),
        }))
    }

    /// Whether any rule gives the admin role, or any tenant names operators.
    pub fn has_admin_rules(&self) -> bool {
        self.rules.iter().any(|r| matches!(r.target, Target::Admin))
            || self.tenants.iter().any(|t| !t.admin_patterns().is_empty())
    }

    /// Like [`RuleSet::map`], and records what every rule did.
    pub fn explain(&self, id: &SpiffeId) -> Explanation {
        let mut steps = Vec::with_capacity(self.rules.len());
        let decision = self.evaluate(id, Some(&mut steps));
        Explanation {
            spiffe_id: id.clone(),
            steps,
            decision,
        }
    }

    fn evaluate(
        &self,
        id: &SpiffeId,
        mut steps: Option<&mut Vec<RuleStep>>,
    ) -> Result<AgentIdentity, MappingDenied> {
        let explaining = steps.is_some();
        let hits = self.hits(id);
        let mut record = |rule: &Rule, outcome: StepOutcome| {
            if let Some(steps) = steps.as_deref_mut() {
                steps.push(RuleStep {
                    rule: rule.name.clone(),
                    pattern: rule.matcher.to_string(),
                    outcome,
                });
            }
        };
        let mut decision = None;
        for (i, rule) in self.rules.iter().enumerate() {
            if decision.is_some() {
                if !explaining {
                    break;
                }
                record(rule, StepOutcome::NotEvaluated);
                continue;
            }
            let outcome = if self.may_match(&hits, i) {
                rule.apply(id)
            } else {
                RuleMatch::NoMatch
            };
            let (step, decided) = self.decide(id, rule, outcome);
            record(rule, step);
            decision = decided;
        }
        decision.unwrap_or_else(|| {
            Err(MappingDenied {
                client: id.clone().into(),
                reason: DenyReason::NoRuleMatched {
                    tried: self.rules.len(),
                },
            })
        })
    }

    /// What one rule's match means for `id`: the step to record, and the decision if the
    /// rule decides.
    fn decide(
        &self,
        id: &SpiffeId,
        rule: &Rule,
        outcome: RuleMatch,
    ) -> (StepOutcome, Option<Result<AgentIdentity, MappingDenied>>) {
        let denied = |reason: DenyReason| {
            let err = MappingDenied {
                client: id.clone().into(),
                reason: reason.clone(),
            };
            (StepOutcome::Denied(reason), Some(Err(err)))
        };
        match outcome {
            RuleMatch::NoMatch => (StepOutcome::NoMatch, None),
            RuleMatch::TrustDomainNotAllowed => (
                StepOutcome::TrustDomainNotAllowed {
                    trust_domain: id.trust_domain().clone(),
                    allowed: rule.trust_domains.clone(),
                },
                None,
            ),
            RuleMatch::Invalid(reason) => denied(reason),
            RuleMatch::Admin => denied(DenyReason::AdminRole {
                rule: rule.name.clone(),
            }),
            RuleMatch::Mapped(agent, namespace, allowed_modes) => {
                match self.tenants.check_agent(Some(id), &namespace) {
                    Ok(tenant) => (
                        StepOutcome::Matched,
                        Some(Ok(AgentIdentity {
                            client: id.clone().into(),
                            agent,
                            namespace,
                            allowed_modes,
                            rule: rule.name.clone(),
                            tenant,
                        })),
                    ),
                    Err(refusal) => denied(DenyReason::Tenant(refusal)),
                }
            }
        }
    }
}
