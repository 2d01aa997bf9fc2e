//! Namespace patterns as Argo CD reads them (`util/glob` with `REGEXP`): `/re/` is a regular
//! expression matched as written (unanchored), anything else a shell glob over the whole
//! name (`*`, `?`, `[a-z]`, `[!..]`, `{a,b}`, `\` escapes). One matcher for the agent's and
//! the principal's `--allowed-namespaces`.

use regex::Regex;

/// A pattern as a regular expression: `/re/` as written (unanchored, as Argo CD matches it),
/// anything else a glob over the whole name.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    if pattern.len() >= 2 && pattern.starts_with('/') && pattern.ends_with('/') {
        let inner = &pattern[1..pattern.len() - 1];
        return Regex::new(inner).map_err(|e| format!("not a regular expression: {e}"));
    }
    let translated = glob_to_regex(pattern)?;
    Regex::new(&translated).map_err(|e| format!("not a glob: {e}"))
}

/// A shell glob over the whole string (no `/re/` form), as Argo CD's `glob.Match` reads
/// project destinations.
pub fn compile_glob(pattern: &str) -> Result<Regex, String> {
    Regex::new(&glob_to_regex(pattern)?).map_err(|e| format!("not a glob: {e}"))
}

/// Whether `pattern` has no glob syntax, so it matches exactly itself.
pub fn is_literal(pattern: &str) -> bool {
    !pattern.contains(['*', '?', '[', '{', '\\'])
}

/// The anchored regular expression of a shell glob (see the module documentation).
fn glob_to_regex(glob: &str) -> Result<String, String> {
    let mut out = String::from("^(?:");
    let mut chars = glob.chars();
    let mut braces = 0usize;
    while let Some(c) = chars.next() {
        match c {
            '*' => out.push_str(".*"),
            '?' => out.push('.'),
            '\\' => {
                let next = chars.next().ok_or("a trailing \\ escapes nothing")?;
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
        return Err("a { is not closed".into());
    }
    out.push_str(")$");
    Ok(out)
}

/// A character class after its `[`, up to and including the `]`, as a regex class.
fn class(chars: &mut std::str::Chars<'_>) -> Result<String, String> {
    let mut out = String::from("[");
    let mut first = true;
    loop {
        let c = chars.next().ok_or("a [ is not closed")?;
        match c {
            '!' | '^' if first => out.push('^'),
            ']' if !first => {
                out.push(']');
                return Ok(out);
            }
            '-' => out.push('-'),
            '\\' => {
                let next = chars.next().ok_or("a trailing \\ escapes nothing")?;
                out.push_str(&regex::escape(&next.to_string()));
            }
            other => out.push_str(&regex::escape(&other.to_string())),
        }
        first = false;
    }
}
