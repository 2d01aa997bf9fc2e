//! One crate accepts connections: no crate of the shipped binaries but `listener` calls
//! `TcpListener::accept` or `UnixListener::accept` (`.accept()`, no arguments: a TLS
//! acceptor's or a WebSocket's `accept(stream)` takes one) outside its `#[cfg(test)]` items.
//! Every endpoint is served through the listener crate's bounded accept loops (caps per
//! listener and per client address, handshake and preface timeouts, connection tasks on a
//! `TaskTracker`; docs/reliability.md, "Every listener"), so an accept loop of its own would
//! be a listener without those bounds. The test kit, the load generator and the developer
//! tools (servers for tests only) are not checked.
//!
//! Run: `cargo nextest run -p argocd-agent-e2e --test accepts` (no binaries, no servers).

use std::path::Path;

#[path = "support/rust_files.rs"]
mod rust_files;
use rust_files::rust_files;
#[path = "support/non_test.rs"]
mod non_test;
use non_test::non_test_lines;

/// The crates of the shipped binaries (`cargo tree -e normal -p argocd-agent-cli`), but the
/// listener crate.
const CHECKED: [&str; 10] = [
    "proto",
    "domain",
    "redis",
    "identity",
    "mesh",
    "kubernetes",
    "runtime",
    "principal",
    "agent",
    "cli",
];

/// Where `text` calls `.accept()` outside its tests: `(line number, line)`.
fn accepts(text: &str) -> Vec<(usize, String)> {
    non_test_lines(text)
        .into_iter()
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or_default();
            code.contains(".accept()")
        })
        .map(|(n, line)| (n, line.trim().to_string()))
        .collect()
}

#[test]
fn only_the_listener_crate_accepts_connections() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let mut found = Vec::new();
    for krate in CHECKED {
        let mut files = Vec::new();
        rust_files(&workspace.join(krate).join("src"), &mut files);
        assert!(!files.is_empty(), "{krate}: no sources found");
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read source");
            let rel = file.strip_prefix(workspace).expect("under workspace");
            for (n, line) in accepts(&text) {
                found.push(format!("{}:{n}: {line}", rel.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "accept loops outside the listener crate (serve through argocd_agent_listener: \
         `serve`, `Bounded`, `plain_incoming`):\n{}",
        found.join("\n")
    );
    // The check finds what it looks for: the listener crate's own accept loops.
    let mut listener = Vec::new();
    rust_files(&workspace.join("listener").join("src"), &mut listener);
    let own: usize = listener
        .iter()
        .map(|f| accepts(&std::fs::read_to_string(f).expect("read source")).len())
        .sum();
    assert!(own >= 2, "the listener crate's accept loops were not found");
}

#[test]
fn accepts_in_tests_and_with_arguments_are_not_counted() {
    let text = "\
fn serve(l: TcpListener) {
    let (s, _) = l.accept().await?;
    let tls = acceptor.accept(s).await?;
}

#[cfg(test)]
mod tests {
    fn t() {
        let _ = listener.accept().await;
    }
}
";
    let found = accepts(text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, 2);
}
