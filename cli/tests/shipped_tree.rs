//! The shipped binaries contain no test code: the normal (non-dev, non-build) dependency tree
//! of the CLI package in its default build names none of the test kit, the load generator,
//! the developer tool, the Kubernetes API test server or the end-to-end package, and the mesh
//! crate without its test helpers.

use std::process::Command;

/// Packages that exist only for tests, the demo and benchmarks.
const TEST_ONLY: [&str; 5] = [
    "argocd-agent-testkit",
    "argocd-agent-load",
    "argocd-agent-devtools",
    "argocd-agent-kube-test-server",
    "argocd-agent-e2e",
];

fn cargo_tree(extra: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--locked", "-e", "normal", "-p", "argocd-agent-cli"])
        .args(["--prefix", "none"])
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn the_cli_default_build_links_no_test_package() {
    let tree = cargo_tree(&[]);
    assert!(tree.contains("argocd-agent-principal"), "{tree}");
    for line in tree.lines() {
        let package = line.split_whitespace().next().unwrap_or_default();
        assert!(
            !TEST_ONLY.contains(&package),
            "the shipped CLI depends on {package}:\n{tree}"
        );
    }
}

#[test]
fn the_cli_default_build_enables_no_test_feature() {
    let tree = cargo_tree(&["-e", "features"]);
    for unwanted in [
        "\"test-util\"",
        "\"devserver\"",
        "\"dev-tools\"",
        "\"memory\"",
    ] {
        assert!(
            !tree
                .lines()
                .any(|l| l.contains(unwanted) && l.contains("argocd-agent")),
            "a test feature ({unwanted}) is on in the shipped CLI:\n{tree}"
        );
    }
}
