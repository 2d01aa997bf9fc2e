//! What the principal remembers of one agent across its sessions, behind the agent's one
//! lock: its identity and session, what was sent to it, what it sent. Every write to that
//! state is a method here, named for what it records or forgets; the modules that decide
//! (`apps/`, `config_objects`, `rounds`, `hub/admit`, `sessions`) call them on the guard
//! [`crate::sessions::AgentState`] hands out, so several calls on one guard stay atomic.
//! A leaf: it imports nothing of the crate.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use argocd_agent_domain::{AgentIdentity, AgentMode, Namespace, ResourceKind};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// One configuration object of an agent: kind and name (its name on the spoke).
pub type ConfigKey = (ResourceKind, String);

/// What is known about an agent's current (or last) session, for the operator API.
#[derive(Debug, Clone, Default)]
pub struct SessionInfo {
    /// When the session was accepted (after its hello); `None` before the first one.
    pub connected_since: Option<std::time::SystemTime>,
    /// The peer address (the sidecar's or the ingress's when one sits in front).
    pub remote_addr: Option<std::net::SocketAddr>,
    /// The agent's version, from its hello.
    pub agent_version: String,
    /// notAfter of the client certificate, when the session is mutual TLS.
    pub svid_expiry: Option<std::time::SystemTime>,
    /// SHA-256 of the client certificate, when the session is mutual TLS (blocklist).
    pub fingerprint: Option<String>,
    /// How long the session's TLS handshake took, when the principal terminated it: the
    /// first round trip with the agent, which the agent's send queue starts from.
    pub handshake: Option<std::time::Duration>,
}

/// Mutable state of one agent, behind one lock. Fields are private: the methods below are
/// its only writers.
pub(crate) struct AgentInner {
    identity: AgentIdentity,
    mode: AgentMode,
    /// The current session: its id and the token that closes it.
    session: Option<(u64, CancellationToken)>,
    /// Autonomous (and a managed agent's spoke-authored children): the last object the
    /// agent sent, by name (what hub edits are reverted to).
    desired: HashMap<String, Arc<Value>>,
    /// Managed: spec checksum last sent, by name (so hub status writes are not echoed back).
    sent_spec: HashMap<String, String>,
    /// Operations already forwarded, by name -> checksum of `.operation`.
    sent_operation: HashMap<String, String>,
    /// Names whose terminate request (phase `Terminating` on the hub) was forwarded.
    sent_terminate: HashSet<String>,
    /// Autonomous: refresh requests of hub copies forwarded, by name -> value.
    sent_refresh: HashMap<String, String>,
    /// Autonomous: names whose forwarded refresh request the agent acknowledged: the next
    /// object from the spoke without it ends the request on the hub copy.
    refresh_delivered: HashSet<String>,
    /// Managed: configuration objects last sent (kind, name) -> content checksum.
    sent_config: HashMap<ConfigKey, String>,
    /// Autonomous: the agent's projects as it sent them, by their name on the spoke.
    desired_projects: HashMap<String, Arc<Value>>,
    /// What the operator API shows about the current (or last) session.
    session_info: SessionInfo,
    /// Why the principal closed the current session, told to the agent.
    close_reason: Option<String>,
    /// When the agent's last resync round ran (at connect or asked for), for
    /// `--resync-min-interval`.
    last_resync: Option<Instant>,
}

/// What [`AgentInner::begin_session`] replaced.
pub(crate) struct Replaced {
    /// The hub namespace the agent had, when the rules now map it to another one.
    pub(crate) moved_from: Option<Namespace>,
    /// The previous session, still open: its token is to be cancelled.
    pub(crate) session: Option<(u64, CancellationToken)>,
}

impl AgentInner {
    /// The state of an agent seen for the first time, no session yet.
    pub(crate) fn new(identity: AgentIdentity, mode: AgentMode) -> AgentInner {
        AgentInner {
            identity,
            mode,
            session: None,
            desired: HashMap::new(),
            sent_spec: HashMap::new(),
            sent_operation: HashMap::new(),
            sent_terminate: HashSet::new(),
            sent_refresh: HashMap::new(),
            refresh_delivered: HashSet::new(),
            sent_config: HashMap::new(),
            desired_projects: HashMap::new(),
            session_info: SessionInfo::default(),
            close_reason: None,
            last_resync: None,
        }
    }

    // --- identity and session (written by `sessions.rs`) ---

    /// The identity of the latest session.
    pub(crate) fn identity(&self) -> &AgentIdentity {
        &self.identity
    }

    /// The mode of the latest session.
    pub(crate) fn mode(&self) -> AgentMode {
        self.mode
    }

    /// Whether a session is open.
    pub(crate) fn is_connected(&self) -> bool {
        self.session.is_some()
    }

    /// Session `session_id` (with `token`) becomes the current one, with the identity and
    /// mode of its hello. A changed mode forgets what either side sent (the source of truth
    /// changed sides).
    pub(crate) fn begin_session(
        &mut self,
        identity: AgentIdentity,
        mode: AgentMode,
        session_id: u64,
        token: CancellationToken,
    ) -> Replaced {
        if self.mode != mode {
            self.desired.clear();
            self.sent_spec.clear();
            self.sent_config.clear();
            self.desired_projects.clear();
        }
        self.mode = mode;
        let moved_from = (self.identity.namespace != identity.namespace)
            .then(|| self.identity.namespace.clone());
        self.identity = identity;
        Replaced {
            moved_from,
            session: self.session.replace((session_id, token)),
        }
    }

    /// Forgets session `session_id` if it is still the current one.
    pub(crate) fn end_session(&mut self, session_id: u64) {
        if self.is_current(session_id) {
            self.session = None;
        }
    }

    /// Closes the current session, remembering `reason` for the agent; returns the token
    /// to cancel, `None` when no session was open.
    pub(crate) fn close_session(&mut self, reason: Option<String>) -> Option<CancellationToken> {
        let (_, token) = self.session.take()?;
        self.close_reason = reason;
        Some(token)
    }

    /// Why the principal closed the session, if it said (taken once).
    pub(crate) fn take_close_reason(&mut self) -> Option<String> {
        self.close_reason.take()
    }

    /// Records what the operator API shows about session `session_id`, if it is current.
    pub(crate) fn set_session_info(&mut self, session_id: u64, info: SessionInfo) {
        if self.is_current(session_id) {
            self.session_info = info;
        }
    }

    /// What is known about the current (or last) session.
    pub(crate) fn session_info(&self) -> &SessionInfo {
        &self.session_info
    }

    fn is_current(&self, session_id: u64) -> bool {
        self.session.as_ref().map(|(id, _)| *id) == Some(session_id)
    }

    // --- resync rounds (`rounds.rs`) ---

    /// Admits a requested resync round at `now` unless the last round is less than
    /// `on_time` ago (`Err`: how long to wait); an admitted round is recorded.
    pub(crate) fn admit_resync(&mut self, now: Instant, on_time: Duration) -> Result<(), Duration> {
        if let Some(last) = self.last_resync {
            let since = now.saturating_duration_since(last);
            if since < on_time {
                return Err(on_time - since);
            }
        }
        self.note_resync(now);
        Ok(())
    }

    /// Records a resync round that ran at `now`.
    pub(crate) fn note_resync(&mut self, now: Instant) {
        self.last_resync = Some(now);
    }

    // --- Applications the agent sent (autonomous, spoke-authored children) ---

    /// The Application `name` as the agent last sent it.
    pub(crate) fn desired_app(&self, name: &str) -> Option<Arc<Value>> {
        self.desired.get(name).cloned()
    }

    /// Records the agent's Application `name` (before its hub write, so the write is not
    /// taken for a hub edit); returns what it replaces, for [`Self::restore_desired_app`].
    pub(crate) fn record_desired_app(&mut self, name: &str, obj: Arc<Value>) -> Option<Arc<Value>> {
        self.desired.insert(name.to_owned(), obj)
    }

    /// Records the agent's form of Application `name` unless one is known already.
    pub(crate) fn adopt_desired_app(&mut self, name: &str, obj: impl FnOnce() -> Arc<Value>) {
        self.desired.entry(name.to_owned()).or_insert_with(obj);
    }

    /// Puts back what [`Self::record_desired_app`] replaced (its hub write failed).
    pub(crate) fn restore_desired_app(&mut self, name: &str, previous: Option<Arc<Value>>) {
        match previous {
            Some(p) => self.desired.insert(name.to_owned(), p),
            None => self.desired.remove(name),
        };
    }

    /// Forgets the agent's Application `name` (hub edits of it are no longer reverted).
    pub(crate) fn forget_desired_app(&mut self, name: &str) {
        self.desired.remove(name);
    }

    /// Keeps only the agent's Applications `keep` says it still holds.
    pub(crate) fn retain_desired_apps(&mut self, keep: impl Fn(&str) -> bool) {
        self.desired.retain(|n, _| keep(n));
    }

    /// The agent deleted Application `name`: forgets its own form and what operations were
    /// forwarded for it.
    pub(crate) fn forget_agent_app(&mut self, name: &str) {
        self.desired.remove(name);
        self.sent_operation.remove(name);
        self.sent_terminate.remove(name);
    }

    // --- Applications sent to the agent (managed) ---

    /// Records the checksum of Application `name` as sent; returns whether it changed
    /// (whether the spec is to go out).
    pub(crate) fn record_sent_spec(&mut self, name: &str, sum: String) -> bool {
        self.sent_spec.get(name) != Some(&sum) && {
            self.sent_spec.insert(name.to_owned(), sum);
            true
        }
    }

    /// Whether Application `name` was sent to the agent.
    pub(crate) fn has_sent_spec(&self, name: &str) -> bool {
        self.sent_spec.contains_key(name)
    }

    /// What the agent holds from now on (its resync): `sums` replaces what was sent.
    pub(crate) fn replace_sent_specs(&mut self, sums: HashMap<String, String>) {
        self.sent_spec = sums;
    }

    /// The hub deleted Application `name`: forgets what was sent of it (spec, operation,
    /// terminate request).
    pub(crate) fn forget_sent_app(&mut self, name: &str) {
        self.sent_spec.remove(name);
        self.sent_operation.remove(name);
        self.sent_terminate.remove(name);
    }

    /// Records the hub's `.operation` of `name` (its checksum, `None` when it has none);
    /// returns whether it is new (to be forwarded once).
    pub(crate) fn record_sent_operation(&mut self, name: &str, sum: Option<String>) -> bool {
        match sum {
            Some(sum) => self.sent_operation.insert(name.to_owned(), sum.clone()) != Some(sum),
            None => {
                self.sent_operation.remove(name);
                false
            }
        }
    }

    /// Records whether the hub asks to terminate `name`'s operation; returns whether the
    /// request is new (to be forwarded once).
    pub(crate) fn record_terminate(&mut self, name: &str, terminating: bool) -> bool {
        if terminating {
            self.sent_terminate.insert(name.to_owned())
        } else {
            self.sent_terminate.remove(name);
            false
        }
    }

    // --- refresh requests (autonomous) ---

    /// Records the hub's refresh request `value` on `name`; returns whether it is new (to
    /// be forwarded once).
    pub(crate) fn record_sent_refresh(&mut self, name: &str, value: &str) -> bool {
        self.sent_refresh
            .insert(name.to_owned(), value.to_owned())
            .as_deref()
            != Some(value)
    }

    /// The hub copy of `name` has no refresh request (any more): forgets it.
    pub(crate) fn forget_refresh(&mut self, name: &str) {
        self.sent_refresh.remove(name);
        self.refresh_delivered.remove(name);
    }

    /// The agent acknowledged the refresh request forwarded for `name`.
    pub(crate) fn note_refresh_delivered(&mut self, name: &str) {
        self.refresh_delivered.insert(name.to_owned());
    }

    /// Whether a refresh request of `name` was delivered (taken once: the next object from
    /// the spoke ends it).
    pub(crate) fn take_refresh_delivered(&mut self, name: &str) -> bool {
        self.refresh_delivered.remove(name)
    }

    // --- configuration objects sent to the agent (managed) ---

    /// Records configuration object `key` as sent with checksum `sum`; returns whether it
    /// changed (whether it is to go out).
    pub(crate) fn record_sent_config(&mut self, key: &ConfigKey, sum: String) -> bool {
        self.sent_config.get(key) != Some(&sum) && {
            self.sent_config.insert(key.clone(), sum);
            true
        }
    }

    /// Forgets the configuration objects sent that `keep` rejects; returns them (to be
    /// deleted on the spoke).
    pub(crate) fn forget_sent_config_except(
        &mut self,
        keep: impl Fn(&ConfigKey) -> bool,
    ) -> Vec<ConfigKey> {
        let gone: Vec<ConfigKey> = self
            .sent_config
            .keys()
            .filter(|k| !keep(k))
            .cloned()
            .collect();
        for key in &gone {
            self.sent_config.remove(key);
        }
        gone
    }

    /// What the agent holds from now on (its resync): `sums` replaces what was sent.
    pub(crate) fn replace_sent_config(&mut self, sums: HashMap<ConfigKey, String>) {
        self.sent_config = sums;
    }

    /// Whether configuration object `key` was sent to the agent.
    pub(crate) fn has_sent_config(&self, key: &ConfigKey) -> bool {
        self.sent_config.contains_key(key)
    }

    // --- projects the agent sent (autonomous) ---

    /// The agent's project `name` as it sent it.
    pub(crate) fn agent_project(&self, name: &str) -> Option<Arc<Value>> {
        self.desired_projects.get(name).cloned()
    }

    /// Whether the agent's own form of project `name` is known.
    pub(crate) fn has_agent_project(&self, name: &str) -> bool {
        self.desired_projects.contains_key(name)
    }

    /// Records the agent's project `name` (before its hub write); returns what it replaces,
    /// for [`Self::restore_agent_project`].
    pub(crate) fn record_agent_project(
        &mut self,
        name: &str,
        obj: Arc<Value>,
    ) -> Option<Arc<Value>> {
        self.desired_projects.insert(name.to_owned(), obj)
    }

    /// Puts back what [`Self::record_agent_project`] replaced (its hub write failed).
    pub(crate) fn restore_agent_project(&mut self, name: &str, previous: Option<Arc<Value>>) {
        match previous {
            Some(p) => self.desired_projects.insert(name.to_owned(), p),
            None => self.desired_projects.remove(name),
        };
    }

    /// Forgets the agent's project `name`.
    pub(crate) fn forget_agent_project(&mut self, name: &str) {
        self.desired_projects.remove(name);
    }

    /// Keeps only the agent's projects `keep` says it still holds.
    pub(crate) fn retain_agent_projects(&mut self, keep: impl Fn(&str) -> bool) {
        self.desired_projects.retain(|n, _| keep(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_domain::{AgentName, AllowedModes, ClientIdentity};
    use serde_json::json;

    fn identity(ns: &str) -> AgentIdentity {
        AgentIdentity {
            client: ClientIdentity::AgentName(AgentName::new("a").unwrap()),
            agent: AgentName::new("a").unwrap(),
            namespace: Namespace::new(ns).unwrap(),
            allowed_modes: AllowedModes::Both,
            rule: "test".into(),
            tenant: None,
        }
    }

    fn inner() -> AgentInner {
        AgentInner::new(identity("agent-a"), AgentMode::Managed)
    }

    #[test]
    fn a_sent_spec_goes_out_once_per_checksum_and_a_hub_delete_forgets_it() {
        let mut s = inner();
        assert!(s.record_sent_spec("app", "1".into()));
        assert!(!s.record_sent_spec("app", "1".into()));
        assert!(s.record_sent_spec("app", "2".into()));
        assert!(s.record_sent_operation("app", Some("op".into())));
        assert!(s.record_terminate("app", true));
        s.forget_sent_app("app");
        assert!(!s.has_sent_spec("app"));
        assert!(s.record_sent_operation("app", Some("op".into())));
        assert!(s.record_terminate("app", true));
    }

    #[test]
    fn operations_and_terminate_requests_are_forwarded_once_until_cleared() {
        let mut s = inner();
        assert!(s.record_sent_operation("app", Some("a".into())));
        assert!(!s.record_sent_operation("app", Some("a".into())));
        assert!(s.record_sent_operation("app", Some("b".into())));
        assert!(!s.record_sent_operation("app", None));
        assert!(s.record_sent_operation("app", Some("b".into())));
        assert!(s.record_terminate("app", true));
        assert!(!s.record_terminate("app", true));
        assert!(!s.record_terminate("app", false));
        assert!(s.record_terminate("app", true));
    }

    #[test]
    fn a_failed_write_restores_what_the_agent_had_sent() {
        let mut s = inner();
        let one = Arc::new(json!({"v": 1}));
        assert!(s.record_desired_app("app", one.clone()).is_none());
        let previous = s.record_desired_app("app", Arc::new(json!({"v": 2})));
        s.restore_desired_app("app", previous);
        assert_eq!(s.desired_app("app"), Some(one));
        let previous = s.record_desired_app("new", Arc::new(json!({})));
        s.restore_desired_app("new", previous);
        assert!(s.desired_app("new").is_none());
        s.adopt_desired_app("app", || Arc::new(json!({"v": 3})));
        assert_eq!(s.desired_app("app"), Some(Arc::new(json!({"v": 1}))));
        let previous = s.record_agent_project("p", Arc::new(json!({})));
        s.restore_agent_project("p", previous);
        assert!(!s.has_agent_project("p"));
    }

    #[test]
    fn a_refresh_request_is_forwarded_once_and_delivered_once() {
        let mut s = inner();
        assert!(s.record_sent_refresh("app", "hard"));
        assert!(!s.record_sent_refresh("app", "hard"));
        s.note_refresh_delivered("app");
        assert!(s.take_refresh_delivered("app"));
        assert!(!s.take_refresh_delivered("app"));
        s.note_refresh_delivered("app");
        s.forget_refresh("app");
        assert!(!s.take_refresh_delivered("app"));
        assert!(s.record_sent_refresh("app", "hard"));
    }

    #[test]
    fn config_objects_sent_are_diffed_against_the_set_the_agent_must_hold() {
        let mut s = inner();
        let key = |n: &str| (ResourceKind::AppProject, n.to_owned());
        assert!(s.record_sent_config(&key("a"), "1".into()));
        assert!(!s.record_sent_config(&key("a"), "1".into()));
        assert!(s.record_sent_config(&key("b"), "1".into()));
        let gone = s.forget_sent_config_except(|k| k.1 == "a");
        assert_eq!(gone, vec![key("b")]);
        assert!(s.has_sent_config(&key("a")) && !s.has_sent_config(&key("b")));
    }

    #[test]
    fn a_new_mode_forgets_what_was_sent_and_a_new_namespace_is_reported() {
        let mut s = inner();
        s.record_sent_spec("app", "1".into());
        s.record_desired_app("x", Arc::new(json!({})));
        let first = CancellationToken::new();
        let r = s.begin_session(identity("agent-a"), AgentMode::Managed, 1, first.clone());
        assert!(r.moved_from.is_none() && r.session.is_none());
        assert!(s.has_sent_spec("app"));
        let r = s.begin_session(identity("agent-b"), AgentMode::Autonomous, 2, first);
        assert_eq!(
            r.moved_from.map(|n| n.as_str().to_owned()).as_deref(),
            Some("agent-a")
        );
        assert_eq!(r.session.map(|(id, _)| id), Some(1));
        assert!(!s.has_sent_spec("app") && s.desired_app("x").is_none());
        s.end_session(1);
        assert!(s.is_connected());
        s.set_session_info(
            2,
            SessionInfo {
                agent_version: "v".into(),
                ..Default::default()
            },
        );
        assert_eq!(s.session_info().agent_version, "v");
        assert!(s.close_session(Some("why".into())).is_some());
        assert!(s.close_session(None).is_none());
        assert_eq!(s.take_close_reason().as_deref(), Some("why"));
        assert!(s.take_close_reason().is_none());
    }

    #[test]
    fn a_resync_request_waits_for_the_interval_since_the_last_round() {
        let mut s = inner();
        let t0 = Instant::now();
        let every = Duration::from_secs(10);
        assert!(s.admit_resync(t0, every).is_ok());
        assert_eq!(
            s.admit_resync(t0 + Duration::from_secs(4), every),
            Err(Duration::from_secs(6))
        );
        assert!(s.admit_resync(t0 + every, every).is_ok());
        s.note_resync(t0 + Duration::from_secs(30));
        assert!(s.admit_resync(t0 + Duration::from_secs(31), every).is_err());
    }
}
