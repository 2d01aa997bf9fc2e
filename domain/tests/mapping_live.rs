//! Live reload of the rules file and revocation of sessions whose identity stops mapping.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_domain::mapping::{
    AgentIdentity, DenyReason, LiveRules, MappingDenied, RuleError, RuleSet,
};
use argocd_agent_identity::SpiffeId;

const POLL: Duration = Duration::from_millis(10);
const WAIT: Duration = Duration::from_secs(5);

/// A directory removed on drop. (The crate's committed dev-dependencies do not include
/// `tempfile`; this is all these tests need.)
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "identity-mapping-live-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

fn agent_of(rules: &RuleSet, s: &str) -> Option<String> {
    rules.map(&id(s)).ok().map(|a| a.agent.to_string())
}

fn exact(agent: &str) -> String {
    format!("rules:\n  - exact: spiffe://example.org/a\n    agent: {agent}\n")
}

/// Writes `text` to `path` atomically (write + rename), as an editor or a deploy tool would.
fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn file_change_is_applied_and_flag_rules_follow_file_rules() {
    let dir = TempDir::new();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, exact("one")).unwrap();
    let live = LiveRules::start(
        Some(path.clone()),
        vec!["exact:spiffe://example.org/b=>from-flag".into()],
        POLL,
    )
    .unwrap();
    let mut rx = live.subscribe();
    assert_eq!(
        agent_of(&live.current(), "spiffe://example.org/a").as_deref(),
        Some("one")
    );

    write_atomic(&path, &exact("two"));
    tokio::time::timeout(WAIT, rx.changed())
        .await
        .unwrap()
        .unwrap();
    let now = live.current();
    assert_eq!(
        agent_of(&now, "spiffe://example.org/a").as_deref(),
        Some("two")
    );
    // Flag rules survive the reload, after the file rules.
    assert_eq!(
        agent_of(&now, "spiffe://example.org/b").as_deref(),
        Some("from-flag")
    );
}

#[tokio::test]
async fn invalid_new_file_keeps_last_good_rules() {
    let dir = TempDir::new();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, exact("one")).unwrap();
    let live = LiveRules::start(Some(path.clone()), vec![], POLL).unwrap();
    let mut rx = live.subscribe();

    write_atomic(
        &path,
        "rules:\n  - exact: spiffe://example.org/a\n    agent: Not_Valid\n",
    );
    // Several polls pass; nothing is published and the old rules stay.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), rx.changed())
            .await
            .is_err()
    );
    assert_eq!(
        agent_of(&live.current(), "spiffe://example.org/a").as_deref(),
        Some("one")
    );

    // A deleted file also keeps the last good rules.
    std::fs::remove_file(&path).unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(100), rx.changed())
            .await
            .is_err()
    );
    assert_eq!(
        agent_of(&live.current(), "spiffe://example.org/a").as_deref(),
        Some("one")
    );

    // A later valid file is applied.
    write_atomic(&path, &exact("three"));
    tokio::time::timeout(WAIT, rx.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        agent_of(&live.current(), "spiffe://example.org/a").as_deref(),
        Some("three")
    );
}

#[cfg(unix)]
#[tokio::test]
async fn configmap_style_symlink_swap_is_noticed() {
    // Kubernetes mounts a ConfigMap as <dir>/rules.yaml -> ..data/rules.yaml with
    // ..data -> ..<timestamp>; an update swaps the ..data link to a new directory.
    let dir = TempDir::new();
    let root = dir.path();
    std::fs::create_dir(root.join("..v1")).unwrap();
    std::fs::write(root.join("..v1/rules.yaml"), exact("one")).unwrap();
    std::os::unix::fs::symlink("..v1", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/rules.yaml", root.join("rules.yaml")).unwrap();

    let live = LiveRules::start(Some(root.join("rules.yaml")), vec![], POLL).unwrap();
    let mut rx = live.subscribe();
    assert_eq!(
        agent_of(&live.current(), "spiffe://example.org/a").as_deref(),
        Some("one")
    );

    std::fs::create_dir(root.join("..v2")).unwrap();
    std::fs::write(root.join("..v2/rules.yaml"), exact("two")).unwrap();
    std::os::unix::fs::symlink("..v2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();

    tokio::time::timeout(WAIT, rx.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        agent_of(&live.current(), "spiffe://example.org/a").as_deref(),
        Some("two")
    );
}

#[tokio::test]
async fn start_fails_on_invalid_initial_file_or_flag() {
    let dir = TempDir::new();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, "rules: [").unwrap();
    let err = LiveRules::start(Some(path.clone()), vec![], POLL).unwrap_err();
    assert!(matches!(err, RuleError::File { .. }), "{err}");
    assert!(err.to_string().contains("rules.yaml"), "{err}");

    let missing = dir.path().join("missing.yaml");
    let err = LiveRules::start(Some(missing), vec![], POLL).unwrap_err();
    assert!(matches!(err, RuleError::Read { .. }), "{err}");

    let err = LiveRules::start(None, vec!["bogus".into()], POLL).unwrap_err();
    assert!(matches!(err, RuleError::Flag { .. }), "{err}");
}

#[test]
fn start_outside_a_runtime_is_an_error_not_a_panic() {
    let err = LiveRules::start(None, vec![], POLL).unwrap_err();
    assert!(matches!(err, RuleError::NoRuntime), "{err}");
}

#[tokio::test]
async fn flag_only_rules_are_static() {
    let live = LiveRules::start(
        None,
        vec!["mtls:uri:spiffe://td/agent/([a-z]+)".into()],
        POLL,
    )
    .unwrap();
    assert_eq!(
        agent_of(&live.current(), "spiffe://td/agent/abc").as_deref(),
        Some("abc")
    );
}

type Revoked = Arc<Mutex<Vec<(String, MappingDenied)>>>;

#[tokio::test]
async fn sessions_that_stop_mapping_are_revoked_and_others_are_not() {
    let dir = TempDir::new();
    let path = dir.path().join("rules.yaml");
    let v1 = r#"
rules:
  - exact: spiffe://example.org/gone
    agent: gone
  - exact: spiffe://example.org/moved
    agent: moved
  - exact: spiffe://example.org/stays
    agent: stays
  - exact: spiffe://example.org/narrowed
    agent: narrowed
    mode: both
"#;
    let v2 = r#"
rules:
  - exact: spiffe://example.org/moved
    agent: moved
    namespace: elsewhere
  - exact: spiffe://example.org/stays
    agent: stays
    name: renamed-but-same
  - exact: spiffe://example.org/narrowed
    agent: narrowed
    mode: managed
"#;
    std::fs::write(&path, v1).unwrap();
    let live = LiveRules::start(Some(path.clone()), vec![], POLL).unwrap();
    let first = live.current();
    let sessions: Vec<AgentIdentity> = ["gone", "moved", "stays", "narrowed"]
        .iter()
        .map(|a| {
            first
                .map(&id(&format!("spiffe://example.org/{a}")))
                .unwrap()
        })
        .collect();

    let revoked: Revoked = Arc::default();
    let sink = revoked.clone();
    live.on_revoked(
        Arc::new(move || sessions.clone()),
        Arc::new(move |who: AgentIdentity, why: MappingDenied| {
            sink.lock().unwrap().push((who.agent.to_string(), why));
        }),
    );
    let mut rx = live.subscribe();
    write_atomic(&path, v2);
    tokio::time::timeout(WAIT, rx.changed())
        .await
        .unwrap()
        .unwrap();

    // The watcher runs on its own task: wait until it has reported.
    let deadline = tokio::time::Instant::now() + WAIT;
    while revoked.lock().unwrap().len() < 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Give a stray fourth report the chance to show up before asserting on the set.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut got = revoked.lock().unwrap().clone();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    let names: Vec<&str> = got.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(names, ["gone", "moved", "narrowed"]);
    assert!(matches!(got[0].1.reason, DenyReason::NoRuleMatched { .. }));
    assert!(matches!(got[1].1.reason, DenyReason::Remapped { .. }));
    assert!(matches!(got[2].1.reason, DenyReason::ModesNarrowed { .. }));
    let msg = got[1].1.to_string();
    assert!(
        msg.contains("spiffe://example.org/moved") && msg.contains("elsewhere"),
        "{msg}"
    );
}

#[test]
fn recheck_accepts_an_unchanged_mapping() {
    let rules = RuleSet::from_flags(&["exact:spiffe://td/a=>a".to_string()]).unwrap();
    let session = rules.map(&id("spiffe://td/a")).unwrap();
    assert!(rules.recheck(&session).is_ok());
    let wider = RuleSet::from_flags(&["exact:spiffe://td/a=>a,mode=both".to_string()]).unwrap();
    assert!(wider.recheck(&session).is_ok());
}
