//! No import circles between the files of a crate: every `.rs` file under a crate's `src/` is a
//! node, every `use crate::…`/`super::…`/`self::…` import, every fully-qualified `crate::x::y`
//! path and every bare path through a child module is an edge to the module file it names
//! (module = file, `foo.rs` or `foo/mod.rs`; a path resolves to its longest existing module
//! prefix; a name re-exported by the crate root resolves to the file it comes from). A
//! strongly connected component of more than one file is a circle, and the test names its files.
//!
//! Run: `cargo nextest run -p argocd-agent-e2e --test structure` (no binaries, no servers).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "support/rust_files.rs"]
mod rust_files;
use rust_files::rust_files;

/// Crates kept free of circles (beyond the [`KNOWN`] ones). The principal's core (sessions,
/// hub, Applications, configuration objects, bounds, quotas, metrics) is layered: refusal
/// reasons live in the leaf `refusals.rs`, `metrics.rs` imports none of its callers, the
/// hub's admission checks extend `Hub` from `hub/admit.rs`, and the agent-name and
/// secret-type labels come from the kubernetes crate (issue 40).
const CHECKED: [&str; 9] = [
    "principal",
    "domain",
    "agent",
    "identity",
    "listener",
    "mesh",
    "kubernetes",
    "runtime",
    "redis",
];

/// Circles not broken yet (issue 40), each exactly as found: a new circle, or one of these
/// growing or shrinking, fails the test, and so does one that is gone but still listed here, so
/// the list only gets shorter. Most are a parent `mod.rs` or `lib.rs` holding a type its
/// children use while it imports them: the fix is to move that type into a leaf module.
const KNOWN: [(&str, &[&str]); 0] = [];

/// A module path from the crate root, e.g. `["proxy", "rules"]`.
type ModPath = Vec<String>;

/// The file-level import graph of one crate: file (relative to `src/`) to the files it imports.
type Graph = BTreeMap<PathBuf, BTreeSet<PathBuf>>;

/// The module path a file under `src/` defines: `lib.rs` and `main.rs` are the root.
fn module_of(rel: &Path) -> ModPath {
    let mut parts: ModPath = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    let at_root = parts.is_empty();
    if !(stem == "mod" || (at_root && (stem == "lib" || stem == "main"))) {
        parts.push(stem.to_string());
    }
    parts
}

/// The source without comments, string literals and char literals (lifetimes kept), so that
/// paths inside them are not read as imports.
fn strip(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i = skip_block_comment(&b, i);
        } else if c == 'r' && matches!(next, Some('"') | Some('#')) && !ident_before(&b, i) {
            i = skip_raw_string(&b, i);
            out.push_str("\"\"");
        } else if c == '"' {
            i = skip_quoted(&b, i, '"');
            out.push_str("\"\"");
        } else if c == '\'' && is_char_literal(&b, i) {
            i = skip_quoted(&b, i, '\'');
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

fn skip_block_comment(b: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < b.len() {
        if b[i] == '/' && b.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

fn skip_raw_string(b: &[char], mut i: usize) -> usize {
    i += 1;
    let mut hashes = 0;
    while b.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    if b.get(i) != Some(&'"') {
        return i;
    }
    i += 1;
    while i < b.len() {
        if b[i] == '"' && (1..=hashes).all(|k| b.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

fn skip_quoted(b: &[char], mut i: usize, quote: char) -> usize {
    i += 1;
    while i < b.len() {
        match b[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// `'x'` or `'\n'` rather than a lifetime `'a`.
fn is_char_literal(b: &[char], i: usize) -> bool {
    match b.get(i + 1) {
        Some('\\') => true,
        Some(_) => b.get(i + 2) == Some(&'\''),
        None => false,
    }
}

/// A token of stripped source: an identifier, `::`, or one punctuation character.
fn tokens(src: &str) -> Vec<String> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push(b[start..i].iter().collect());
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Every path a file names, each with the inline module it sits in (relative to the file's
/// module): `use` trees expanded, and every other `a::b::c` path.
fn paths_in(src: &str) -> Vec<(ModPath, ModPath)> {
    let toks = tokens(&strip(src));
    let mut out = Vec::new();
    // Inline modules open at a brace depth; `mod tests { … }` shifts `super::` by one.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].as_str();
        let scope = || inline.iter().map(|(n, _)| n.clone()).collect::<ModPath>();
        match t {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if toks.get(i + 2).is_some_and(|t| t == "{") => {
                inline.push((toks[i + 1].clone(), depth));
                depth += 1;
                i += 3;
                continue;
            }
            "use" => {
                let end = (i..toks.len())
                    .find(|&k| toks[k] == ";")
                    .unwrap_or(toks.len());
                let mut found = Vec::new();
                use_tree(&toks[i + 1..end], Vec::new(), &mut found);
                out.extend(found.into_iter().map(|p| (scope(), p)));
                i = end + 1;
                continue;
            }
            _ if is_ident(t) && toks.get(i + 1).is_some_and(|t| t == "::") => {
                let before = i.checked_sub(1).map(|k| toks[k].as_str());
                let mut path = vec![t.to_string()];
                let mut k = i + 1;
                while toks.get(k).is_some_and(|t| t == "::")
                    && toks.get(k + 1).is_some_and(|t| is_ident(t))
                {
                    path.push(toks[k + 1].clone());
                    k += 2;
                }
                if before != Some("::") {
                    out.push((scope(), path));
                }
                i = k;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Expands a `use` tree (`a::{b, c::{d as e, self}}`) into full paths.
fn use_tree(toks: &[String], prefix: ModPath, out: &mut Vec<ModPath>) {
    // The empty entry after a trailing comma (`use crate::{a, b,}`) names nothing.
    if toks.is_empty() {
        return;
    }
    let mut path = prefix;
    let mut i = 0;
    while i < toks.len() {
        match toks[i].as_str() {
            "::" | "pub" => {}
            "(" => {
                // `pub(crate) use`: skip the visibility.
                while i < toks.len() && toks[i] != ")" {
                    i += 1;
                }
            }
            "{" => {
                let mut depth = 0;
                let mut start = i + 1;
                for k in i..toks.len() {
                    match toks[k].as_str() {
                        "{" => depth += 1,
                        "}" => {
                            depth -= 1;
                            if depth == 0 {
                                use_tree(&toks[start..k], path.clone(), out);
                                return;
                            }
                        }
                        "," if depth == 1 => {
                            use_tree(&toks[start..k], path.clone(), out);
                            start = k + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            "as" => break,
            "*" => break,
            t if t == "self" && !path.is_empty() => {}
            t if is_ident(t) => path.push(t.to_string()),
            _ => {}
        }
        i += 1;
    }
    if !path.is_empty() {
        out.push(path);
    }
}

/// The absolute module path a path names from module `here`, if it stays in this crate:
/// `crate::`, `super::`, `self::`, or a bare path starting with a module of this crate that is
/// a child of `here`.
fn absolute(here: &[String], path: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut base: ModPath = here.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) => {
            let mut child = base.clone();
            child.push(first.to_string());
            if !modules.contains(&child) {
                return None;
            }
        }
        None => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The file a module path lands in: the longest prefix that is a module file.
fn file_for(path: &[String], files: &BTreeMap<ModPath, PathBuf>) -> Option<PathBuf> {
    (0..=path.len())
        .rev()
        .find_map(|n| files.get(&path[..n]).cloned())
}

/// The file-level import graph of the crate whose sources are in `src`.
fn import_graph(src: &Path) -> Graph {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    let files: BTreeMap<ModPath, PathBuf> = paths
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(src).expect("under src").to_path_buf();
            (module_of(&rel), rel)
        })
        .collect();
    let modules: BTreeSet<ModPath> = files.keys().cloned().collect();
    let sources: BTreeMap<PathBuf, String> = paths
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(src).expect("under src").to_path_buf();
            let text = std::fs::read_to_string(p).expect("read source");
            (rel, text)
        })
        .collect();
    let reexports = reexports(&files, &sources, &modules);
    let mut graph = Graph::new();
    for (module, rel) in &files {
        let edges = graph.entry(rel.clone()).or_default();
        for (inline, path) in paths_in(&sources[rel]) {
            let mut here = module.clone();
            here.extend(inline);
            let Some(target) = absolute(&here, &path, &modules) else {
                continue;
            };
            let target = through_reexports(target, &files, &reexports);
            if let Some(file) = file_for(&target, &files).filter(|f| f != rel) {
                edges.insert(file);
            }
        }
    }
    graph
}

/// Re-exported names (`pub use a::b::Name;` at a module's top level, and exported macros at
/// the root), keyed by the module that re-exports them, with the absolute path they come from.
type Reexports = BTreeMap<(ModPath, String), ModPath>;

fn reexports(
    files: &BTreeMap<ModPath, PathBuf>,
    sources: &BTreeMap<PathBuf, String>,
    modules: &BTreeSet<ModPath>,
) -> Reexports {
    let mut out = Reexports::new();
    for (module, rel) in files {
        let toks = tokens(&strip(&sources[rel]));
        let mut depth = 0usize;
        for (i, t) in toks.iter().enumerate() {
            // `#[macro_export] macro_rules! name` lives at the crate root as `crate::name`.
            let exported = toks[..i].iter().rev().take(8).any(|t| t == "macro_export");
            if let Some(name) = toks.get(i + 2).filter(|_| t == "macro_rules" && exported) {
                let mut origin = module.clone();
                origin.push(name.clone());
                out.insert((Vec::new(), name.clone()), origin);
            }
            match t.as_str() {
                "{" => depth += 1,
                "}" => depth = depth.saturating_sub(1),
                _ => {}
            }
            let public = i > 0 && matches!(toks[i - 1].as_str(), "pub" | ")");
            if t != "use" || depth != 0 || !public {
                continue;
            }
            let end = (i..toks.len())
                .find(|&k| toks[k] == ";")
                .unwrap_or(toks.len());
            let mut found = Vec::new();
            use_tree(&toks[i + 1..end], Vec::new(), &mut found);
            for path in found {
                let name = path.last().cloned().unwrap_or_default();
                let mut child = module.clone();
                child.push(name.clone());
                if modules.contains(&child) {
                    continue;
                }
                if let Some(target) = absolute(module, &path, modules) {
                    out.insert((module.clone(), name), target);
                }
            }
        }
    }
    out
}

/// Follows re-exports: `crate::Name` re-exported from `a::Name` becomes `a::Name`.
fn through_reexports(
    mut target: ModPath,
    files: &BTreeMap<ModPath, PathBuf>,
    reexports: &Reexports,
) -> ModPath {
    for _ in 0..8 {
        let Some(n) = (0..=target.len())
            .rev()
            .find(|&n| files.contains_key(&target[..n]))
        else {
            break;
        };
        let Some(name) = target.get(n) else {
            break;
        };
        let Some(origin) = reexports.get(&(target[..n].to_vec(), name.clone())) else {
            break;
        };
        let mut next = origin.clone();
        next.extend(target[n + 1..].iter().cloned());
        if next == target {
            break;
        }
        target = next;
    }
    target
}

/// Strongly connected components with more than one file (Tarjan).
fn circles(graph: &Graph) -> Vec<Vec<PathBuf>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g PathBuf, usize>,
        low: BTreeMap<&'g PathBuf, usize>,
        stack: Vec<&'g PathBuf>,
        on_stack: BTreeSet<&'g PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g PathBuf) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

fn show(found: &[Vec<PathBuf>]) -> String {
    found
        .iter()
        .map(|c| {
            let names: Vec<_> = c.iter().map(|p| p.display().to_string()).collect();
            format!("[{}]", names.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The imports inside each circle, `from -> to`, so a failure says which arrow to break.
fn arrows(graph: &Graph, circle: &[PathBuf]) -> String {
    let mut out = Vec::new();
    for from in circle {
        for to in graph[from].iter().filter(|t| circle.contains(t)) {
            out.push(format!("    {} -> {}", from.display(), to.display()));
        }
    }
    out.join("\n")
}

#[test]
fn core_crates_have_no_import_circle_beyond_the_known_ones() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let mut failures = Vec::new();
    for krate in CHECKED {
        let graph = import_graph(&workspace.join(krate).join("src"));
        assert!(graph.len() > 1, "{krate}: no sources found");
        let found = circles(&graph);
        let known: Vec<Vec<PathBuf>> = KNOWN
            .iter()
            .filter(|(k, _)| *k == krate)
            .map(|(_, files)| files.iter().map(PathBuf::from).collect())
            .collect();
        for circle in found.iter().filter(|c| !known.contains(c)) {
            let edges = arrows(&graph, circle);
            failures.push(format!(
                "{krate}/src: {}\n{edges}",
                show(std::slice::from_ref(circle))
            ));
        }
        for gone in known.iter().filter(|c| !found.contains(c)) {
            failures.push(format!(
                "{krate}/src: {} is no longer a circle as listed: update KNOWN",
                show(std::slice::from_ref(gone))
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "import circles:\n{}",
        failures.join("\n")
    );
}

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

#[test]
fn a_circle_through_super_and_crate_paths_is_found_and_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    write(src, "lib.rs", "mod a;\nmod leaf;\npub mod b;\n");
    write(src, "a.rs", "use crate::b::{c::Thing, Other as O};\n");
    write(src, "b/mod.rs", "pub mod c;\npub struct Other;\n");
    write(src, "b/c.rs", "pub struct Thing(super::super::a::X);\n");
    write(src, "leaf.rs", "fn f() -> crate::a::X { todo!() }\n");
    let found = circles(&import_graph(src));
    let want: Vec<PathBuf> = ["a.rs", "b/c.rs"].map(PathBuf::from).into();
    assert_eq!(found, vec![want], "{}", show(&found));
}

#[test]
fn paths_in_comments_strings_and_test_modules_make_no_circle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    write(src, "lib.rs", "mod a;\nmod b;\n");
    write(
        src,
        "a.rs",
        "// crate::b::X\nconst S: &str = \"crate::b::Y\";\npub struct A<'a>(&'a str);\n",
    );
    write(
        src,
        "b.rs",
        "use crate::a::A;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    );
    assert!(circles(&import_graph(src)).is_empty());
}

#[test]
fn a_name_reexported_by_the_root_resolves_to_its_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    write(
        src,
        "lib.rs",
        "mod a;\nmod b;\npub use a::Alpha;\npub use b::Beta;\n",
    );
    write(src, "a.rs", "pub struct Alpha(crate::Beta);\n");
    write(src, "b.rs", "pub struct Beta;\nfn f(_: crate::Alpha) {}\n");
    let found = circles(&import_graph(src));
    let want: Vec<PathBuf> = ["a.rs", "b.rs"].map(PathBuf::from).into();
    assert_eq!(found, vec![want], "{}", show(&found));
}

#[test]
fn a_trailing_comma_in_a_use_list_is_no_arrow_to_the_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    write(
        src,
        "lib.rs",
        "mod a;\nmod b;\npub struct Root(a::Alpha);\n",
    );
    write(
        src,
        "a.rs",
        "use crate::{\n    b::Beta,\n};\npub struct Alpha(Beta);\n",
    );
    write(src, "b.rs", "pub struct Beta;\n");
    let graph = import_graph(src);
    let from_a: Vec<&PathBuf> = graph[&PathBuf::from("a.rs")].iter().collect();
    assert_eq!(from_a, vec![&PathBuf::from("b.rs")]);
    assert!(circles(&graph).is_empty());
}
