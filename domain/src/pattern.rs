//! Namespace patterns as Argo CD reads them (`util/glob` with `REGEXP`): `/re/` is a regular
//! expression matched as written (unanchored), anything else a shell glob over the whole
//! name (`*`, `?`, `[a-z]`, `[!..]`, `{a,b}`, `\` escapes). One matcher for the agent's and
//! the principal's `--allowed-namespaces`.

use regex::Regex;

/// Why a namespace pattern does not compile.
#[derive(Debug, thiserror::Error)]
pub enum PatternError {
    /// `/re/` whose inside is not a regular expression.
    #[error("not a regular expression")]
    NotRegex(#[source] regex::Error),
    /// A glob whose translation the regex engine refuses (e.g. too large).
    #[error("not a glob")]
    NotGlob(#[source] regex::Error),
    /// A `\` at the end of the glob.
    #[error("a trailing \\ escapes nothing")]
    TrailingEscape,
    /// A `{` without its `}`.
    #[error("a {{ is not closed")]
    UnclosedBrace,
    /// A `[` without its `]`.
    #[error("a [ is not closed")]
    UnclosedClass,
}

/// The message with its cause, as the `String` errors of callers carried it before.
impl From<PatternError> for String {
    fn from(e: PatternError) -> String {
        crate::error_chain(&e)
    }
}

/// A pattern as a regular expression: `/re/` as written (unanchored, as Argo CD matches it),
/// anything else a glob over the whole name.
pub fn compile(pattern: &str) -> Result<Regex, PatternError> {
    if pattern.len() >= 2 && pattern.starts_with('/') && pattern.ends_with('/') {
        let inner = &pattern[1..pattern.len() - 1];
        return Regex::new(inner).map_err(PatternError::NotRegex);
    }
    let translated = glob_to_regex(pattern)?;
    Regex::new(&translated).map_err(PatternError::NotGlob)
}

/// A shell glob over the whole string (no `/re/` form), as Argo CD's `glob.Match` reads
/// project destinations.
pub fn compile_glob(pattern: &str) -> Result<Regex, PatternError> {
    Regex::new(&glob_to_regex(pattern)?).map_err(PatternError::NotGlob)
}

/// Whether `pattern` has no glob syntax, so it matches exactly itself.
pub fn is_literal(pattern: &str) -> bool {
    !pattern.contains(['*', '?', '[', '{', '\\'])
}

/// The anchored regular expression of a shell glob (see the module documentation).
fn glob_to_regex(glob: &str) -> Result<String, PatternError> {
    let mut out = String::from("^(?:");
    let mut chars = glob.chars();
    let mut braces = 0usize;
    while let Some(c) = chars.next() {
        match c {
            '*' => out.push_str(".*"),
            '?' => out.push('.'),
            '\\' => {
                let next = chars.next().ok_or(PatternError::TrailingEscape)?;
                out.push_str(&regex::escape(&next.to_string()));
            }
            '[' => out.push_str(&class(&mut chars)?),
            '{' => {
                braces += 1;
                out.push_str("(?:");
            }
            ',' if braces > 0 => out.push('|'),
            '}' if braces > 0 => {
                braces -= 1;
                out.push(')');
            }
            other => out.push_str(&regex::escape(&other.to_string())),
        }
    }
    if braces > 0 {
        return Err(PatternError::UnclosedBrace);
    }
    out.push_str(")$");
    Ok(out)
}

/// A character class after its `[`, up to and including the `]`, as a regex class.
fn class(chars: &mut std::str::Chars<'_>) -> Result<String, PatternError> {
    let mut out = String::from("[");
    let mut first = true;
    loop {
        let c = chars.next().ok_or(PatternError::UnclosedClass)?;
        match c {
            '!' | '^' if first => out.push('^'),
            ']' if !first => {
                out.push(']');
                return Ok(out);
            }
            '-' => out.push('-'),
            '\\' => {
                let next = chars.next().ok_or(PatternError::TrailingEscape)?;
                out.push_str(&regex::escape(&next.to_string()));
            }
            other => out.push_str(&regex::escape(&other.to_string())),
        }
        first = false;
    }
}
