//! Common mistakes and what the binaries say about them: each message names what is wrong
//! (the path, the tenant and field, the flag that sets it), prints each cause once, and
//! never shows a Rust Debug form. Each case runs the real binary as a user would.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

fn bin(name: &str) -> PathBuf {
    argocd_agent_testkit::harness::binary(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Runs `program args` (killed after `limit`) and returns what it printed, both streams.
async fn run(program: &str, args: &[&str], limit: Duration) -> String {
    let child = tokio::process::Command::new(bin(program))
        .args(args)
        .env_remove("SPIFFE_ENDPOINT_SOCKET")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} still running after {limit:?}"))
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `argocd-agent principal` with `rules` as its rules file and a Workload API socket that
/// does not exist (the rules are read first).
async fn principal_with_rules(rules: &str) -> String {
    run(
        "argocd-agent",
        &[
            "principal",
            "--identity-rules",
            rules,
            "--spiffe-endpoint-socket",
            "unix:///nonexistent/agent.sock",
        ],
        Duration::from_secs(20),
    )
    .await
}

/// The `error:` line, checked for what every message must be.
fn error_line(output: &str) -> String {
    let errors: Vec<&str> = output.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line expected:\n{output}");
    let line = errors[0];
    for debug in [
        "Some(",
        "None)",
        "SystemTime {",
        "tv_sec",
        "Other(",
        "Error {",
        "Os {",
    ] {
        assert!(
            !line.contains(debug),
            "Debug formatting ({debug}) in: {line}"
        );
    }
    // A cause printed twice shows as the same text on both sides of a ": ".
    let parts: Vec<&str> = line.split(": ").collect();
    for pair in parts.windows(2) {
        assert_ne!(pair[0], pair[1], "a cause printed twice in: {line}");
    }
    let tail = parts.last().copied().unwrap_or_default();
    assert_eq!(
        line.matches(tail).count(),
        1,
        "a cause printed twice in: {line}"
    );
    line.to_owned()
}

fn dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("argocd-agent-mistakes")
        .tempdir()
        .unwrap()
}

#[tokio::test]
async fn a_rules_file_that_does_not_exist_is_named_with_its_cause_once() {
    let out = principal_with_rules("/nonexistent/rules.yaml").await;
    let line = error_line(&out);
    assert!(
        line.contains("mapping rules file /nonexistent/rules.yaml: No such file or directory"),
        "{line}"
    );
}

#[tokio::test]
async fn overlapping_tenants_name_the_tenant_the_field_and_the_other_tenant() {
    let dir = dir();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "rules: []\ntenants:\n  - name: team-a\n    agents: [\"spiffe://example.org/ns/a/sa/{sa}\"]\n    namespaces: [\"team-*\"]\n  - name: team-b\n    agents: [\"spiffe://example.org/ns/b/sa/{sa}\"]\n    namespaces: [\"*-dev\"]\n",
    )
    .unwrap();
    let out = principal_with_rules(rules.to_str().unwrap()).await;
    let line = error_line(&out);
    assert!(
        line.contains("tenant \"team-b\" field namespaces[1]: *-dev can match what tenant \"team-a\" claims with namespaces[1] team-*"),
        "{line}"
    );
}

#[tokio::test]
async fn a_missing_workload_api_socket_is_named_with_the_flag_that_sets_it() {
    let out = run(
        "argocd-agent",
        &[
            "agent",
            "--server-address",
            "127.0.0.1",
            "--principal-spiffe-id",
            "spiffe://example.org/ns/argocd/sa/principal",
            "--spiffe-endpoint-socket",
            "unix:///nonexistent/agent.sock",
        ],
        Duration::from_secs(40),
    )
    .await;
    let line = error_line(&out);
    assert!(
        line.contains("the Workload API socket /nonexistent/agent.sock does not exist"),
        "{line}"
    );
    assert!(
        line.contains("--spiffe-endpoint-socket or SPIFFE_ENDPOINT_SOCKET"),
        "{line}"
    );
    // The same is said at once (not only after the wait), in the log.
    let first_warning = out
        .lines()
        .find(|l| l.contains("cannot connect to the Workload API"))
        .unwrap_or_else(|| panic!("no warning while waiting:\n{out}"));
    assert!(first_warning.contains("does not exist"), "{first_warning}");
}

#[tokio::test]
async fn an_invalid_spiffe_id_says_which_rule_it_breaks() {
    let out = run(
        "argocd-agentctl",
        &["identity", "explain", "spiffe://Example.org/x"],
        Duration::from_secs(20),
    )
    .await;
    let line = error_line(&out);
    assert_eq!(
        line,
        "error: invalid SPIFFE ID \"spiffe://Example.org/x\": trust domain must be lowercase"
    );
}

#[tokio::test]
async fn upstreams_spire_switch_that_contradicts_auth_says_to_keep_one() {
    let out = run(
        "argocd-agent",
        &[
            "principal",
            "--spire-auth-method",
            "jwt",
            "--auth",
            "header:istio",
        ],
        Duration::from_secs(20),
    )
    .await;
    let line = error_line(&out);
    assert!(
        line.ends_with(
            "--spire-auth-method jwt means --auth jwt-svid, but --auth header:istio is given: keep one of them"
        ),
        "{line}"
    );
}

#[tokio::test]
async fn a_boolean_with_a_wrong_value_lists_the_values_it_takes() {
    let out = run(
        "argocd-agent",
        &["principal", "--ha=maybe"],
        Duration::from_secs(20),
    )
    .await;
    let line = error_line(&out);
    assert_eq!(line, "error: invalid value 'maybe' for '--ha[=<HA>]'");
    assert!(out.contains("[possible values: true, false]"), "{out}");
}
