//! What every rule did with one ID ([`Explanation`]), for `identity explain` and logs.

use std::fmt;

use argocd_agent_identity::id::{SpiffeId, TrustDomain};

use super::decision::{AgentIdentity, DenyReason, MappingDenied};

/// What one rule did with an ID.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepOutcome {
    /// The pattern did not match.
    NoMatch,
    /// The pattern matched but the ID's trust domain is not in the rule's list; skipped.
    TrustDomainNotAllowed {
        /// The ID's trust domain.
        trust_domain: TrustDomain,
        /// The rule's list.
        allowed: Vec<TrustDomain>,
    },
    /// The rule matched and decided: allowed.
    Matched,
    /// The rule matched and decided: denied.
    Denied(DenyReason),
    /// An earlier rule decided.
    NotEvaluated,
}

/// One line of an [`Explanation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleStep {
    /// The rule's name.
    pub rule: String,
    /// The rule's pattern, e.g. `template spiffe://{trust_domain}/ns/{ns}/sa/{sa}`.
    pub pattern: String,
    /// What it did.
    pub outcome: StepOutcome,
}

/// Every rule tried for one ID and the final decision (for `identity explain` and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// The ID.
    pub spiffe_id: SpiffeId,
    /// One entry per rule, in order.
    pub steps: Vec<RuleStep>,
    /// What [`RuleSet::map`](crate::mapping::RuleSet::map) returns.
    pub decision: Result<AgentIdentity, MappingDenied>,
}

impl Explanation {
    /// Whether the ID was allowed.
    pub fn is_allowed(&self) -> bool {
        self.decision.is_ok()
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "SPIFFE ID: {}", self.spiffe_id)?;
        if self.steps.is_empty() {
            writeln!(f, "rules: none configured")?;
        } else {
            writeln!(f, "rules:")?;
        }
        for (i, s) in self.steps.iter().enumerate() {
            let what = match &s.outcome {
                StepOutcome::NoMatch => "no match".to_owned(),
                StepOutcome::TrustDomainNotAllowed {
                    trust_domain,
                    allowed,
                } => {
                    let list: Vec<&str> = allowed.iter().map(TrustDomain::as_str).collect();
                    format!(
                        "skipped: trust domain \"{trust_domain}\" is not in trustDomains [{}]",
                        list.join(", ")
                    )
                }
                StepOutcome::Matched => "MATCHED".to_owned(),
                StepOutcome::Denied(reason) => format!("matched, DENIED: {reason}"),
                StepOutcome::NotEvaluated => "not evaluated (an earlier rule decided)".to_owned(),
            };
            writeln!(f, "  {}. {} ({}): {what}", i + 1, s.rule, s.pattern)?;
        }
        match &self.decision {
            Ok(id) => {
                writeln!(f, "decision: ALLOWED")?;
                writeln!(f, "  rule:          {}", id.rule)?;
                writeln!(f, "  agent:         {}", id.agent)?;
                writeln!(f, "  namespace:     {}", id.namespace)?;
                if let Some(t) = &id.tenant {
                    writeln!(f, "  tenant:        {t}")?;
                }
                write!(f, "  allowed modes: {}", id.allowed_modes)
            }
            Err(d) => write!(f, "decision: DENIED: {}", d.reason),
        }
    }
}
