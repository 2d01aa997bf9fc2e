//! Mapping rules that follow a file on disk, and revocation of sessions whose identity no
//! longer maps after a change.
//!
//! The file is polled, not watched: Kubernetes updates a mounted ConfigMap by swapping a
//! `..data` symlink to a new directory, which inotify watches on the file itself miss. Each
//! poll reads the content (a few KiB) and compares it with what is applied; comparing content
//! instead of mtime also catches two writes within the mtime granularity.

// Denials are the rare path and carry everything a log line needs (identity, object,
// reason); boxing them would only add noise at every call site.
#![allow(clippy::result_large_err)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::decision::{AgentIdentity, DenyReason, MappingDenied};
use super::error::RuleError;
use super::set::RuleSet;

/// Lists the identities of the sessions that are live right now.
pub type SessionLister = Arc<dyn Fn() -> Vec<AgentIdentity> + Send + Sync>;
/// Told about each live session whose identity stopped mapping, and why.
pub type RevokeCallback = Arc<dyn Fn(AgentIdentity, MappingDenied) + Send + Sync>;

/// Rules from an optional YAML file (reloaded live) followed by rules from flags.
///
/// Dropping it stops the file poller and every [`LiveRules::on_revoked`] watcher.
#[derive(Debug)]
pub struct LiveRules {
    rx: watch::Receiver<Arc<RuleSet>>,
    /// Kept when there is no file, so subscribers wait instead of seeing a closed channel.
    _static_tx: Option<watch::Sender<Arc<RuleSet>>>,
    runtime: Handle,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl LiveRules {
    /// Loads the file (if any) and the flag rules, and starts polling the file every `poll`.
    ///
    /// Fails if the initial file or a flag is invalid, or if called outside a tokio runtime.
    /// A later invalid version of the file is logged (`tracing::error`) and the last good
    /// rules stay in force. A change is applied once two consecutive polls read the same
    /// content, so a file caught half-written is never applied.
    pub fn start(
        file: Option<PathBuf>,
        flag_rules: Vec<String>,
        poll: Duration,
    ) -> Result<LiveRules, RuleError> {
        let runtime = Handle::try_current().map_err(|_| RuleError::NoRuntime)?;
        let flags = RuleSet::from_flags(&flag_rules)?;
        let Some(path) = file else {
            let (tx, rx) = watch::channel(Arc::new(flags));
            return Ok(LiveRules {
                rx,
                _static_tx: Some(tx),
                runtime,
                tasks: Mutex::new(Vec::new()),
            });
        };
        // Startup only, and the file is small: a blocking read here is fine.
        let text = std::fs::read_to_string(&path).map_err(|cause| RuleError::Read {
            path: path.clone(),
            cause,
        })?;
        let file_rules = RuleSet::from_yaml(&text).map_err(|e| RuleError::File {
            path: path.clone(),
            cause: Box::new(e),
        })?;
        let (tx, rx) = watch::channel(Arc::new(file_rules.append(flags.clone())));
        let poller = runtime.spawn(poll_file(path, text, flags, poll, tx));
        Ok(LiveRules {
            rx,
            _static_tx: None,
            runtime,
            tasks: Mutex::new(vec![poller]),
        })
    }

    /// The rules in force now.
    pub fn current(&self) -> Arc<RuleSet> {
        self.rx.borrow().clone()
    }

    /// A receiver that sees every future change of the rules.
    pub fn subscribe(&self) -> watch::Receiver<Arc<RuleSet>> {
        self.rx.clone()
    }

    /// On every change of the rules, re-maps each live session's SPIFFE ID (from `sessions`)
    /// and calls `callback` for each one that no longer maps, maps to a different agent or
    /// namespace, or whose rule now allows fewer modes. The principal closes those sessions:
    /// established HTTP/2 connections would otherwise keep their access.
    pub fn on_revoked(&self, sessions: SessionLister, callback: RevokeCallback) {
        let mut rx = self.rx.clone();
        rx.mark_unchanged();
        let task = self.runtime.spawn(async move {
            while rx.changed().await.is_ok() {
                let rules = rx.borrow_and_update().clone();
                for session in sessions() {
                    if let Err(denied) = rules.recheck(&session) {
                        tracing::warn!(
                            client = %session.client,
                            agent = %session.agent,
                            reason = %denied.reason,
                            "identity no longer maps after a rules change; revoking session"
                        );
                        callback(session, denied);
                    }
                }
            }
        });
        self.tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(task);
    }
}

impl Drop for LiveRules {
    fn drop(&mut self) {
        let tasks = self
            .tasks
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for t in tasks.drain(..) {
            t.abort();
        }
    }
}

impl RuleSet {
    /// Checks that a live session's identity still maps the same way under these rules:
    /// same agent, same namespace, and no mode it was allowed is now forbidden.
    pub fn recheck(&self, session: &AgentIdentity) -> Result<(), MappingDenied> {
        let now = self.map_client(&session.client)?;
        let denied = |reason| MappingDenied {
            client: session.client.clone(),
            reason,
        };
        if now.agent != session.agent || now.namespace != session.namespace {
            return Err(denied(DenyReason::Remapped {
                rule: now.rule,
                was: (session.agent.clone(), session.namespace.clone()),
                now: (now.agent, now.namespace),
            }));
        }
        if now.tenant != session.tenant {
            return Err(denied(DenyReason::TenantChanged {
                was: session.tenant.clone(),
                now: now.tenant,
            }));
        }
        let narrowed = [crate::AgentMode::Managed, crate::AgentMode::Autonomous]
            .into_iter()
            .any(|m| session.allowed_modes.allows(m) && !now.allowed_modes.allows(m));
        if narrowed {
            return Err(denied(DenyReason::ModesNarrowed {
                rule: now.rule,
                was: session.allowed_modes,
                now: now.allowed_modes,
            }));
        }
        Ok(())
    }
}

/// Polls `path` and publishes each new valid version (file rules, then `flags`).
async fn poll_file(
    path: PathBuf,
    mut applied: String,
    flags: RuleSet,
    poll: Duration,
    tx: watch::Sender<Arc<RuleSet>>,
) {
    let mut ticker = tokio::time::interval(poll.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    // Content seen once but not yet applied; applied when the next poll reads it again.
    let mut pending: Option<String> = None;
    // Last content that failed to parse, so each bad version is logged once.
    let mut rejected: Option<String> = None;
    let mut read_failing = false;
    loop {
        ticker.tick().await;
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(t) => {
                read_failing = false;
                t
            }
            Err(e) => {
                if !read_failing {
                    tracing::error!(
                        file = %path.display(),
                        error = %e,
                        "cannot read mapping rules file; keeping the last good rules"
                    );
                    read_failing = true;
                }
                continue;
            }
        };
        if text == applied || rejected.as_deref() == Some(text.as_str()) {
            pending = None;
            continue;
        }
        if pending.as_deref() != Some(text.as_str()) {
            pending = Some(text);
            continue;
        }
        pending = None;
        match RuleSet::from_yaml(&text) {
            Ok(rules) => {
                let rules = rules.append(flags.clone());
                tracing::info!(
                    file = %path.display(),
                    rules = rules.len(),
                    "mapping rules reloaded"
                );
                applied = text;
                rejected = None;
                tx.send_replace(Arc::new(rules));
            }
            Err(e) => {
                tracing::error!(
                    file = %path.display(),
                    error = %e,
                    "invalid mapping rules file; keeping the last good rules"
                );
                rejected = Some(text);
            }
        }
    }
}
