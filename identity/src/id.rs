//! SPIFFE IDs and trust domains, parsed strictly by the rules of the SPIFFE ID specification
//! (SPIFFE-ID.md). A [`SpiffeId`] or [`TrustDomain`] that exists is valid: parsing happens once,
//! at the edge, and the rest of the code never sees a raw string.
//!
//! The parser is written by hand because general URI parsers (`url`, `http::Uri`) accept and
//! normalise forms the SPIFFE spec forbids (percent-encoding, dot segments, ports, uppercase
//! hosts), and silently normalising an identity is exactly what must not happen here.

use crate::text::quoted;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The only scheme a SPIFFE ID may have, lowercase.
const SCHEME_PREFIX: &str = "spiffe://";

/// Maximum length of a SPIFFE ID in bytes (SPIFFE-ID.md, "Maximum SPIFFE ID Length").
pub const MAX_SPIFFE_ID_LEN: usize = 2048;

/// Longest slice of the offending input quoted in an error, so a hostile 1 MiB header
/// cannot flood the logs.
const MAX_QUOTED: usize = 256;

/// Which rule of the SPIFFE ID specification (or of a name) an input broke.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdRule {
    /// The input is empty.
    Empty,
    /// The input does not start with `spiffe://`.
    MissingScheme,
    /// The input has a scheme other than exactly `spiffe` (lowercase).
    WrongScheme(String),
    /// Nothing between `spiffe://` and the path.
    MissingTrustDomain,
    /// The authority carries a port (`:`).
    Port,
    /// The authority carries userinfo (`@`).
    UserInfo,
    /// The input carries a query (`?`).
    Query,
    /// The input carries a fragment (`#`).
    Fragment,
    /// The input contains `%`; percent-encoding is not allowed anywhere.
    PercentEncoding,
    /// The trust domain contains an uppercase letter.
    TrustDomainUppercase,
    /// The trust domain contains a character outside `[a-z0-9._-]`.
    TrustDomainChar(char),
    /// A path segment is empty (`//`).
    EmptySegment,
    /// A path segment is `.` or `..`.
    DotSegment,
    /// The path ends with `/`.
    TrailingSlash,
    /// A path segment contains a character outside `[a-zA-Z0-9._-]`.
    PathChar(char),
    /// The path does not start with `/` (only reachable through [`SpiffeId::new`]).
    PathNotAbsolute,
    /// The ID is longer than [`MAX_SPIFFE_ID_LEN`] bytes.
    TooLong(usize),
    /// A trust domain given to [`TrustDomain::new`] in `spiffe://` form carries a path.
    TrustDomainHasPath,
}

impl fmt::Display for IdRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdRule::Empty => f.write_str("is empty"),
            IdRule::MissingScheme => f.write_str("must start with \"spiffe://\""),
            IdRule::WrongScheme(s) => {
                write!(
                    f,
                    "scheme must be exactly \"spiffe\" (lowercase), got {s}",
                    s = quoted(&s)
                )
            }
            IdRule::MissingTrustDomain => f.write_str("trust domain is missing"),
            IdRule::Port => f.write_str("a port is not allowed"),
            IdRule::UserInfo => f.write_str("userinfo (\"user@\") is not allowed"),
            IdRule::Query => f.write_str("a query (\"?\") is not allowed"),
            IdRule::Fragment => f.write_str("a fragment (\"#\") is not allowed"),
            IdRule::PercentEncoding => f.write_str("percent-encoding (\"%\") is not allowed"),
            IdRule::TrustDomainUppercase => f.write_str("trust domain must be lowercase"),
            IdRule::TrustDomainChar(c) => write!(
                f,
                "trust domain may only contain a-z, 0-9, '.', '-' and '_', found '{}'",
                c.escape_debug()
            ),
            IdRule::EmptySegment => f.write_str("path segments must not be empty (\"//\")"),
            IdRule::DotSegment => f.write_str("path segments must not be \".\" or \"..\""),
            IdRule::TrailingSlash => f.write_str("path must not end with \"/\""),
            IdRule::PathChar(c) => write!(
                f,
                "path segments may only contain a-z, A-Z, 0-9, '.', '-' and '_', found '{}'",
                c.escape_debug()
            ),
            IdRule::PathNotAbsolute => f.write_str("path must be empty or start with \"/\""),
            IdRule::TooLong(n) => write!(
                f,
                "is {n} bytes long, the maximum is {MAX_SPIFFE_ID_LEN} bytes"
            ),
            IdRule::TrustDomainHasPath => {
                f.write_str("a trust domain must not have a path (\"spiffe://td\" only)")
            }
        }
    }
}

/// Why a SPIFFE ID, trust domain, agent name or namespace was rejected. The message names
/// the kind of value, quotes the input and says which rule failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// Not a valid SPIFFE ID.
    #[error("invalid SPIFFE ID {input}: {rule}", input = quoted(.input))]
    SpiffeId {
        /// The rejected input (truncated when very long).
        input: String,
        /// The rule it broke.
        rule: IdRule,
    },
    /// Not a valid trust domain.
    #[error("invalid trust domain {input}: {rule}", input = quoted(.input))]
    TrustDomain {
        /// The rejected input (truncated when very long).
        input: String,
        /// The rule it broke.
        rule: IdRule,
    },
    /// Not a valid agent name or namespace (DNS-1123 label).
    #[error("invalid {what} {input}: {reason}", input = quoted(.input))]
    Name {
        /// What kind of name: `agent name` or `namespace`.
        what: &'static str,
        /// The rejected input (truncated when very long).
        input: String,
        /// Which rule failed.
        reason: String,
    },
}

/// Copies at most `MAX_QUOTED` (256) bytes of `input` (on a char boundary) for an error message.
pub fn quote(input: &str) -> String {
    if input.len() <= MAX_QUOTED {
        return input.to_owned();
    }
    let mut end = MAX_QUOTED;
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…({} bytes)", &input[..end], input.len())
}

fn id_err(input: &str, rule: IdRule) -> IdError {
    IdError::SpiffeId {
        input: quote(input),
        rule,
    }
}

/// Checks the characters of a trust domain name (the authority of a SPIFFE ID).
fn check_trust_domain(td: &str) -> Result<(), IdRule> {
    if td.is_empty() {
        return Err(IdRule::MissingTrustDomain);
    }
    // Userinfo and port get their own messages: they are the likely mistakes.
    if td.contains('@') {
        return Err(IdRule::UserInfo);
    }
    // An IP-literal ("[::1]") is a bad character, not a port.
    if let Some(c) = td.chars().find(|c| matches!(c, '[' | ']')) {
        return Err(IdRule::TrustDomainChar(c));
    }
    if td.contains(':') {
        return Err(IdRule::Port);
    }
    for c in td.chars() {
        match c {
            'a'..='z' | '0'..='9' | '.' | '-' | '_' => {}
            'A'..='Z' => return Err(IdRule::TrustDomainUppercase),
            '%' => return Err(IdRule::PercentEncoding),
            '?' => return Err(IdRule::Query),
            '#' => return Err(IdRule::Fragment),
            other => return Err(IdRule::TrustDomainChar(other)),
        }
    }
    Ok(())
}

/// Checks a SPIFFE ID path: empty, or `/seg(/seg)*` with valid non-dot segments.
fn check_path(path: &str) -> Result<(), IdRule> {
    if path.is_empty() {
        return Ok(());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(IdRule::PathNotAbsolute);
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let last = segments.len() - 1;
    for (i, seg) in segments.iter().enumerate() {
        if seg.is_empty() {
            return Err(if i == last {
                IdRule::TrailingSlash
            } else {
                IdRule::EmptySegment
            });
        }
        if *seg == "." || *seg == ".." {
            return Err(IdRule::DotSegment);
        }
        for c in seg.chars() {
            match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => {}
                '%' => return Err(IdRule::PercentEncoding),
                '?' => return Err(IdRule::Query),
                '#' => return Err(IdRule::Fragment),
                other => return Err(IdRule::PathChar(other)),
            }
        }
    }
    Ok(())
}

/// A trust domain name, e.g. `example.org`: lowercase letters, digits, `.`, `-` and `_`.
///
/// ```
/// use argocd_agent_identity::TrustDomain;
/// let td = TrustDomain::new("spiffe://example.org").unwrap();
/// assert_eq!(td.as_str(), "example.org");
/// assert!(TrustDomain::new("Example.org").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TrustDomain(String);

impl TrustDomain {
    /// Parses a trust domain given as `example.org` or `spiffe://example.org`.
    pub fn new(input: &str) -> Result<Self, IdError> {
        let err = |rule| IdError::TrustDomain {
            input: quote(input),
            rule,
        };
        if input.is_empty() {
            return Err(err(IdRule::Empty));
        }
        let name = match input.strip_prefix(SCHEME_PREFIX) {
            Some(rest) => {
                if rest.contains('/') {
                    return Err(err(IdRule::TrustDomainHasPath));
                }
                rest
            }
            None => {
                if let Some((scheme, _)) = input.split_once("://") {
                    return Err(err(IdRule::WrongScheme(quote(scheme))));
                }
                input
            }
        };
        if SCHEME_PREFIX.len() + name.len() > MAX_SPIFFE_ID_LEN {
            return Err(err(IdRule::TooLong(SCHEME_PREFIX.len() + name.len())));
        }
        check_trust_domain(name).map_err(err)?;
        Ok(TrustDomain(name.to_owned()))
    }

    /// The trust domain name, e.g. `example.org`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The SPIFFE ID of the trust domain itself, `spiffe://example.org` (empty path).
    pub fn id(&self) -> SpiffeId {
        SpiffeId {
            uri: format!("{SCHEME_PREFIX}{}", self.0),
            trust_domain: self.clone(),
        }
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TrustDomain {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TrustDomain::new(s)
    }
}

impl TryFrom<String> for TrustDomain {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        TrustDomain::new(&s)
    }
}

impl From<TrustDomain> for String {
    fn from(td: TrustDomain) -> String {
        td.0
    }
}

/// A SPIFFE ID, e.g. `spiffe://example.org/ns/argocd/sa/agent`.
///
/// ```
/// use argocd_agent_identity::SpiffeId;
/// let id = SpiffeId::parse("spiffe://example.org/ns/argocd/sa/edge-7").unwrap();
/// assert_eq!(id.trust_domain().as_str(), "example.org");
/// assert_eq!(id.path(), "/ns/argocd/sa/edge-7");
/// assert_eq!(id.segments().collect::<Vec<_>>(), ["ns", "argocd", "sa", "edge-7"]);
/// assert!(SpiffeId::parse("spiffe://example.org/a/../b").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SpiffeId {
    uri: String,
    trust_domain: TrustDomain,
}

impl SpiffeId {
    /// Parses a SPIFFE ID, enforcing every rule of the SPIFFE ID specification.
    pub fn parse(input: &str) -> Result<SpiffeId, IdError> {
        if input.is_empty() {
            return Err(id_err(input, IdRule::Empty));
        }
        if input.len() > MAX_SPIFFE_ID_LEN {
            return Err(id_err(input, IdRule::TooLong(input.len())));
        }
        let Some(rest) = input.strip_prefix(SCHEME_PREFIX) else {
            return Err(match input.split_once("://") {
                Some((scheme, _)) => id_err(input, IdRule::WrongScheme(quote(scheme))),
                None => id_err(input, IdRule::MissingScheme),
            });
        };
        // These characters are forbidden anywhere; checking them first gives the precise
        // reason instead of "bad character".
        if rest.contains('?') {
            return Err(id_err(input, IdRule::Query));
        }
        if rest.contains('#') {
            return Err(id_err(input, IdRule::Fragment));
        }
        if rest.contains('%') {
            return Err(id_err(input, IdRule::PercentEncoding));
        }
        let (td, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        check_trust_domain(td).map_err(|rule| id_err(input, rule))?;
        check_path(path).map_err(|rule| id_err(input, rule))?;
        Ok(SpiffeId {
            uri: input.to_owned(),
            trust_domain: TrustDomain(td.to_owned()),
        })
    }

    /// Builds `spiffe://<td><path>`; `path` must be empty or start with `/`.
    pub fn new(td: TrustDomain, path: &str) -> Result<SpiffeId, IdError> {
        let uri = format!("{SCHEME_PREFIX}{}{path}", td.as_str());
        if uri.len() > MAX_SPIFFE_ID_LEN {
            return Err(id_err(&uri, IdRule::TooLong(uri.len())));
        }
        if path.contains('?') {
            return Err(id_err(&uri, IdRule::Query));
        }
        if path.contains('#') {
            return Err(id_err(&uri, IdRule::Fragment));
        }
        if path.contains('%') {
            return Err(id_err(&uri, IdRule::PercentEncoding));
        }
        check_path(path).map_err(|rule| id_err(&uri, rule))?;
        Ok(SpiffeId {
            uri,
            trust_domain: td,
        })
    }

    /// The trust domain, e.g. `example.org`.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The path, empty or starting with `/`, e.g. `/ns/argocd/sa/edge-7`.
    pub fn path(&self) -> &str {
        &self.uri[SCHEME_PREFIX.len() + self.trust_domain.0.len()..]
    }

    /// The path segments, e.g. `["ns", "argocd", "sa", "edge-7"]`; none for an empty path.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        let path = self.path();
        // An empty path has no segments; `"".split('/')` would yield one empty segment.
        path.strip_prefix('/')
            .into_iter()
            .flat_map(|rest| rest.split('/'))
    }

    /// The whole ID, e.g. `spiffe://example.org/ns/argocd/sa/edge-7`.
    pub fn as_str(&self) -> &str {
        &self.uri
    }

    /// Whether this ID belongs to `td`.
    pub fn is_member_of(&self, td: &TrustDomain) -> bool {
        &self.trust_domain == td
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri)
    }
}

impl FromStr for SpiffeId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SpiffeId::parse(s)
    }
}

impl TryFrom<String> for SpiffeId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        SpiffeId::parse(&s)
    }
}

impl From<SpiffeId> for String {
    fn from(id: SpiffeId) -> String {
        id.uri
    }
}

impl AsRef<str> for SpiffeId {
    fn as_ref(&self) -> &str {
        &self.uri
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_of(input: &str) -> IdRule {
        match SpiffeId::parse(input) {
            Err(IdError::SpiffeId { rule, .. }) => rule,
            other => panic!("expected SPIFFE ID error for {input:?}, got {other:?}"),
        }
    }

    #[test]
    fn spec_valid_ids_parse() {
        for (input, td, path) in [
            (
                "spiffe://trustdomain/path/element",
                "trustdomain",
                "/path/element",
            ),
            ("spiffe://trustdomain", "trustdomain", ""),
            (
                "spiffe://example.org/ns/argocd/sa/x",
                "example.org",
                "/ns/argocd/sa/x",
            ),
            (
                "spiffe://a-b_c.0-9/A-Z_a.z-0.9/...x/.x",
                "a-b_c.0-9",
                "/A-Z_a.z-0.9/...x/.x",
            ),
            ("spiffe://td/...", "td", "/..."),
        ] {
            let id = SpiffeId::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(id.trust_domain().as_str(), td);
            assert_eq!(id.path(), path);
            assert_eq!(id.as_str(), input);
            assert_eq!(id.to_string(), input);
        }
    }

    #[test]
    fn spec_invalid_ids_name_the_rule() {
        let cases = [
            ("", IdRule::Empty),
            ("example.org/x", IdRule::MissingScheme),
            ("spiffe:/td/x", IdRule::MissingScheme),
            ("http://td/x", IdRule::WrongScheme("http".into())),
            ("SPIFFE://td/x", IdRule::WrongScheme("SPIFFE".into())),
            ("Spiffe://td/x", IdRule::WrongScheme("Spiffe".into())),
            ("spiffe:///x", IdRule::MissingTrustDomain),
            ("spiffe://", IdRule::MissingTrustDomain),
            ("spiffe://Example.org/x", IdRule::TrustDomainUppercase),
            ("spiffe://td:8080/x", IdRule::Port),
            ("spiffe://td:/x", IdRule::Port),
            ("spiffe://user@td/x", IdRule::UserInfo),
            ("spiffe://user:pw@td/x", IdRule::UserInfo),
            ("spiffe://td/x?q", IdRule::Query),
            ("spiffe://td/x?", IdRule::Query),
            ("spiffe://td/x#f", IdRule::Fragment),
            ("spiffe://td#f", IdRule::Fragment),
            ("spiffe://td/%41", IdRule::PercentEncoding),
            ("spiffe://t%41d/x", IdRule::PercentEncoding),
            ("spiffe://td/path/", IdRule::TrailingSlash),
            ("spiffe://td/", IdRule::TrailingSlash),
            ("spiffe://td//x", IdRule::EmptySegment),
            ("spiffe://td/./x", IdRule::DotSegment),
            ("spiffe://td/x/..", IdRule::DotSegment),
            ("spiffe://td/x/../y", IdRule::DotSegment),
            ("spiffe://td/x y", IdRule::PathChar(' ')),
            ("spiffe://td/x*", IdRule::PathChar('*')),
            ("spiffe://td/ü", IdRule::PathChar('ü')),
            ("spiffe://t d/x", IdRule::TrustDomainChar(' ')),
            ("spiffe://td!/x", IdRule::TrustDomainChar('!')),
            ("spiffe://[::1]/x", IdRule::TrustDomainChar('[')),
        ];
        for (input, want) in cases {
            assert_eq!(rule_of(input), want, "input {input:?}");
        }
    }

    #[test]
    fn length_limit_is_2048_bytes() {
        let prefix = "spiffe://td/";
        let ok = format!("{prefix}{}", "a".repeat(MAX_SPIFFE_ID_LEN - prefix.len()));
        assert_eq!(ok.len(), 2048);
        assert!(SpiffeId::parse(&ok).is_ok());
        let long = format!("{ok}a");
        assert_eq!(rule_of(&long), IdRule::TooLong(2049));
        // The error quotes only the head of a huge input.
        let msg = SpiffeId::parse(&long).unwrap_err().to_string();
        assert!(msg.len() < 600, "{msg}");
        assert!(msg.contains("2049 bytes"), "{msg}");
    }

    #[test]
    fn error_message_quotes_input_and_rule() {
        let msg = SpiffeId::parse("spiffe://td/x?q").unwrap_err().to_string();
        assert_eq!(
            msg,
            "invalid SPIFFE ID \"spiffe://td/x?q\": a query (\"?\") is not allowed"
        );
    }

    #[test]
    fn segments_of_empty_path_are_empty() {
        let id = SpiffeId::parse("spiffe://td").unwrap();
        assert_eq!(id.segments().count(), 0);
        let id = SpiffeId::parse("spiffe://td/a/b").unwrap();
        assert_eq!(id.segments().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn new_builds_and_validates() {
        let td = TrustDomain::new("example.org").unwrap();
        let id = SpiffeId::new(td.clone(), "/ns/a/sa/b").unwrap();
        assert_eq!(id.as_str(), "spiffe://example.org/ns/a/sa/b");
        assert_eq!(SpiffeId::new(td.clone(), "").unwrap(), td.id());
        for bad in ["x", "/a/", "//a", "/./a", "/a?b", "/a#b", "/%20"] {
            assert!(SpiffeId::new(td.clone(), bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn trust_domain_accepts_bare_and_spiffe_form() {
        assert_eq!(
            TrustDomain::new("example.org").unwrap().as_str(),
            "example.org"
        );
        assert_eq!(
            TrustDomain::new("spiffe://example.org").unwrap().as_str(),
            "example.org"
        );
        for bad in [
            "",
            "Example.org",
            "example.org:443",
            "user@example.org",
            "spiffe://example.org/x",
            "https://example.org",
            "exa mple",
            "td?x",
            "td#x",
            "spiffe://",
        ] {
            assert!(TrustDomain::new(bad).is_err(), "{bad}");
        }
        let msg = TrustDomain::new("Example.org").unwrap_err().to_string();
        assert!(
            msg.contains("\"Example.org\"") && msg.contains("lowercase"),
            "{msg}"
        );
    }

    #[test]
    fn serde_round_trips_as_string_and_validates() {
        let id = SpiffeId::parse("spiffe://example.org/a").unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"spiffe://example.org/a\"");
        let back: SpiffeId = serde_json::from_str(&json).unwrap();
        assert_eq!(back, id);
        assert!(serde_json::from_str::<SpiffeId>("\"spiffe://td/a/\"").is_err());
        let td: TrustDomain = serde_json::from_str("\"example.org\"").unwrap();
        assert_eq!(serde_json::to_string(&td).unwrap(), "\"example.org\"");
        assert!(serde_json::from_str::<TrustDomain>("\"EX\"").is_err());
    }

    #[test]
    fn from_str_and_membership() {
        let id: SpiffeId = "spiffe://example.org/a".parse().unwrap();
        assert!(id.is_member_of(&"example.org".parse().unwrap()));
        assert!(!id.is_member_of(&"example.com".parse().unwrap()));
    }
}
