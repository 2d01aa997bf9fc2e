//! The patterns a tenant declares, and whether two of them can match a common string.
//!
//! Written by hand because no crate we know answers "can these two patterns match the same
//! string?", which is what refusing overlapping tenants at load needs. Each pattern is a
//! sequence of tokens, each either one character of a set or any run of characters of a set;
//! matching a string and intersecting two patterns are the same walk over pairs of positions
//! (the product of two automata without epsilon cycles), so the matcher and the overlap check
//! can never disagree.
//!
//! Two languages compile to these tokens:
//!
//! - **SPIFFE ID patterns** (`agents`, `admins`), as the mapping rules' templates read them:
//!   `spiffe://{trust_domain}/ns/team-a/sa/{sa}`. A `{name}` placeholder stands for one or
//!   more characters of one path segment (`A-Z a-z 0-9 . _ -`), `{trust_domain}` for a whole
//!   trust domain (`a-z 0-9 . _ -`); anything else is literal. Without placeholders the
//!   pattern is one exact ID.
//! - **name globs** (`namespaces`, `projects`, `repositories`, `repoCreds`, `gpgKeys`):
//!   `*` any run, `?` one character, `[a-z]` / `[!a-z]` one character of (not of) a class, `\`
//!   escapes. Argo CD's `{a,b}` alternatives are not taken: list each alternative as its own
//!   entry, so that each can be named in an overlap error.

use argocd_agent_identity::text::quoted;
use std::collections::HashSet;
use std::fmt;

/// A set of characters: one bit per ASCII character, and whether non-ASCII ones belong.
#[derive(Clone, Copy, PartialEq, Eq)]
struct CharSet {
    ascii: u128,
    other: bool,
}

impl CharSet {
    const ANY: CharSet = CharSet {
        ascii: u128::MAX,
        other: true,
    };

    fn one(c: char) -> CharSet {
        if c.is_ascii() {
            CharSet {
                ascii: 1u128 << (c as u32),
                other: false,
            }
        } else {
            // Non-ASCII literals never occur in SPIFFE IDs or Kubernetes names; treating
            // them as "some non-ASCII character" only makes overlap checks stricter.
            CharSet {
                ascii: 0,
                other: true,
            }
        }
    }

    fn of(chars: impl IntoIterator<Item = char>) -> CharSet {
        chars
            .into_iter()
            .fold(CharSet::none(), |s, c| s.union(CharSet::one(c)))
    }

    fn none() -> CharSet {
        CharSet {
            ascii: 0,
            other: false,
        }
    }

    fn union(self, o: CharSet) -> CharSet {
        CharSet {
            ascii: self.ascii | o.ascii,
            other: self.other || o.other,
        }
    }

    fn complement(self) -> CharSet {
        CharSet {
            ascii: !self.ascii,
            other: !self.other,
        }
    }

    fn meets(self, o: CharSet) -> bool {
        self.ascii & o.ascii != 0 || (self.other && o.other)
    }

    fn range(from: char, to: char) -> CharSet {
        if from.is_ascii() && to.is_ascii() {
            (from..=to).fold(CharSet::none(), |s, c| s.union(CharSet::one(c)))
        } else {
            CharSet {
                ascii: (from..=to.min('\x7f')).fold(0, |s, c| s | CharSet::one(c).ascii),
                other: true,
            }
        }
    }
}

/// One position of a pattern.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Token {
    /// Exactly one character of the set.
    One(CharSet),
    /// Zero or more characters of the set.
    Many(CharSet),
}

impl Token {
    fn set(self) -> CharSet {
        match self {
            Token::One(s) | Token::Many(s) => s,
        }
    }
}

/// A compiled pattern, with the text it was written as.
#[derive(Clone)]
pub struct Pattern {
    source: String,
    tokens: Vec<Token>,
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({:?})", self.source)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Characters one `{name}` placeholder may stand for (one SPIFFE ID path segment), as the
/// mapping rules' templates match them.
fn segment_chars() -> CharSet {
    CharSet::range('A', 'Z')
        .union(CharSet::range('a', 'z'))
        .union(CharSet::range('0', '9'))
        .union(CharSet::of(['.', '_', '-']))
}

/// Characters of a trust domain (`{trust_domain}`).
fn trust_domain_chars() -> CharSet {
    CharSet::range('a', 'z')
        .union(CharSet::range('0', '9'))
        .union(CharSet::of(['.', '_', '-']))
}

/// Why a pattern does not compile; `src` is the pattern as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatternError {
    /// A SPIFFE ID pattern without the scheme.
    #[error("{} must start with \"spiffe://\"", quoted(.src))]
    NoScheme {
        /// The pattern.
        src: String,
    },
    /// A `{` without its `}`.
    #[error("{}: a '{{' is not closed", quoted(.src))]
    UnclosedPlaceholder {
        /// The pattern.
        src: String,
    },
    /// A placeholder whose name is not letters, digits and `_`.
    #[error("{}: placeholder {{{name}}} must be a name of letters, digits and '_'", quoted(.src))]
    PlaceholderName {
        /// The pattern.
        src: String,
        /// The placeholder's name as written.
        name: String,
    },
    /// `{trust_domain}` used for part of the trust domain, or outside it.
    #[error("{}: {{trust_domain}} may only stand for the whole trust domain", quoted(.src))]
    TrustDomainPart {
        /// The pattern.
        src: String,
    },
    /// Another placeholder in the trust domain.
    #[error("{}: the trust domain must be a literal or exactly {{trust_domain}}", quoted(.src))]
    TrustDomainPlaceholder {
        /// The pattern.
        src: String,
    },
    /// A `}` without its `{`.
    #[error("{}: unmatched '}}'", quoted(.src))]
    UnmatchedBrace {
        /// The pattern.
        src: String,
    },
    /// No ID the pattern matches would be a valid SPIFFE ID. The message carries the cause,
    /// so it is no `source`.
    #[error("{} cannot match any valid SPIFFE ID: {cause}", quoted(.src))]
    NeverValid {
        /// The pattern.
        src: String,
        /// Why a sample ID is invalid.
        cause: argocd_agent_identity::IdError,
    },
    /// An empty glob.
    #[error("an empty pattern matches nothing")]
    Empty,
    /// A `\` at the end.
    #[error("{}: a trailing \\ escapes nothing", quoted(.src))]
    TrailingEscape {
        /// The pattern.
        src: String,
    },
    /// `{a,b}` in a glob.
    #[error("{}: alternatives {{a,b}} are not taken here; list each as its own entry", quoted(.src))]
    Alternatives {
        /// The pattern.
        src: String,
    },
    /// A `[` without its `]`.
    #[error("{}: a [ is not closed", quoted(.src))]
    UnclosedClass {
        /// The pattern.
        src: String,
    },
    /// A range `z-a`.
    #[error("{}: range {from}-{to} is reversed", quoted(.src))]
    ReversedRange {
        /// The pattern.
        src: String,
        /// The range's first character.
        from: char,
        /// The range's last character.
        to: char,
    },
}

impl Pattern {
    /// Compiles a SPIFFE ID pattern (see the module docs).
    pub fn spiffe_id(src: &str) -> Result<Pattern, PatternError> {
        let Some(rest) = src.strip_prefix("spiffe://") else {
            return Err(PatternError::NoScheme { src: src.into() });
        };
        let mut tokens: Vec<Token> = "spiffe://"
            .chars()
            .map(|c| Token::One(CharSet::one(c)))
            .collect();
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let mut sample = String::from("spiffe://");
        let mut pos = 0;
        while pos < rest.len() {
            let tail = &rest[pos..];
            if let Some(after) = tail.strip_prefix('{') {
                let end = after
                    .find('}')
                    .ok_or_else(|| PatternError::UnclosedPlaceholder { src: src.into() })?;
                let name = &after[..end];
                let valid =
                    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !valid {
                    return Err(PatternError::PlaceholderName {
                        src: src.into(),
                        name: name.into(),
                    });
                }
                let in_authority = pos < authority_end;
                let set = match (name == "trust_domain", in_authority) {
                    (true, true) if pos == 0 && end + 2 == authority_end => trust_domain_chars(),
                    (true, _) => {
                        return Err(PatternError::TrustDomainPart { src: src.into() });
                    }
                    (false, true) => {
                        return Err(PatternError::TrustDomainPlaceholder { src: src.into() });
                    }
                    (false, false) => segment_chars(),
                };
                tokens.push(Token::One(set));
                tokens.push(Token::Many(set));
                sample.push('x');
                pos += end + 2;
            } else if tail.starts_with('}') {
                return Err(PatternError::UnmatchedBrace { src: src.into() });
            } else {
                let c = tail.chars().next().unwrap_or_default();
                tokens.push(Token::One(CharSet::one(c)));
                sample.push(c);
                pos += c.len_utf8();
            }
        }
        argocd_agent_identity::id::SpiffeId::parse(&sample).map_err(|cause| {
            PatternError::NeverValid {
                src: src.into(),
                cause,
            }
        })?;
        Ok(Pattern {
            source: src.to_owned(),
            tokens,
        })
    }

    /// Compiles a name glob (see the module docs).
    pub fn glob(src: &str) -> Result<Pattern, PatternError> {
        if src.is_empty() {
            return Err(PatternError::Empty);
        }
        let mut tokens = Vec::new();
        let mut chars = src.chars();
        while let Some(c) = chars.next() {
            let token = match c {
                '*' => Token::Many(CharSet::ANY),
                '?' => Token::One(CharSet::ANY),
                '\\' => {
                    let e = chars
                        .next()
                        .ok_or_else(|| PatternError::TrailingEscape { src: src.into() })?;
                    Token::One(CharSet::one(e))
                }
                '[' => Token::One(class(src, &mut chars)?),
                '{' | '}' => {
                    return Err(PatternError::Alternatives { src: src.into() });
                }
                c => Token::One(CharSet::one(c)),
            };
            // `**` is the same as `*`: keep one, so patterns stay small.
            if matches!(
                (tokens.last(), token),
                (Some(Token::Many(_)), Token::Many(_))
            ) {
                continue;
            }
            tokens.push(token);
        }
        Ok(Pattern {
            source: src.to_owned(),
            tokens,
        })
    }

    /// The text the pattern was written as.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the pattern matches all of `s`.
    pub fn matches(&self, s: &str) -> bool {
        let literal: Vec<Token> = s.chars().map(|c| Token::One(CharSet::one(c))).collect();
        if !s.is_ascii() {
            // One bit stands for every non-ASCII character: compare those exactly by text.
            return self.is_literal() && self.source == s;
        }
        intersect(&self.tokens, &literal)
    }

    /// Whether some string matches both patterns.
    pub fn overlaps(&self, other: &Pattern) -> bool {
        intersect(&self.tokens, &other.tokens)
    }

    fn is_literal(&self) -> bool {
        self.tokens
            .iter()
            .all(|t| matches!(t, Token::One(s) if s.ascii.count_ones() + u32::from(s.other) == 1))
    }
}

/// `[...]` after its `[`: ranges and single characters, `!` or `^` first negates.
fn class(src: &str, chars: &mut std::str::Chars<'_>) -> Result<CharSet, PatternError> {
    let mut set = CharSet::none();
    let mut negated = false;
    let mut first = true;
    let mut prev: Option<char> = None;
    loop {
        let c = chars
            .next()
            .ok_or_else(|| PatternError::UnclosedClass { src: src.into() })?;
        match c {
            '!' | '^' if first => negated = true,
            ']' if !first || prev.is_some() => break,
            '-' if prev.is_some() && chars.clone().next().is_some_and(|n| n != ']') => {
                let from = prev.take().unwrap_or_default();
                let mut to = chars.next().unwrap_or_default();
                if to == '\\' {
                    to = chars
                        .next()
                        .ok_or_else(|| PatternError::TrailingEscape { src: src.into() })?;
                }
                if to < from {
                    return Err(PatternError::ReversedRange {
                        src: src.into(),
                        from,
                        to,
                    });
                }
                set = set.union(CharSet::range(from, to));
                first = false;
                continue;
            }
            '\\' => {
                let e = chars
                    .next()
                    .ok_or_else(|| PatternError::TrailingEscape { src: src.into() })?;
                set = set.union(CharSet::one(e));
                prev = Some(e);
            }
            c => {
                set = set.union(CharSet::one(c));
                prev = Some(c);
            }
        }
        first = false;
    }
    Ok(if negated { set.complement() } else { set })
}

/// Whether some string is accepted by both token sequences: a walk over pairs of positions.
/// From `(i, j)`: a `Many` may match nothing (advance past it); both sides may take one
/// character their sets share (a `Many` stays, a `One` advances). Accepted at `(n, m)`.
fn intersect(p: &[Token], q: &[Token]) -> bool {
    let mut seen = HashSet::new();
    let mut stack = vec![(0usize, 0usize)];
    while let Some((i, j)) = stack.pop() {
        if !seen.insert((i, j)) {
            continue;
        }
        if i == p.len() && j == q.len() {
            return true;
        }
        if let Some(Token::Many(_)) = p.get(i) {
            stack.push((i + 1, j));
        }
        if let Some(Token::Many(_)) = q.get(j) {
            stack.push((i, j + 1));
        }
        if let (Some(a), Some(b)) = (p.get(i), q.get(j))
            && a.set().meets(b.set())
        {
            let ni = if matches!(a, Token::Many(_)) {
                i
            } else {
                i + 1
            };
            let nj = if matches!(b, Token::Many(_)) {
                j
            } else {
                j + 1
            };
            if (ni, nj) != (i, j) {
                stack.push((ni, nj));
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> Pattern {
        Pattern::glob(s).unwrap()
    }
    fn id(s: &str) -> Pattern {
        Pattern::spiffe_id(s).unwrap()
    }

    #[test]
    fn globs_match_like_shell_globs() {
        assert!(g("team-a-*").matches("team-a-dev"));
        assert!(g("team-a-*").matches("team-a-"));
        assert!(!g("team-a-*").matches("team-b-dev"));
        assert!(g("t?am").matches("team"));
        assert!(!g("t?am").matches("tam"));
        assert!(g("[a-c]x").matches("bx"));
        assert!(!g("[!a-c]x").matches("bx"));
        assert!(g("[!a-c]x").matches("dx"));
        assert!(g("a\\*").matches("a*"));
        assert!(!g("a\\*").matches("ab"));
        assert!(g("*").matches(""));
        assert!(g("a*b*c").matches("axxbyyc"));
        assert!(!g("a*b*c").matches("axxbyy"));
    }

    #[test]
    fn glob_errors_say_what_is_wrong() {
        assert!(Pattern::glob("").unwrap_err().to_string().contains("empty"));
        assert!(
            Pattern::glob("a[b")
                .unwrap_err()
                .to_string()
                .contains("not closed")
        );
        assert!(
            Pattern::glob("a\\")
                .unwrap_err()
                .to_string()
                .contains("escapes nothing")
        );
        assert!(
            Pattern::glob("{a,b}")
                .unwrap_err()
                .to_string()
                .contains("own entry")
        );
        assert!(
            Pattern::glob("[z-a]")
                .unwrap_err()
                .to_string()
                .contains("reversed")
        );
    }

    #[test]
    fn overlapping_globs_are_found() {
        assert!(g("team-*").overlaps(&g("*-dev")));
        assert!(g("team-a-*").overlaps(&g("team-a-prod")));
        assert!(!g("team-a-*").overlaps(&g("team-b-*")));
        assert!(!g("a*").overlaps(&g("b*")));
        assert!(g("*").overlaps(&g("anything")));
        assert!(!g("a?").overlaps(&g("abc")));
        assert!(g("a[0-9]*").overlaps(&g("*5x")));
        assert!(!g("a[0-9]").overlaps(&g("a[!0-9]")));
        assert!(!g("x*y").overlaps(&g("x*z")));
        assert!(g("*a*").overlaps(&g("*b*")));
    }

    #[test]
    fn spiffe_id_patterns_follow_the_mapping_templates() {
        let p = id("spiffe://{trust_domain}/ns/team-a/sa/{sa}");
        assert!(p.matches("spiffe://example.org/ns/team-a/sa/edge-1"));
        assert!(!p.matches("spiffe://example.org/ns/team-a/sa/"));
        assert!(!p.matches("spiffe://example.org/ns/team-a/sa/x/y"));
        assert!(!p.matches("spiffe://example.org/ns/team-b/sa/edge-1"));
        let exact = id("spiffe://example.org/special");
        assert!(exact.matches("spiffe://example.org/special"));
        assert!(!exact.matches("spiffe://example.org/special2"));
        assert!(Pattern::spiffe_id("example.org/x").is_err());
        assert!(Pattern::spiffe_id("spiffe://{td}/x").is_err());
        assert!(Pattern::spiffe_id("spiffe://a/{trust_domain}").is_err());
        assert!(Pattern::spiffe_id("spiffe://a/{x").is_err());
    }

    #[test]
    fn overlapping_id_patterns_are_found() {
        let a = id("spiffe://example.org/ns/team-a/sa/{sa}");
        let b = id("spiffe://example.org/ns/team-b/sa/{sa}");
        let any_ns = id("spiffe://example.org/ns/{ns}/sa/edge-1");
        let other_td = id("spiffe://other.org/ns/{ns}/sa/{sa}");
        let any_td = id("spiffe://{trust_domain}/ns/team-b/sa/{sa}");
        assert!(!a.overlaps(&b));
        assert!(a.overlaps(&any_ns));
        assert!(b.overlaps(&any_ns));
        assert!(!a.overlaps(&other_td));
        assert!(b.overlaps(&any_td));
        assert!(!a.overlaps(&any_td));
        // A placeholder never crosses a '/'.
        let deep = id("spiffe://example.org/ns/team-a/sa/x/y");
        assert!(!a.overlaps(&deep));
    }
}
