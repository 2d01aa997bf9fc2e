//! The walks of `docs/architecture.md`, recounted from the code.
//!
//! A walk section there has a table whose rows name, in order, the files a value passes
//! through and the functions there that pass it on, the names the value goes by
//! (`**Values:**`), the other files it enters on the way (`**Also enters:**`, counted too), the
//! functions of other branches it does not take (`**Not taken:**`: another listener's way of
//! authenticating), and its count (`**Count:** N files in M crates, K crate crossings`). This test reads the code
//! (with `syn`, nothing is run) and checks, for every walk:
//!
//! - every function a row names is defined in that row's files (outside tests);
//! - each row's functions are called by a row before it, directly or through helpers in that
//!   row's own file (a row whose functions cell says "called by" is entered by a library:
//!   rustls, tonic);
//! - every call in those functions (and the same-file helpers they hand the value to) that is
//!   handed the value, under one of its names or a local bound from it, and that lands on a
//!   function of the project lands in a file the walk lists: a gate left off the table fails;
//! - the count line is what the table gives: distinct files, their crates, and the calls that
//!   cross into another crate (a row in another crate than the one before it, unless it
//!   returns to the crate the walk came from, which is a return and no crossing).
//!
//! What it cannot see: a call is resolved by name (and by the receiver's field name or the
//! path's module, `sessions.partition.admit` to `partition.rs`); when several project
//! functions bear the name and none is singled out, the call counts as listed if one of them
//! is. Values passed through channels and the gRPC stream are rows entered by the stream.
//! `WALK_DEBUG=1` prints every call followed and where it lands.
//!
//! Run: `cargo nextest run -p argocd-agent-e2e --test walks --no-capture` (prints each walk
//! as counted).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

#[path = "support/rust_files.rs"]
mod rust_files;
use rust_files::rust_files;

/// The crates whose functions a walk may enter.
const PROJECT: [&str; 9] = [
    "identity",
    "listener",
    "principal",
    "domain",
    "mesh",
    "kubernetes",
    "runtime",
    "agent",
    "redis",
];

/// Method and function names so common in std and its companions that a call to them is
/// never taken for a project function of the same name.
const GENERIC: &[&str] = &[
    "clone",
    "to_owned",
    "to_string",
    "as_ref",
    "as_str",
    "as_deref",
    "map",
    "and_then",
    "ok_or",
    "ok_or_else",
    "map_err",
    "unwrap_or",
    "unwrap_or_else",
    "unwrap_or_default",
    "iter",
    "into",
    "from",
    "get",
    "insert",
    "remove",
    "contains",
    "len",
    "is_empty",
    "push",
    "extend",
    "lock",
    "new",
    "default",
    "cloned",
    "copied",
    "first",
    "last",
    "send",
    "recv",
    "take",
    "then",
    "filter",
    "find",
    "collect",
    "spawn",
    "read",
    "write",
    "load",
    "store",
    "ok",
    "err",
    "is_some",
    "is_none",
    "expect",
    "unwrap",
    "as_mut",
    "borrow",
    "deref",
    "fmt",
    "eq",
    "cmp",
    "hash",
    "next",
    "poll_next",
    "with_capacity",
    "matches",
    "is_match",
    "captures",
    "parse",
    "starts_with",
    "ends_with",
    "path",
    "query",
    "method",
    "headers",
    "uri",
    "decode",
    "encode",
    "get_ref",
    "get_mut",
];

/// One function of the project, outside tests.
struct FnDef {
    /// Path from the workspace root, e.g. `principal/src/auth.rs`.
    file: String,
    /// The type of its `impl` (or its trait), if any.
    owner: Option<String>,
    name: String,
    has_self: bool,
    /// Parameter names in order (without `self`); `_` for patterns.
    params: Vec<String>,
    block: syn::Block,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn is_test_attr(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let text = quote_attr(a);
        text.contains("cfg(test)") || text == "test" || text.ends_with("::test")
    })
}

fn quote_attr(a: &syn::Attribute) -> String {
    let path = a
        .path()
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::");
    match &a.meta {
        syn::Meta::List(list) => format!("{path}({})", list.tokens).replace(' ', ""),
        _ => path,
    }
}

fn last_ident(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        syn::Type::Reference(r) => last_ident(&r.elem),
        _ => None,
    }
}

fn fn_def(file: &str, owner: Option<String>, sig: &syn::Signature, block: &syn::Block) -> FnDef {
    let mut has_self = false;
    let mut params = Vec::new();
    for input in &sig.inputs {
        match input {
            syn::FnArg::Receiver(_) => has_self = true,
            syn::FnArg::Typed(t) => params.push(match &*t.pat {
                syn::Pat::Ident(i) => i.ident.to_string(),
                _ => "_".into(),
            }),
        }
    }
    FnDef {
        file: file.into(),
        owner,
        name: sig.ident.to_string(),
        has_self,
        params,
        block: block.clone(),
    }
}

fn collect_items(file: &str, items: &[syn::Item], out: &mut Vec<FnDef>) {
    for item in items {
        match item {
            syn::Item::Fn(f) if !is_test_attr(&f.attrs) => {
                out.push(fn_def(file, None, &f.sig, &f.block));
            }
            syn::Item::Impl(i) if !is_test_attr(&i.attrs) => {
                let owner = last_ident(&i.self_ty);
                for it in &i.items {
                    if let syn::ImplItem::Fn(f) = it
                        && !is_test_attr(&f.attrs)
                    {
                        out.push(fn_def(file, owner.clone(), &f.sig, &f.block));
                    }
                }
            }
            syn::Item::Trait(t) if !is_test_attr(&t.attrs) => {
                for it in &t.items {
                    if let syn::TraitItem::Fn(f) = it
                        && let Some(block) = &f.default
                    {
                        out.push(fn_def(file, Some(t.ident.to_string()), &f.sig, block));
                    }
                }
            }
            syn::Item::Mod(m) if !is_test_attr(&m.attrs) => {
                if let Some((_, items)) = &m.content {
                    collect_items(file, items, out);
                }
            }
            _ => {}
        }
    }
}

/// Every function of the project's crates, outside tests.
fn index() -> Vec<FnDef> {
    let root = workspace();
    let mut out = Vec::new();
    for krate in PROJECT {
        let dir = root.join(krate).join("src");
        if !dir.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        for path in files {
            let rel = path
                .strip_prefix(&root)
                .expect("under the workspace")
                .to_string_lossy()
                .replace('\\', "/");
            if rel.ends_with("/tests.rs") || rel.contains("/tests/") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read source");
            let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("parse {rel}: {e}"));
            collect_items(&rel, &parsed.items, &mut out);
        }
    }
    out
}

/// A walk as `docs/architecture.md` tells it.
#[derive(Debug, Default)]
struct Walk {
    title: String,
    rows: Vec<Row>,
    values: Vec<String>,
    also: Vec<String>,
    /// Functions of another branch (`identify_jwt` on the mTLS walk, `logs::serve` for a
    /// `get`), which the walk does not enter: a name, or `module::name` for one of several.
    not_taken: Vec<String>,
    count: Option<(usize, usize, usize)>,
}

#[derive(Debug)]
struct Row {
    files: Vec<String>,
    /// (owner, name)
    functions: Vec<(Option<String>, String)>,
    called_by_library: bool,
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

fn parse_walks(doc: &str) -> Vec<Walk> {
    let mut walks = Vec::new();
    let mut current: Option<Walk> = None;
    for line in doc.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            if let Some(w) = current.take() {
                walks.push(w);
            }
            if title.starts_with("Walk") {
                current = Some(Walk {
                    title: title.to_string(),
                    ..Walk::default()
                });
            }
            continue;
        }
        let Some(walk) = current.as_mut() else {
            continue;
        };
        if let Some(rest) = line.strip_prefix("**Values:**") {
            walk.values = backticked(rest);
        } else if let Some(rest) = line.strip_prefix("**Also enters:**") {
            walk.also = backticked(rest)
                .into_iter()
                .filter(|f| f.ends_with(".rs"))
                .collect();
        } else if let Some(rest) = line.strip_prefix("**Not taken:**") {
            walk.not_taken = backticked(rest);
        } else if let Some(rest) = line.strip_prefix("**Count:**") {
            let nums: Vec<usize> = rest
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().expect("number"))
                .take(3)
                .collect();
            assert_eq!(nums.len(), 3, "{}: count line `{rest}`", walk.title);
            walk.count = Some((nums[0], nums[1], nums[2]));
        } else if line.starts_with("| ") {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // ["", "#", "files", "functions", "what", ""]
            if cells.len() < 5 || cells[1].parse::<usize>().is_err() {
                continue;
            }
            let files = backticked(cells[2]);
            let functions = backticked(cells[3])
                .into_iter()
                .map(|f| match f.rsplit_once("::") {
                    Some((path, name)) => {
                        let owner = path.rsplit("::").next().unwrap_or(path);
                        let is_type = owner.chars().next().is_some_and(char::is_uppercase);
                        (is_type.then(|| owner.to_string()), name.to_string())
                    }
                    None => (None, f),
                })
                .collect();
            walk.rows.push(Row {
                files,
                functions,
                called_by_library: cells[3].contains("called by"),
            });
        }
    }
    if let Some(w) = current.take() {
        walks.push(w);
    }
    walks.into_iter().filter(|w| w.count.is_some()).collect()
}

/// A call found in a body: its name, the qualifier before it (`auth` in `auth::identify`,
/// the type in `Type::f`), whether it is a method call, and which argument positions (and the
/// receiver) mention the value.
#[derive(Debug)]
struct Call {
    name: String,
    /// The last name of a method call's receiver (`partition` in `sessions.partition.admit`).
    receiver_hint: Option<String>,
    qualifier: Option<String>,
    method: bool,
    receiver_tainted: bool,
    tainted_args: Vec<usize>,
    args: usize,
}

/// Whether an expression mentions any of `names` as a path's first segment.
fn mentions(expr: &syn::Expr, names: &HashSet<String>, values: &HashSet<String>) -> bool {
    find(expr, names, values, false)
}

/// Whether an argument hands on the value itself: as [`mentions`], but the result of a call
/// of the project (`method_verb(&req.method)`) is something made from the value, not the
/// value; through std's own (`req.clone()`, `Some(req)`, `Box::new(req)`) it is the value.
fn hands_on(expr: &syn::Expr, names: &HashSet<String>, values: &HashSet<String>) -> bool {
    find(expr, names, values, true)
}

fn find(expr: &syn::Expr, names: &HashSet<String>, values: &HashSet<String>, direct: bool) -> bool {
    struct Finder<'a> {
        names: &'a HashSet<String>,
        values: &'a HashSet<String>,
        direct: bool,
        found: bool,
    }
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
            let std_own = match &*c.func {
                syn::Expr::Path(p) => p.path.segments.last().is_some_and(|s| {
                    let name = s.ident.to_string();
                    GENERIC.contains(&name.as_str())
                        || name.chars().next().is_some_and(char::is_uppercase)
                }),
                _ => false,
            };
            if !self.direct || std_own {
                syn::visit::visit_expr_call(self, c);
            }
        }
        fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
            if !self.direct || GENERIC.contains(&m.method.to_string().as_str()) {
                syn::visit::visit_expr_method_call(self, m);
            }
        }
        fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
            if let Some(first) = p.path.segments.first()
                && p.path.segments.len() == 1
                && self.names.contains(&first.ident.to_string())
            {
                self.found = true;
            }
        }
        fn visit_expr_field(&mut self, f: &'ast syn::ExprField) {
            // `identity.client` hands on the value when every field is one of its names
            // (`caller.peer`); `identity.agent` hands on something else (the agent's name).
            let mut fields = Vec::new();
            let mut base: &syn::Expr = &f.base;
            fields.push(member(&f.member));
            while let syn::Expr::Field(inner) = base {
                fields.push(member(&inner.member));
                base = &inner.base;
            }
            if let syn::Expr::Path(p) = base
                && p.path.segments.len() == 1
                && self.names.contains(&p.path.segments[0].ident.to_string())
            {
                if fields.iter().all(|f| self.values.contains(f)) {
                    self.found = true;
                }
                return;
            }
            syn::visit::visit_expr_field(self, f);
        }
        fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}
    }
    fn member(m: &syn::Member) -> String {
        match m {
            syn::Member::Named(i) => i.to_string(),
            syn::Member::Unnamed(i) => i.index.to_string(),
        }
    }
    let mut f = Finder {
        names,
        values,
        direct,
        found: false,
    };
    f.visit_expr(expr);
    f.found
}

fn pat_idents(pat: &syn::Pat, out: &mut Vec<String>) {
    struct Idents<'a>(&'a mut Vec<String>);
    impl<'ast> Visit<'ast> for Idents<'_> {
        fn visit_pat_ident(&mut self, p: &'ast syn::PatIdent) {
            self.0.push(p.ident.to_string());
            syn::visit::visit_pat_ident(self, p);
        }
    }
    Idents(out).visit_pat(pat);
}

/// Methods whose closures are handed the value itself (not an error or a default).
const PASSING: [&str; 9] = [
    "map",
    "and_then",
    "filter",
    "then",
    "inspect",
    "for_each",
    "is_some_and",
    "filter_map",
    "any",
];

/// The names bound to the value in `block`, from `seeds`, to a fixed point: `let` bindings
/// and `if let`/`match` patterns over it under one of the value's names (`values`), and the
/// parameters of the closures a value-passing method hands it to.
fn tainted(
    block: &syn::Block,
    seeds: &HashSet<String>,
    values: &HashSet<String>,
) -> HashSet<String> {
    struct Taint<'v> {
        values: &'v HashSet<String>,
        names: HashSet<String>,
        grew: bool,
    }
    impl Taint<'_> {
        /// Binds the pattern's names that are names of the value (`let caller = …`); a
        /// local under another name holds something made from it, not the value.
        fn bind_named(&mut self, pat: &syn::Pat) {
            let mut ids = Vec::new();
            pat_idents(pat, &mut ids);
            for id in ids {
                if self.values.contains(&id) && self.names.insert(id) {
                    self.grew = true;
                }
            }
        }
        /// Binds every name of a closure's parameter: the value handed to it.
        fn bind(&mut self, pat: &syn::Pat) {
            let mut ids = Vec::new();
            pat_idents(pat, &mut ids);
            for id in ids {
                if id != "_" && self.names.insert(id) {
                    self.grew = true;
                }
            }
        }
    }
    impl<'ast> Visit<'ast> for Taint<'_> {
        fn visit_local(&mut self, l: &'ast syn::Local) {
            if let Some(init) = &l.init
                && mentions(&init.expr, &self.names, self.values)
            {
                self.bind_named(&l.pat);
            }
            syn::visit::visit_local(self, l);
        }
        fn visit_expr_let(&mut self, l: &'ast syn::ExprLet) {
            if mentions(&l.expr, &self.names, self.values) {
                self.bind_named(&l.pat);
            }
            syn::visit::visit_expr_let(self, l);
        }
        fn visit_expr_match(&mut self, m: &'ast syn::ExprMatch) {
            if mentions(&m.expr, &self.names, self.values) {
                for arm in &m.arms {
                    self.bind_named(&arm.pat);
                }
            }
            syn::visit::visit_expr_match(self, m);
        }
        fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
            if PASSING.contains(&m.method.to_string().as_str())
                && mentions(&m.receiver, &self.names, self.values)
            {
                for arg in &m.args {
                    if let syn::Expr::Closure(c) = arg {
                        for input in &c.inputs {
                            self.bind(input);
                        }
                    }
                }
            }
            syn::visit::visit_expr_method_call(self, m);
        }
    }
    let mut t = Taint {
        values,
        names: seeds.clone(),
        grew: true,
    };
    while t.grew {
        t.grew = false;
        t.visit_block(block);
    }
    t.names
}

/// The calls in `block` that are handed the value.
fn calls(block: &syn::Block, names: &HashSet<String>, values: &HashSet<String>) -> Vec<Call> {
    struct Calls<'a> {
        names: &'a HashSet<String>,
        values: &'a HashSet<String>,
        out: Vec<Call>,
    }
    impl<'ast> Visit<'ast> for Calls<'_> {
        fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
            if let syn::Expr::Path(p) = &*c.func {
                let segs: Vec<String> = p
                    .path
                    .segments
                    .iter()
                    .map(|s| s.ident.to_string())
                    .collect();
                let tainted_args: Vec<usize> = c
                    .args
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| hands_on(a, self.names, self.values))
                    .map(|(i, _)| i)
                    .collect();
                if !tainted_args.is_empty() {
                    self.out.push(Call {
                        name: segs.last().cloned().unwrap_or_default(),
                        receiver_hint: None,
                        qualifier: segs.len().checked_sub(2).map(|i| segs[i].clone()),
                        method: false,
                        receiver_tainted: false,
                        tainted_args,
                        args: c.args.len(),
                    });
                }
            }
            syn::visit::visit_expr_call(self, c);
        }
        fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
            let receiver_tainted = hands_on(&m.receiver, self.names, self.values);
            let tainted_args: Vec<usize> = m
                .args
                .iter()
                .enumerate()
                .filter(|(_, a)| {
                    !matches!(a, syn::Expr::Closure(_)) && hands_on(a, self.names, self.values)
                })
                .map(|(i, _)| i)
                .collect();
            if receiver_tainted || !tainted_args.is_empty() {
                self.out.push(Call {
                    name: m.method.to_string(),
                    receiver_hint: last_name(&m.receiver),
                    qualifier: None,
                    method: true,
                    receiver_tainted,
                    tainted_args,
                    args: m.args.len(),
                });
            }
            syn::visit::visit_expr_method_call(self, m);
        }
    }
    let mut c = Calls {
        names,
        values,
        out: Vec::new(),
    };
    c.visit_block(block);
    c.out
}

/// Every call's name in `block` (handed the value or not), for the chain check.
fn all_call_names(block: &syn::Block) -> HashSet<String> {
    struct Names(HashSet<String>);
    impl<'ast> Visit<'ast> for Names {
        fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
            if let syn::Expr::Path(p) = &*c.func
                && let Some(last) = p.path.segments.last()
            {
                self.0.insert(last.ident.to_string());
            }
            syn::visit::visit_expr_call(self, c);
        }
        fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
            self.0.insert(m.method.to_string());
            syn::visit::visit_expr_method_call(self, m);
        }
        fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
            // A function handed on by name (`.map(Caller::from)`, `spawn(run(...))`).
            if let Some(last) = p.path.segments.last() {
                self.0.insert(last.ident.to_string());
            }
        }
    }
    let mut n = Names(HashSet::new());
    n.visit_block(block);
    n.0
}

/// Whether `call` is one the walk says it does not take.
fn not_taken(walk: &Walk, call: &Call) -> bool {
    walk.not_taken
        .iter()
        .any(|entry| match entry.rsplit_once("::") {
            Some((q, n)) => n == call.name && call.qualifier.as_deref() == Some(q),
            None => *entry == call.name,
        })
}

/// The last name of an expression: a field's name, a path's last segment, through calls,
/// references and `?`.
fn last_name(expr: &syn::Expr) -> Option<String> {
    match expr {
        syn::Expr::Field(f) => match &f.member {
            syn::Member::Named(i) => Some(i.to_string()),
            syn::Member::Unnamed(_) => None,
        },
        syn::Expr::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        syn::Expr::MethodCall(m) => last_name(&m.receiver),
        syn::Expr::Reference(r) => last_name(&r.expr),
        syn::Expr::Try(t) => last_name(&t.expr),
        syn::Expr::Paren(p) => last_name(&p.expr),
        _ => None,
    }
}

/// Whether `f` is where a receiver named `hint` lives: its file is named so
/// (`partition.rs`, `partition/mod.rs`) or its type is (`Partition`).
fn named_by(f: &FnDef, hint: &str) -> bool {
    let stem = f
        .file
        .trim_end_matches("/mod.rs")
        .trim_end_matches(".rs")
        .rsplit('/')
        .next()
        .unwrap_or_default();
    stem == hint
        || f.owner
            .as_deref()
            .is_some_and(|o| o.to_lowercase() == hint.replace('_', ""))
}

/// The project functions a call may land on.
fn candidates<'a>(index: &'a [FnDef], call: &Call, caller: &str) -> Vec<&'a FnDef> {
    if GENERIC.contains(&call.name.as_str()) {
        // `self.map(id)` is the caller's own `map`; `x.map(f)` is std's.
        if call.method && call.receiver_hint.as_deref() == Some("self") {
            return index
                .iter()
                .filter(|f| f.file == caller && f.name == call.name && f.has_self)
                .collect();
        }
        return Vec::new();
    }
    let found: Vec<&FnDef> = index
        .iter()
        .filter(|f| f.name == call.name)
        .filter(|f| {
            if call.method {
                f.has_self && f.params.len() == call.args
            } else {
                match &call.qualifier {
                    Some(q) if q.chars().next().is_some_and(char::is_uppercase) => {
                        f.owner.as_deref() == Some(q.as_str())
                    }
                    Some(q) => {
                        f.owner.is_none()
                            && (f.file.ends_with(&format!("/{q}.rs"))
                                || f.file.ends_with(&format!("/{q}/mod.rs")))
                    }
                    None => !f.has_self,
                }
            }
        })
        .collect();
    if let Some(hint) = &call.receiver_hint
        && found.iter().any(|f| named_by(f, hint))
    {
        // `sessions.partition.admit(..)` lands in `partition.rs`, not on every `admit`.
        return found.into_iter().filter(|f| named_by(f, hint)).collect();
    }
    if found.is_empty() && !call.method && call.qualifier.is_some() {
        // A re-export (`transport::verified_peer` is defined in `peer.rs`): any free function
        // of that name.
        return index
            .iter()
            .filter(|f| f.name == call.name && !f.has_self && f.params.len() == call.args)
            .collect();
    }
    found
}

fn crate_of(file: &str) -> &str {
    file.split('/').next().unwrap_or(file)
}

/// The walk as counted from the code: the problems found, and the functions visited.
fn check(walk: &Walk, index: &[FnDef]) -> Vec<String> {
    let mut problems = Vec::new();
    let listed: BTreeSet<&str> = walk
        .rows
        .iter()
        .flat_map(|r| r.files.iter().map(String::as_str))
        .chain(walk.also.iter().map(String::as_str))
        .collect();
    let seeds: HashSet<String> = walk.values.iter().cloned().collect();
    let mut row_fns: Vec<Vec<&FnDef>> = Vec::new();
    for (i, row) in walk.rows.iter().enumerate() {
        let mut found = Vec::new();
        for (owner, name) in &row.functions {
            let hits: Vec<&FnDef> = index
                .iter()
                .filter(|f| row.files.contains(&f.file) && &f.name == name)
                .filter(|f| owner.is_none() || f.owner == *owner)
                .collect();
            if hits.is_empty() {
                problems.push(format!(
                    "row {}: no function `{}{name}` in {:?}",
                    i + 1,
                    owner.as_ref().map(|o| format!("{o}::")).unwrap_or_default(),
                    row.files
                ));
            }
            found.extend(hits);
        }
        row_fns.push(found);
    }
    // Same-file reach of each row: the row's functions and the helpers in their files they
    // call, with the value's names bound in each.
    let mut reach: Vec<Vec<(&FnDef, HashSet<String>)>> = Vec::new();
    for fns in &row_fns {
        let mut seen: HashMap<(String, Option<String>, String), HashSet<String>> = HashMap::new();
        let mut todo: Vec<(&FnDef, HashSet<String>)> = fns
            .iter()
            .map(|f| {
                let mut names: HashSet<String> = f
                    .params
                    .iter()
                    .filter(|p| seeds.contains(*p))
                    .cloned()
                    .collect();
                if f.has_self {
                    names.insert("self".into());
                }
                (*f, names)
            })
            .collect();
        let mut out = Vec::new();
        while let Some((f, names)) = todo.pop() {
            let key = (f.file.clone(), f.owner.clone(), f.name.clone());
            let known = seen.entry(key).or_default();
            if !known.is_empty() && names.is_subset(known) {
                continue;
            }
            known.extend(names.iter().cloned());
            let names = tainted(&f.block, known, &seeds);
            for call in calls(&f.block, &names, &seeds) {
                if not_taken(walk, &call) {
                    continue;
                }
                for callee in candidates(index, &call, &f.file) {
                    if callee.file != f.file {
                        continue;
                    }
                    let mut next: HashSet<String> = call
                        .tainted_args
                        .iter()
                        .filter_map(|&i| callee.params.get(i).cloned())
                        .collect();
                    if call.receiver_tainted {
                        next.insert("self".into());
                    }
                    todo.push((callee, next));
                }
            }
            out.push((f, names));
        }
        reach.push(out);
    }
    // A branch not taken is a real function the walk's rows call.
    let called: HashSet<String> = reach
        .iter()
        .flatten()
        .flat_map(|(f, _)| all_call_names(&f.block))
        .collect();
    for entry in &walk.not_taken {
        let name = entry.rsplit("::").next().unwrap_or(entry);
        if !called.contains(name) {
            problems.push(format!("`{entry}` (not taken) is called by no row"));
        }
    }
    // Every call handed the value lands in a listed file.
    for (i, fns) in reach.iter().enumerate() {
        for (f, names) in fns {
            for call in calls(&f.block, names, &seeds) {
                if not_taken(walk, &call) {
                    continue;
                }
                let landing = candidates(index, &call, &f.file);
                if std::env::var_os("WALK_DEBUG").is_some() {
                    let files: BTreeSet<&str> = landing.iter().map(|c| c.file.as_str()).collect();
                    println!("  {} {}: {} -> {files:?}", f.file, f.name, call.name);
                }
                if landing.is_empty() || landing.iter().any(|c| listed.contains(c.file.as_str())) {
                    continue;
                }
                let files: BTreeSet<&str> = landing.iter().map(|c| c.file.as_str()).collect();
                problems.push(format!(
                    "row {} ({}): `{}` hands the value to `{}`, defined in {files:?}, which the walk does not list",
                    i + 1,
                    f.file,
                    f.name,
                    call.name
                ));
            }
        }
    }
    // Each row calls the next.
    for i in 1..walk.rows.len() {
        if walk.rows[i].called_by_library {
            continue;
        }
        let called: HashSet<String> = reach[..i]
            .iter()
            .flatten()
            .flat_map(|(f, _)| all_call_names(&f.block))
            .collect();
        if !walk.rows[i]
            .functions
            .iter()
            .any(|(_, n)| called.contains(n))
        {
            problems.push(format!(
                "row {} names {:?}, which no row before it calls",
                i + 1,
                walk.rows[i].functions,
            ));
        }
    }
    // The count line.
    let crates: BTreeSet<&str> = listed.iter().map(|f| crate_of(f)).collect();
    let counted = (listed.len(), crates.len(), crossings(walk));
    if walk.count != Some(counted) {
        problems.push(format!(
            "the count line says {:?} (files, crates, crossings); the table gives {counted:?}",
            walk.count
        ));
    }
    println!(
        "{}: {} files in {} crates, {} crossings",
        walk.title, counted.0, counted.1, counted.2
    );
    for f in &listed {
        println!("  {f}");
    }
    problems
}

/// Calls into another crate: a row in another crate than the one before it, unless it goes
/// back to the crate that called into the one before (a return).
fn crossings(walk: &Walk) -> usize {
    let mut stack: Vec<&str> = Vec::new();
    let mut count = 0;
    for row in &walk.rows {
        let Some(krate) = row.files.first().map(|f| crate_of(f)) else {
            continue;
        };
        match stack.last() {
            None => stack.push(krate),
            Some(top) if *top == krate => {}
            Some(_) if stack.len() >= 2 && stack[stack.len() - 2] == krate => {
                stack.pop();
            }
            Some(_) => {
                count += 1;
                stack.push(krate);
            }
        }
    }
    count
}

#[test]
fn the_walks_in_the_architecture_doc_are_the_walks_in_the_code() {
    let doc = std::fs::read_to_string(workspace().join("docs/architecture.md")).expect("doc");
    let walks = parse_walks(&doc);
    assert!(walks.len() >= 2, "docs/architecture.md has counted walks");
    let index = index();
    let mut problems = Vec::new();
    for walk in &walks {
        for p in check(walk, &index) {
            problems.push(format!("{}: {p}", walk.title));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_gate_left_off_the_table_is_found() {
    let src = r#"
        fn entry(request: Req) -> Id {
            let caller = identify(&request);
            blocked(&caller);
            let unrelated = 5;
            log(unrelated);
            caller
        }
        fn identify(req: &Req) -> Id { id_of(req) }
    "#;
    let file: syn::File = syn::parse_str(src).expect("parse");
    let mut index = Vec::new();
    collect_items("principal/src/auth.rs", &file.items, &mut index);
    let gate: syn::File = syn::parse_str("fn blocked(c: &Id) -> bool { true }").unwrap();
    collect_items("principal/src/blocklist.rs", &gate.items, &mut index);
    let log: syn::File = syn::parse_str("fn log(n: u32) {}").unwrap();
    collect_items("principal/src/metrics.rs", &log.items, &mut index);
    let walk = |also: Vec<String>, count| Walk {
        title: "test".into(),
        rows: vec![Row {
            files: vec!["principal/src/auth.rs".into()],
            functions: vec![(None, "entry".into())],
            called_by_library: true,
        }],
        values: vec!["request".into(), "caller".into()],
        also,
        not_taken: vec![],
        count: Some(count),
    };
    let problems = check(&walk(vec![], (1, 1, 0)), &index);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("`blocked`"), "{problems:?}");
    // Listed, it passes; metrics.rs is never handed the value.
    let problems = check(
        &walk(vec!["principal/src/blocklist.rs".into()], (2, 1, 0)),
        &index,
    );
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn a_return_is_no_crossing() {
    let row = |f: &str| Row {
        files: vec![f.into()],
        functions: vec![],
        called_by_library: false,
    };
    let walk = Walk {
        rows: vec![
            row("identity/src/tls.rs"),
            row("principal/src/server.rs"),
            row("domain/src/mapping/set.rs"),
            row("principal/src/auth.rs"),
            row("domain/src/authz.rs"),
        ],
        ..Walk::default()
    };
    // identity -> principal, principal -> domain (back: a return), principal -> domain.
    assert_eq!(crossings(&walk), 3);
}
