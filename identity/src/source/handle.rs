//! The handle every consumer of the workload's SVID holds ([`SvidSource`]): the current state,
//! a `watch` receiver of every new one, and readiness. The sources that feed it live in
//! `files.rs` and `workload.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::error::{SourceError, SvidNotReady};
use crate::svid::SvidState;

/// Aborts the background task when the last clone of the source is dropped.
struct TaskGuard(JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A live view of the workload's SVID and trust bundles. Cheap to clone; the background task
/// (and every [`SvidSource::on_update`] follower) stops when the last clone is dropped.
#[derive(Clone)]
pub struct SvidSource {
    rx: watch::Receiver<Option<Arc<SvidState>>>,
    description: Arc<str>,
    _task: Option<Arc<TaskGuard>>,
    /// The [`SvidSource::on_update`] followers, aborted with the last clone.
    followers: Arc<Mutex<Vec<TaskGuard>>>,
}

impl std::fmt::Debug for SvidSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SvidSource")
            .field("from", &self.description)
            .field("ready", &self.rx.borrow().is_some())
            .finish()
    }
}

impl SvidSource {
    /// A source that never changes (tests, or material obtained elsewhere).
    pub fn fixed(state: SvidState) -> SvidSource {
        let (tx, rx) = watch::channel(Some(Arc::new(state)));
        // Keep the sender alive for as long as the source exists so `wait_ready` never sees a
        // closed channel.
        let task = tokio::runtime::Handle::try_current().ok().map(|h| {
            Arc::new(TaskGuard(h.spawn(async move {
                tx.closed().await;
            })))
        });
        SvidSource {
            rx,
            description: Arc::from("fixed SVID"),
            _task: task,
            followers: Arc::default(),
        }
    }

    /// A source fed by someone else's channel.
    pub fn from_receiver(rx: watch::Receiver<Option<Arc<SvidState>>>) -> SvidSource {
        SvidSource {
            rx,
            description: Arc::from("external channel"),
            _task: None,
            followers: Arc::default(),
        }
    }

    pub(crate) fn from_parts(
        rx: watch::Receiver<Option<Arc<SvidState>>>,
        description: String,
        task: JoinHandle<()>,
    ) -> SvidSource {
        SvidSource {
            rx,
            description: Arc::from(description),
            _task: Some(Arc::new(TaskGuard(task))),
            followers: Arc::default(),
        }
    }

    /// The latest state, if any SVID has been received yet.
    pub fn current(&self) -> Option<Arc<SvidState>> {
        self.rx.borrow().clone()
    }

    /// A receiver that sees every new state.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<SvidState>>> {
        self.rx.clone()
    }

    /// Calls `f` with the current state (if any) and with every new one, from a task that
    /// ends with the source: when its feed ends, or when the last clone of the source is
    /// dropped (the source owns the task). Used by metrics (expiry, rotations).
    pub fn on_update(&self, f: impl Fn(&SvidState) + Send + 'static) {
        let mut rx = self.rx.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Some(state) = rx.borrow_and_update().clone() {
                    f(&state);
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        let mut followers = self.followers.lock().unwrap_or_else(|p| p.into_inner());
        // Followers whose feed ended are gone: keep only the running ones.
        followers.retain(|t| !t.0.is_finished());
        followers.push(TaskGuard(task));
    }

    /// Why this source cannot serve a handshake now (no SVID yet, or the current one has
    /// expired), for readiness probes; `Ok` when it can.
    pub fn readiness(&self) -> Result<(), SvidNotReady> {
        match self.current() {
            None => Err(SvidNotReady::NoSvid {
                from: self.description.to_string(),
            }),
            Some(s) if s.svid.is_expired_at(std::time::SystemTime::now()) => {
                Err(SvidNotReady::Expired {
                    id: s.svid.spiffe_id().to_string(),
                    from: self.description.to_string(),
                })
            }
            Some(_) => Ok(()),
        }
    }

    /// Where this source reads from, for logs.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Waits until an SVID is available.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<Arc<SvidState>, SourceError> {
        let mut rx = self.rx.clone();
        let wait = async {
            match rx.wait_for(|s| s.is_some()).await {
                Ok(state) => state.clone().ok_or(SourceError::Closed),
                Err(_) => Err(SourceError::Closed),
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(result) => result,
            Err(_) => Err(SourceError::Timeout {
                from: self.description.to_string(),
                timeout,
                last_error: None,
            }),
        }
    }
}
