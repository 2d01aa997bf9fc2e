//! No Debug formatting in what a user reads: the shipped crates' non-test source has no
//! tracing field logged with `?` (`field = ?x`, `?x`) and no `{:?}`/`{x:?}` in a format
//! string (messages, errors, `Status` texts, log lines). Names and values from outside read
//! through `argocd_agent_identity::text::quoted` (escaped as a str's Debug form, so a peer
//! cannot forge a log line), durations through `text::duration`, times through
//! `text::rfc3339`, optional values through `text::or_dash`. `impl Debug` blocks, `#[cfg(test)]`
//! items and test-only modules are not scanned.
//!
//! Run: `cargo nextest run -p argocd-agent-e2e --test user_text` (no binaries, no servers).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[path = "support/rust_files.rs"]
mod rust_files;
use rust_files::rust_files;

/// The crates whose text reaches users (the shipped binaries' crates).
const SHIPPED: [&str; 9] = [
    "principal",
    "agent",
    "cli",
    "runtime",
    "identity",
    "mesh",
    "redis",
    "kubernetes",
    "domain",
];

/// Files allowed a number of Debug-formatted sites, each with the reason. The count is exact:
/// a new site fails the test, and so does one fixed but still counted here, so the list only
/// gets shorter.
const KNOWN: [(&str, usize, &str); 0] = [];

/// One Debug-formatted site: file (from the workspace root), line, and the line's text.
type Site = (String, usize, String);

/// A source file read for the scan: `code` is the source with comments blanked and the
/// contents of string and char literals blanked (quotes kept, offsets unchanged); `literals`
/// are the string literals' (start, end) char offsets, contents between them.
struct Lexed {
    src: Vec<char>,
    code: Vec<char>,
    literals: Vec<(usize, usize)>,
}

fn blank(c: char) -> char {
    if c == '\n' { '\n' } else { ' ' }
}

fn lex(text: &str) -> Lexed {
    let src: Vec<char> = text.chars().collect();
    let mut code = src.clone();
    let mut literals = Vec::new();
    let n = src.len();
    let mut i = 0;
    let ident_before = |i: usize| i > 0 && (src[i - 1].is_alphanumeric() || src[i - 1] == '_');
    while i < n {
        let c = src[i];
        let next = src.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < n && src[i] != '\n' {
                code[i] = ' ';
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < n {
                if src[i] == '/' && src.get(i + 1) == Some(&'*') {
                    depth += 1;
                    code[i] = ' ';
                    code[i + 1] = ' ';
                    i += 2;
                } else if src[i] == '*' && src.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    code[i] = ' ';
                    code[i + 1] = ' ';
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    code[i] = blank(src[i]);
                    i += 1;
                }
            }
        } else if (c == 'r' && matches!(next, Some('"') | Some('#')) && !ident_before(i))
            || (c == 'b' && next == Some('r') && !ident_before(i))
        {
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            let mut hashes = 0;
            while j < n && src[j] == '#' {
                hashes += 1;
                j += 1;
            }
            if j >= n || src[j] != '"' {
                i += 1;
                continue;
            }
            let start = j;
            j += 1;
            loop {
                if j >= n {
                    break;
                }
                if src[j] == '"' && (0..hashes).all(|k| src.get(j + 1 + k) == Some(&'#')) {
                    break;
                }
                code[j] = blank(src[j]);
                j += 1;
            }
            literals.push((start, j));
            i = j + 1 + hashes;
        } else if c == '"' {
            let start = i;
            let mut j = i + 1;
            while j < n && src[j] != '"' {
                let step = if src[j] == '\\' { 2 } else { 1 };
                for k in j..(j + step).min(n) {
                    code[k] = blank(src[k]);
                }
                j += step;
            }
            literals.push((start, j));
            i = j + 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime.
            let close = if next == Some('\\') {
                (i + 2..n.min(i + 12)).find(|&k| src[k] == '\'')
            } else if src.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(end) => {
                    code[i + 1..end].fill(' ');
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    Lexed {
        src,
        code,
        literals,
    }
}

/// The offset of the bracket closing the one at `open`, in blanked code.
fn closing(code: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, &c) in code.iter().enumerate().skip(open) {
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    code.len()
}

fn starts_with(code: &[char], at: usize, word: &str) -> bool {
    word.chars()
        .enumerate()
        .all(|(k, c)| code.get(at + k) == Some(&c))
}

/// The char ranges that are not scanned (test items, `impl Debug` blocks), and the names of
/// test-only child modules declared here (`#[cfg(test)] mod tests;`).
fn skipped(code: &[char]) -> (Vec<(usize, usize)>, Vec<String>) {
    let text: String = code.iter().collect();
    let mut ranges = Vec::new();
    let mut modules = Vec::new();
    let mut search = 0;
    while let Some(found) = text[search..].find("#[cfg(") {
        let at = search + found;
        search = at + 1;
        let pos = text[..at].chars().count();
        let close = closing(code, pos + 1);
        let cond: String = code[pos + 6..close.min(code.len())].iter().collect();
        let is_test = (cond.contains("test") && !cond.trim_start().starts_with("not("))
            || cond.contains("test-util");
        if !is_test {
            continue;
        }
        // Skip further attributes and whitespace to the item.
        let mut k = close + 1;
        loop {
            while k < code.len() && code[k].is_whitespace() {
                k += 1;
            }
            if starts_with(code, k, "#[") {
                k = closing(code, k + 1) + 1;
            } else {
                break;
            }
        }
        let item_start = k;
        let mut end = k;
        while end < code.len() && code[end] != '{' && code[end] != ';' {
            end += 1;
        }
        let header: String = code[item_start..end.min(code.len())].iter().collect();
        let words: Vec<&str> = header.split_whitespace().collect();
        if end < code.len() && code[end] == ';' {
            if let Some(p) = words.iter().position(|w| *w == "mod")
                && let Some(name) = words.get(p + 1)
            {
                modules.push(name.to_string());
            }
            ranges.push((pos, end + 1));
        } else {
            ranges.push((pos, closing(code, end) + 1));
        }
    }
    // `impl Debug for X { ... }`: Debug output is what Debug is for.
    let mut search = 0;
    while let Some(found) = text[search..].find("impl") {
        let at = search + found;
        search = at + 4;
        let pos = text[..at].chars().count();
        let ident_around = (pos > 0 && (code[pos - 1].is_alphanumeric() || code[pos - 1] == '_'))
            || code
                .get(pos + 4)
                .is_some_and(|c| c.is_alphanumeric() || *c == '_');
        if ident_around {
            continue;
        }
        let mut end = pos;
        while end < code.len() && code[end] != '{' && code[end] != ';' {
            end += 1;
        }
        let header: String = code[pos..end.min(code.len())].iter().collect();
        if end < code.len() && code[end] == '{' && header.contains("Debug for") {
            ranges.push((pos, closing(code, end) + 1));
        }
    }
    (ranges, modules)
}

/// The Debug-formatted sites of one file's text, as (line, line text).
fn debug_sites(text: &str) -> (Vec<(usize, String)>, Vec<String>) {
    let lexed = lex(text);
    let (dead, modules) = skipped(&lexed.code);
    let live = |at: usize| !dead.iter().any(|&(a, b)| at >= a && at < b);
    let mut offsets = Vec::new();
    // `{:?}`, `{x:?}`, `{:#?}` in a string literal.
    for &(start, end) in &lexed.literals {
        if !live(start) {
            continue;
        }
        let body = &lexed.src[start + 1..end.min(lexed.src.len())];
        let mut k = 0;
        while k < body.len() {
            if body[k] == '{' && body.get(k + 1) == Some(&'{') {
                k += 2;
                continue;
            }
            if body[k] == '{' {
                let close = (k + 1..body.len()).find(|&j| body[j] == '}' || body[j] == '{');
                if let Some(j) = close.filter(|&j| body[j] == '}') {
                    let inner: String = body[k + 1..j].iter().collect();
                    if inner
                        .split_once(':')
                        .is_some_and(|(_, spec)| spec.ends_with('?'))
                    {
                        offsets.push(start + 1 + k);
                    }
                    k = j + 1;
                    continue;
                }
            }
            k += 1;
        }
    }
    // A tracing field logged with `?`: `?` after `=`, `(` or `,` and before an expression
    // (the `?` operator follows an expression; `?Sized` follows `:` or `+`).
    let code = &lexed.code;
    for (k, &c) in code.iter().enumerate() {
        if c != '?' || !live(k) {
            continue;
        }
        let before = code[..k].iter().rev().find(|c| !c.is_whitespace());
        let after = code[k + 1..].iter().find(|c| !c.is_whitespace());
        let field_sigil = matches!(before, Some('=') | Some('(') | Some(','))
            && after.is_some_and(|c| c.is_alphabetic() || matches!(c, '_' | '&' | '*' | '('));
        if field_sigil {
            offsets.push(k);
        }
    }
    offsets.sort_unstable();
    let lines: Vec<&str> = text.lines().collect();
    let mut sites: Vec<(usize, String)> = offsets
        .into_iter()
        .map(|at| {
            let line = lexed.src[..at].iter().filter(|&&c| c == '\n').count() + 1;
            (line, lines.get(line - 1).unwrap_or(&"").trim().to_string())
        })
        .collect();
    sites.dedup_by_key(|s| s.0);
    (sites, modules)
}

/// Every Debug-formatted site of a crate's non-test source.
fn crate_sites(root: &Path, krate: &str) -> Vec<Site> {
    let src = root.join(krate).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut per_file = BTreeMap::new();
    let mut test_only: Vec<PathBuf> = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read source");
        let (sites, modules) = debug_sites(&text);
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let dir = file.parent().expect("a parent").to_path_buf();
        let base = if matches!(stem, "mod" | "lib" | "main") {
            dir
        } else {
            dir.join(stem)
        };
        for m in modules {
            test_only.push(base.join(format!("{m}.rs")));
            test_only.push(base.join(&m));
        }
        per_file.insert(file.clone(), sites);
    }
    let mut out = Vec::new();
    for (file, sites) in per_file {
        if test_only.iter().any(|t| file == *t || file.starts_with(t)) {
            continue;
        }
        let rel = file
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        out.extend(sites.into_iter().map(|(l, t)| (rel.clone(), l, t)));
    }
    out
}

#[test]
fn shipped_crates_format_nothing_a_user_reads_with_debug() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let mut found: Vec<Site> = Vec::new();
    for krate in SHIPPED {
        found.extend(crate_sites(root, krate));
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (file, _, _) in &found {
        if let Some((known, _, _)) = KNOWN.iter().find(|(k, _, _)| k == file) {
            *counts.entry(known).or_default() += 1;
        }
    }
    let new: Vec<String> = found
        .iter()
        .filter(|(file, _, _)| !KNOWN.iter().any(|(k, _, _)| k == file))
        .map(|(file, line, text)| format!("{file}:{line}: {text}"))
        .collect();
    let stale: Vec<String> = KNOWN
        .iter()
        .filter(|(k, n, _)| counts.get(k).copied().unwrap_or(0) != *n)
        .map(|(k, n, _)| {
            format!(
                "{k}: listed with {n} sites, has {}",
                counts.get(k).copied().unwrap_or(0)
            )
        })
        .collect();
    assert!(
        new.is_empty() && stale.is_empty(),
        "Debug formatting in text users read (use text::quoted for names and values from \
         outside, text::duration, text::rfc3339, text::or_dash, or a Display impl):\n{}\n\
         KNOWN out of date (update the count, or drop the entry):\n{}",
        new.join("\n"),
        stale.join("\n")
    );
}

#[test]
fn the_scan_finds_debug_fields_and_placeholders_and_nothing_else() {
    let text = r##"
use std::fmt;
fn f<T: ?Sized>(x: &T) -> Result<(), E> {
    let y = g()?;
    tracing::info!(a = ?y, "plain {y}");
    tracing::warn!(?y, b = %y, "{:?}", y);
    let s = format!("{y:?} {{not:?}} {z:#?}", z = 1);
    // tracing::info!(a = ?y, "{y:?}") in a comment
    let t = "a ? in = ?text";
    let r = r#"{raw:?}"#;
    Ok(())
}
impl fmt::Debug for Thing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Thing({:?})", self.0)
    }
}
#[cfg(test)]
mod tests {
    fn t() { println!("{:?}", 1); tracing::info!(a = ?1); }
}
#[cfg(test)]
mod more;
"##;
    let (sites, modules) = debug_sites(text);
    let lines: Vec<usize> = sites.iter().map(|s| s.0).collect();
    assert_eq!(lines, vec![5, 6, 7, 10]);
    assert_eq!(modules, vec!["more".to_string()]);
}
