//! Typed errors: no `Result<_, String>` in the non-test code of any crate of the workspace
//! (the test kit aside). An error is a `thiserror` enum (or the caller's own error type)
//! that says what went wrong and carries its cause once; a `String` error can be neither
//! matched on nor followed to its cause. A `Result` whose error type is `String` is found
//! by its generic arguments (`Result<Vec<String>, Error>` is no match), outside
//! `#[cfg(test)]` items.
//!
//! Run: `cargo nextest run -p argocd-agent-e2e --test errors` (no binaries, no servers).

use std::path::Path;

#[path = "support/rust_files.rs"]
mod rust_files;
use rust_files::rust_files;
#[path = "support/non_test.rs"]
mod non_test;
use non_test::non_test_lines;

/// The crates checked: every member of the workspace but the test kit.
const CHECKED: [&str; 14] = [
    "proto",
    "domain",
    "redis",
    "identity",
    "listener",
    "mesh",
    "kubernetes",
    "runtime",
    "principal",
    "agent",
    "cli",
    "load",
    "devtools",
    "e2e/src",
];

/// The error type of each `Result<T, E>` in `line` whose `E` is `String`, counted.
fn string_errors(line: &str) -> usize {
    let code = line.split("//").next().unwrap_or_default();
    let mut count = 0;
    let mut rest = code;
    while let Some(at) = rest.find("Result<") {
        let args = &rest[at + "Result<".len()..];
        let (mut depth, mut comma, mut end) = (0i32, None, None);
        for (i, c) in args.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => comma = Some(i),
                _ => {}
            }
        }
        if let (Some(c), Some(e)) = (comma, end)
            && args[c + 1..e].trim() == "String"
        {
            count += 1;
        }
        rest = args;
    }
    count
}

/// `String` errors in the non-test lines of `text`.
fn count(text: &str) -> usize {
    non_test_lines(text)
        .into_iter()
        .map(|(_, line)| string_errors(line))
        .sum()
}

#[test]
fn no_string_errors_outside_tests() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let mut problems = Vec::new();
    for dir in CHECKED {
        let root = if dir.contains('/') {
            workspace.join(dir)
        } else {
            workspace.join(dir).join("src")
        };
        if !root.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        for file in files {
            let rel = file
                .strip_prefix(workspace)
                .expect("under workspace")
                .to_string_lossy()
                .replace('\\', "/");
            if rel.ends_with("/tests.rs") || rel.contains("/tests/") {
                continue;
            }
            let n = count(&std::fs::read_to_string(&file).expect("read source"));
            if n > 0 {
                problems.push(format!(
                    "{rel}: {n} `Result<_, String>`: use a typed error (thiserror)"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_rule_finds_string_errors_by_their_generic_arguments() {
    assert_eq!(string_errors("fn f() -> Result<(), String> {"), 1);
    assert_eq!(string_errors("fn f() -> Result<Vec<String>, String> {"), 1);
    assert_eq!(
        string_errors("fn f() -> Result<Option<BTreeMap<String, String>>, Error> {"),
        0
    );
    assert_eq!(string_errors("fn f() -> Result<String, Error> {"), 0);
    assert_eq!(string_errors("// fn f() -> Result<(), String>"), 0);
    assert_eq!(
        string_errors("F: Fn() -> Result<Result<T, kube::Error>, String>,"),
        1
    );
    // Test modules do not count, wherever they stand; what follows them does.
    let text = "#[cfg(test)]\nmod tests {\n    fn a() -> Result<(), String> { Ok(()) }\n}\nfn b() -> Result<(), String> { Ok(()) }\n";
    assert_eq!(count(text), 1);
}
