//! The guard in force, reloaded live: a file (`--guard-file`) and a ConfigMap in the
//! agent's namespace (`--guard-configmap`, key [`super::policy::CONFIGMAP_KEY`]) are read again
//! every `--guard-reload-interval`; flags are fixed at startup.
//!
//! Both are polled, not watched: Kubernetes updates a mounted ConfigMap by swapping a
//! `..data` symlink, which file watches miss, and one GET of one small ConfigMap a few
//! seconds apart costs nothing. A policy that does not parse at startup stops the agent; a
//! broken update later is logged and counted (`argocd_agent_guard_reload_errors_total`), and
//! the last good policy of that source stays in force.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_kubernetes::Resources;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::policy::{CONFIGMAP_KEY, GPG_KEYS_CONFIGMAP, Guard, GuardError, GuardSet, GuardSpec};

/// Where the guard comes from (the agent's flags).
#[derive(Debug, Clone, Default)]
pub struct GuardSources {
    /// `--guard-file`: a YAML policy file.
    pub file: Option<PathBuf>,
    /// `--guard-configmap`: a ConfigMap in the agent's namespace holding the policy.
    pub configmap: Option<String>,
    /// The `--guard-*` rule flags (all unset: no guard from flags).
    pub flags: GuardSpec,
    /// How often the file and the ConfigMap are read again.
    pub reload_interval: Duration,
}

/// The last good policy of each live source.
#[derive(Clone, Default)]
struct Parts {
    file: Option<Arc<Guard>>,
    configmap: Option<Arc<Guard>>,
    flags: Option<Arc<Guard>>,
    configmap_name: Option<String>,
}

impl Parts {
    fn set(&self) -> GuardSet {
        GuardSet {
            guards: [&self.file, &self.configmap, &self.flags]
                .into_iter()
                .flatten()
                .cloned()
                .collect(),
            configmap: self.configmap_name.clone(),
        }
    }
}

/// The guard in force; [`LiveGuard::changes`] tells when it changed.
pub struct LiveGuard {
    tx: watch::Sender<Arc<GuardSet>>,
}

impl Default for LiveGuard {
    fn default() -> Self {
        LiveGuard::fixed(GuardSet::default())
    }
}

impl LiveGuard {
    /// A guard that never changes (tests, and agents without live sources).
    pub fn fixed(set: GuardSet) -> LiveGuard {
        LiveGuard {
            tx: watch::Sender::new(Arc::new(set)),
        }
    }

    /// The guard in force now.
    pub fn current(&self) -> Arc<GuardSet> {
        self.tx.borrow().clone()
    }

    /// A receiver that sees each change.
    pub fn changes(&self) -> watch::Receiver<Arc<GuardSet>> {
        self.tx.subscribe()
    }

    /// Reads every source (an error stops the agent: it names the source and the field),
    /// then rereads the file and the ConfigMap until `shutdown`.
    pub async fn start(
        sources: &GuardSources,
        configmaps: Resources,
        namespace: &str,
        metrics: crate::metrics::Metrics,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Arc<LiveGuard>, GuardError> {
        if sources.configmap.as_deref() == Some(GPG_KEYS_CONFIGMAP) {
            return Err(GuardError::Field {
                origin: "flags".into(),
                field: "--guard-configmap".into(),
                message: format!(
                    "{GPG_KEYS_CONFIGMAP} is written by the hub; name a ConfigMap the hub never writes"
                ),
            });
        }
        let flags = (sources.flags != GuardSpec::default())
            .then(|| Guard::compile(&sources.flags, "flags"))
            .transpose()?
            .map(Arc::new);
        let reader = Reader {
            file: sources.file.clone(),
            configmap: sources
                .configmap
                .clone()
                .map(|n| (configmaps, namespace.to_owned(), n)),
        };
        let mut texts = Texts::default();
        let file = match reader.file_text().await? {
            Some(text) => {
                let guard = Guard::from_yaml(&text, &reader.file_origin())?;
                texts.file = Some(text);
                Some(Arc::new(guard))
            }
            None => None,
        };
        let configmap = match reader.configmap_text().await? {
            Some(text) => {
                let guard = Guard::from_yaml(&text, &reader.configmap_origin())?;
                texts.configmap = Some(text);
                Some(Arc::new(guard))
            }
            None => {
                if let Some(name) = &sources.configmap {
                    tracing::warn!(configmap = %name, namespace, "spoke guard ConfigMap absent: its rules apply once it is created");
                }
                None
            }
        };
        let parts = Parts {
            file,
            configmap,
            flags,
            configmap_name: sources.configmap.clone(),
        };
        let set = parts.set();
        if set.is_active() {
            tracing::info!(sources = %origins(&set).join(", "), "spoke guard in force");
        }
        let live = Arc::new(LiveGuard {
            tx: watch::Sender::new(Arc::new(set)),
        });
        if reader.file.is_some() || reader.configmap.is_some() {
            let interval = sources.reload_interval.max(Duration::from_millis(100));
            let reload = Reload {
                live: live.clone(),
                reader,
                parts,
                texts,
                metrics,
            };
            tasks.spawn(reload.run(interval, shutdown));
        }
        Ok(live)
    }
}

fn origins(set: &GuardSet) -> Vec<String> {
    set.guards.iter().map(|g| g.origin.clone()).collect()
}

/// The text each live source had when last read (valid or not).
#[derive(Default)]
struct Texts {
    file: Option<String>,
    configmap: Option<String>,
}

/// Reads the live sources.
struct Reader {
    file: Option<PathBuf>,
    configmap: Option<(Resources, String, String)>,
}

impl Reader {
    fn file_origin(&self) -> String {
        let path = self.file.as_deref().unwrap_or(std::path::Path::new(""));
        format!("--guard-file {}", path.display())
    }

    fn configmap_origin(&self) -> String {
        match &self.configmap {
            Some((_, ns, name)) => format!("ConfigMap {ns}/{name}"),
            None => "ConfigMap".into(),
        }
    }

    /// The file's text (`None`: no file configured).
    async fn file_text(&self) -> Result<Option<String>, GuardError> {
        let Some(path) = &self.file else {
            return Ok(None);
        };
        let text = tokio::fs::read_to_string(path)
            .await
            .map_err(|e| GuardError::Yaml {
                origin: self.file_origin(),
                message: format!("cannot read: {e}"),
            })?;
        Ok(Some(text))
    }

    /// The ConfigMap's policy text (`None`: not configured, or absent).
    async fn configmap_text(&self) -> Result<Option<String>, GuardError> {
        let Some((api, ns, name)) = &self.configmap else {
            return Ok(None);
        };
        let obj = api
            .get(Some(ns), name)
            .await
            .map_err(|e| GuardError::Yaml {
                origin: self.configmap_origin(),
                message: format!("cannot read: {}", argocd_agent_domain::error_chain(&e)),
            })?;
        let Some(obj) = obj else {
            return Ok(None);
        };
        let text = obj
            .data
            .pointer(&format!(
                "/data/{}",
                CONFIGMAP_KEY.replace('~', "~0").replace('/', "~1")
            ))
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| GuardError::Field {
                origin: self.configmap_origin(),
                field: format!("data.{CONFIGMAP_KEY}"),
                message: "missing: the policy is read from this key".into(),
            })?;
        Ok(Some(text.to_owned()))
    }
}

/// The reload task's state.
struct Reload {
    live: Arc<LiveGuard>,
    reader: Reader,
    parts: Parts,
    texts: Texts,
    metrics: crate::metrics::Metrics,
}

impl Reload {
    /// Rereads the file and the ConfigMap every `interval`; a changed valid policy replaces
    /// that source's, a broken one is logged and counted (once per content) and the last
    /// good one stays.
    async fn run(mut self, interval: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let mut changed = false;
            if self.reader.file.is_some() {
                let read = self.reader.file_text().await;
                let origin = self.reader.file_origin();
                changed |= reload_one(
                    &origin,
                    read,
                    &mut self.parts.file,
                    &mut self.texts.file,
                    &self.metrics,
                );
            }
            if self.reader.configmap.is_some() {
                let read = self.reader.configmap_text().await;
                let origin = self.reader.configmap_origin();
                changed |= reload_one(
                    &origin,
                    read,
                    &mut self.parts.configmap,
                    &mut self.texts.configmap,
                    &self.metrics,
                );
            }
            if changed {
                let set = self.parts.set();
                tracing::info!(sources = %origins(&set).join(", "), "spoke guard reloaded");
                self.live.tx.send_replace(Arc::new(set));
            }
        }
    }
}

/// One source's reread (`read`: its text, `None` when absent): returns whether its policy
/// changed. A text seen before (valid or not) changes nothing.
fn reload_one(
    origin: &str,
    read: Result<Option<String>, GuardError>,
    slot: &mut Option<Arc<Guard>>,
    last_text: &mut Option<String>,
    metrics: &crate::metrics::Metrics,
) -> bool {
    let source = if origin.starts_with("ConfigMap") {
        "configmap"
    } else {
        "file"
    };
    let text = match read {
        Ok(text) => text,
        Err(e) => {
            metrics.guard_reload_error(source);
            tracing::error!(source, error = %e, "spoke guard not reloaded: the last good policy stays in force");
            return false;
        }
    };
    if text == *last_text {
        return false;
    }
    *last_text = text.clone();
    let Some(text) = text else {
        tracing::warn!(
            source = origin,
            "spoke guard source removed: its rules are no longer in force"
        );
        return slot.take().is_some();
    };
    match Guard::from_yaml(&text, origin) {
        Ok(guard) => {
            *slot = Some(Arc::new(guard));
            true
        }
        Err(e) => {
            metrics.guard_reload_error(source);
            tracing::error!(source, error = %e, "spoke guard not reloaded: the last good policy stays in force");
            false
        }
    }
}
