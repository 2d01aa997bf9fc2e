//! Why a rule file or flag cannot be loaded ([`RuleError`]).

use argocd_agent_identity::text::quoted;
use std::path::PathBuf;

use crate::names::ModeParseError;
use crate::tenant::TenantError;
use argocd_agent_identity::id::IdError;

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
        reason: Box<RuleProblem>,
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
        reason: Box<RuleProblem>,
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

/// What is wrong with one rule (the `reason` of [`RuleError::Rule`] and [`RuleError::Flag`]).
/// Messages carry their cause, so no variant has a `source`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuleProblem {
    /// `name:` is blank.
    #[error("`name` must not be empty")]
    EmptyName,
    /// A `regex:` does not compile.
    #[error("regex {} does not compile: {cause}", quoted(.regex))]
    Regex {
        /// The regex as written.
        regex: String,
        /// Why it does not compile.
        cause: regex::Error,
    },
    /// An ID, trust domain or literal name is invalid.
    #[error("{0}")]
    Id(IdError),
    /// None of `template`, `regex`, `exact`.
    #[error("needs one of `template`, `regex` or `exact`")]
    NoMatcher,
    /// More than one of `template`, `regex`, `exact`.
    #[error("has more than one of `template`, `regex` and `exact`")]
    ManyMatchers,
    /// An admin rule names an agent-side field.
    #[error(
        "an admin rule maps to no agent: remove `{field}` (role: admin grants the operator API only)"
    )]
    AdminTarget {
        /// The field given.
        field: &'static str,
    },
    /// `role:` is neither `agent` nor `admin`.
    #[error("role {} is not one of: agent, admin", quoted(.0))]
    Role(String),
    /// A regex rule without a capture group or `agent`.
    #[error("a regex rule needs a capture group for the agent name, or `agent`")]
    RegexNeedsAgent,
    /// A template rule without `{agent}` or `agent`.
    #[error("a template rule needs `agent` (or an `{{agent}}` placeholder)")]
    TemplateNeedsAgent,
    /// An exact rule without `agent`.
    #[error("an exact rule needs `agent`")]
    ExactNeedsAgent,
    /// `mode:` is not a mode.
    #[error("{0}")]
    Mode(ModeParseError),
    /// A '}' without its '{'.
    #[error("unmatched '}}' in {}", quoted(.src))]
    UnmatchedClose {
        /// The template.
        src: String,
    },
    /// A '{' without its '}'.
    #[error("unclosed '{{' in {}", quoted(.src))]
    Unclosed {
        /// The template.
        src: String,
    },
    /// A placeholder that is not a name.
    #[error("placeholder {{{var}}} in {} must be a name of letters, digits and '_'", quoted(.src))]
    PlaceholderName {
        /// The placeholder.
        var: String,
        /// The template.
        src: String,
    },
    /// An ID template without the scheme.
    #[error("template {} must start with \"spiffe://\"", quoted(.src))]
    TemplateScheme {
        /// The template.
        src: String,
    },
    /// An ID template whose trust domain mixes literals and placeholders.
    #[error("template {}: the trust domain must be a literal or exactly {{trust_domain}}", quoted(.src))]
    TemplateTrustDomain {
        /// The template.
        src: String,
    },
    /// `{trust_domain}` in the path of an ID template.
    #[error("template {}: {{trust_domain}} may only stand for the trust domain", quoted(.src))]
    TrustDomainInPath {
        /// The template.
        src: String,
    },
    /// A placeholder starting with a digit.
    #[error("template {}: placeholder {{{var}}} must not start with a digit", quoted(.src))]
    PlaceholderDigit {
        /// The placeholder.
        var: String,
        /// The template.
        src: String,
    },
    /// A placeholder used twice in an ID template.
    #[error("template {}: placeholder {{{var}}} appears twice", quoted(.src))]
    PlaceholderTwice {
        /// The placeholder.
        var: String,
        /// The template.
        src: String,
    },
    /// An ID template no valid SPIFFE ID can match.
    #[error("template {} cannot match any valid SPIFFE ID: {cause}", quoted(.src))]
    TemplateUnmatchable {
        /// The template.
        src: String,
        /// Why the sample ID is invalid.
        cause: IdError,
    },
    /// An ID template whose regex does not compile.
    #[error("template {} does not compile: {cause}", quoted(.src))]
    TemplateRegex {
        /// The template.
        src: String,
        /// Why it does not compile.
        cause: regex::Error,
    },
    /// An output template (`agent`, `namespace`) with bad placeholders.
    #[error("{what}: {cause}")]
    Output {
        /// `agent` or `namespace`.
        what: &'static str,
        /// What is wrong with its placeholders.
        cause: Box<RuleProblem>,
    },
    /// An empty output template.
    #[error("{what} must not be empty")]
    EmptyOutput {
        /// `agent` or `namespace`.
        what: &'static str,
    },
    /// An output template using a placeholder the rule does not define.
    #[error("{what} {} uses {{{var}}}, which the rule does not define (known: {known})", quoted(.src))]
    UnknownPlaceholder {
        /// `agent` or `namespace`.
        what: &'static str,
        /// The template.
        src: String,
        /// The placeholder.
        var: String,
        /// The placeholders it may use, as `{a}, {b}`.
        known: String,
    },
    /// An output template whose literal text can never be in a DNS-1123 label.
    #[error("{what} {} contains '{}', which can never be part of a DNS-1123 label", quoted(.src), .c.escape_debug())]
    NotDns {
        /// `agent` or `namespace`.
        what: &'static str,
        /// The template.
        src: String,
        /// The offending character.
        c: char,
    },
    /// A flag whose first option is `key=value` instead of the agent.
    #[error("the first item after \"=>\" is the agent template, got {}", quoted(.0))]
    AgentFirst(String),
    /// A flag option without `=`.
    #[error("option {} must be key=value", quoted(.0))]
    OptionNotKeyValue(String),
    /// A flag option given twice.
    #[error("option {} given twice", quoted(.0))]
    OptionTwice(String),
    /// A flag option that does not exist.
    #[error("unknown option {} (known: namespace, mode, trustDomains, name, role)", quoted(.0))]
    UnknownOption(String),
    /// A `mtls:` flag in another form than `mtls:uri:`.
    #[error(
        "only the \"mtls:uri:<regex>\" form is supported (identities are SPIFFE IDs, not subjects)"
    )]
    MtlsForm,
    /// A flag of no known form.
    #[error(
        "expected \"mtls:uri:<regex>\", \"template:<template>=><agent>[,option=value...]\", \"exact:<spiffe-id>=><agent>[,option=value...]\" or \"admin:<spiffe-id>\""
    )]
    FlagForm,
    /// Two rules with one name.
    #[error("rule name \"{name}\" is already used by rule {first}")]
    DuplicateName {
        /// The name.
        name: String,
        /// The 1-based position of the first rule with it.
        first: usize,
    },
}
