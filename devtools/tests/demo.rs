//! The README's first command (`argocd-agent-dev demo`) works: the topology starts and the
//! sample Applications flow both ways, the hub's project `team-a` and its repository
//! `team-a-repo` reach the managed spoke, and the autonomous spoke's project `edge` shows up
//! on the hub as `agent-autonomous-edge`, and the Redis proxy serves a spoke's resource tree
//! only to a client with the hub Redis's password, and a hard refresh on the hub makes the
//! round trip (carried out by the managed spoke's Argo CD stand-in, then cleared on the hub);
//! the managed spoke's guard refuses a hub Application from a foreign repository, and
//! team-b's operator is refused team-a's agent.

#[test]
fn demo_check_passes() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_argocd-agent-dev"))
        .args(["demo", "--check", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo --check failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("demo check passed"));
    // .ci/run installs redis-server: the Redis proxy is part of the demo, behind a password.
    assert!(
        stdout.contains(
            "the Redis proxy serves the spoke's resource tree only with the hub Redis's password"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("edge-guestbook"));
    // Two tenants and a guarded managed spoke: one refusal of each, as the table shows them.
    assert!(
        stdout.contains("guard (managed spoke): hub Application agent-managed/intruder")
            && stdout.contains("refused by the spoke guard (rule source-repos)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("agent \"agent-managed\" is outside the caller's scope (tenant team-b)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("refresh round trip: hub hard refresh -> managed spoke reconciled -> request cleared on the hub"),
        "{stdout}"
    );
    for line in [
        "projects on spoke agent-managed (argocd): default, team-a",
        "repositories on spoke agent-managed (argocd): team-a-repo",
        "projects on hub (argocd): agent-autonomous-edge, default, team-a",
        "repositories on spoke agent-autonomous (argocd): -",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
}
