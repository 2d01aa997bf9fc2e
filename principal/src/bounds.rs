//! Per-agent bounds and the rules for a managed agent's spoke-authored children, checked
//! before anything is written to the hub (so the hub's API server is bounded by them too).
//!
//! Sizes are weights ([`value_weight`](argocd_agent_kubernetes::object::value_weight)): the compact JSON bytes of the object as
//! the agent sends it (as the hub holds it, for what the agent holds), plus 32 bytes per
//! JSON value in it. JSON bytes alone do not bound memory: an array of zeros is 2 bytes of
//! JSON per element and 32 or more once decoded, and 8 MiB of it took a principal from 67
//! to 394 MiB (docs/benchmarks.md, "Per-agent bounds").
//!
//! - **Object size**: every object an agent sends (Application, AppProject, status
//!   update) weighs at most [`AgentBounds::max_object_size`] (refusal `ObjectTooLarge`).
//! - **Applications**: the Applications an agent writes on the hub (an autonomous agent's
//!   copies and a managed agent's app-of-apps children together: both carry the agent's
//!   label in its hub namespace), at most [`AgentBounds::max_applications`]
//!   (`TooManyApplications`). Hub-authored Applications are written by hub admins, not by
//!   the agent, and do not count.
//! - **Bytes**: the weight of everything the agent wrote on the hub (those
//!   Applications, status included, and an autonomous agent's AppProjects), at most
//!   [`AgentBounds::max_bytes`] (`AgentBytesExceeded`). A write that does not grow an
//!   object is always taken, so an agent over its bounds can shrink and delete.
//!
//! An object labelled [`IGNORE_SYNC_LABEL`] is refused (`Invalid`): its hub copy would be
//! outside the watch, so outside the count.
//!
//! What an agent holds is counted from the principal's watch cache of the hub, by the
//! agent label, so it is right after a restart and on every replica; the writes of the
//! last [`LEDGER_TTL`] are laid over it, so a burst is counted before the watch has seen it.
//!
//! A spoke-authored child ([`Hub::check_child`](crate::hub::Hub::check_child)) is taken only when its parent is an
//! Application the hub sends this agent (`ParentNotFound`, `ParentNotHeld`), its project
//! is one the hub sends this agent (`ProjectNotAllowed`), and the parent's
//! `.status.resources` lists it (`ChildNotTracked`, answered `Unavailable`: the agent
//! resends it, as the parent's status may reach the hub after the child).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use argocd_agent_domain::{AgentName, ResourceKind, ResourceRef};
use argocd_agent_kubernetes::{AGENT_NAME_LABEL, IGNORE_SYNC_LABEL};
use kube::api::DynamicObject;
use serde_json::Value;

use crate::inbound::Refusal;
use crate::refusals::{AGENT_BYTES_EXCEEDED, OBJECT_TOO_LARGE, TOO_MANY_APPLICATIONS};

/// Default `--agent-max-object-size`: 512 KiB.
pub const DEFAULT_MAX_OBJECT_SIZE: usize = 512 * 1024;
/// Default `--agent-max-applications`.
pub const DEFAULT_MAX_APPLICATIONS: usize = 500;
/// Default `--agent-max-bytes`: 8 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 8 * 1024 * 1024;

/// How long a write is laid over the watch cache's count (the watch normally sees it in
/// milliseconds).
pub const LEDGER_TTL: Duration = Duration::from_secs(30);

/// Per-agent bounds (`--agent-max-object-size`, `--agent-max-applications`,
/// `--agent-max-bytes`); 0 turns one off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentBounds {
    /// Heaviest object an agent may send ([`value_weight`](argocd_agent_kubernetes::object::value_weight), bytes).
    pub max_object_size: usize,
    /// Most Applications one agent may have written on the hub.
    pub max_applications: usize,
    /// Most bytes ([`value_weight`](argocd_agent_kubernetes::object::value_weight)) of objects one agent may have written on the
    /// hub.
    pub max_bytes: u64,
}

impl Default for AgentBounds {
    fn default() -> Self {
        AgentBounds {
            max_object_size: DEFAULT_MAX_OBJECT_SIZE,
            max_applications: DEFAULT_MAX_APPLICATIONS,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// One object an agent wrote on the hub: its kind and its name as the agent names it.
pub type HeldKey = (ResourceKind, String);

/// What one agent wrote on the hub: each object's JSON size.
pub type Holdings = HashMap<HeldKey, usize>;

/// A write that passed the bounds, recorded once it is applied (`size: None`: a delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The object.
    pub key: HeldKey,
    /// Its size after the write.
    pub size: Option<usize>,
}

fn refusal(metric: &'static str, message: String) -> Refusal {
    Refusal {
        reason: metric,
        metric,
        message,
    }
}

/// Refuses an object over the size bound.
pub fn check_object_size(
    bounds: &AgentBounds,
    agent: &AgentName,
    resource: &ResourceRef,
    size: usize,
) -> Result<(), Refusal> {
    if bounds.max_object_size == 0 || size <= bounds.max_object_size {
        return Ok(());
    }
    Err(refusal(
        OBJECT_TOO_LARGE,
        format!(
            "agent \"{agent}\" sent {resource} of {size} bytes (JSON bytes plus 32 per JSON value); the principal takes objects of at most {} bytes (--agent-max-object-size)",
            bounds.max_object_size
        ),
    ))
}

/// Refuses a write that would leave `key` at `size` bytes when the agent holds
/// `holdings`: a new Application over the count bound, or more bytes than the byte bound
/// (a write that does not grow the object is always taken).
pub fn check_holdings(
    bounds: &AgentBounds,
    agent: &AgentName,
    key: &HeldKey,
    size: usize,
    holdings: &Holdings,
) -> Result<(), Refusal> {
    let existing = holdings.get(key).copied();
    if existing.is_some_and(|e| size <= e) {
        return Ok(());
    }
    let apps = holdings
        .keys()
        .filter(|(k, _)| *k == ResourceKind::Application)
        .count();
    if key.0 == ResourceKind::Application
        && existing.is_none()
        && bounds.max_applications > 0
        && apps >= bounds.max_applications
    {
        return Err(refusal(
            TOO_MANY_APPLICATIONS,
            format!(
                "agent \"{agent}\" holds {apps} Applications on the hub, the most it may (--agent-max-applications {}): application \"{}\" refused",
                bounds.max_applications, key.1
            ),
        ));
    }
    let held: u64 = holdings.values().map(|s| *s as u64).sum();
    let total = held - existing.unwrap_or(0) as u64 + size as u64;
    if bounds.max_bytes > 0 && total > bounds.max_bytes {
        return Err(refusal(
            AGENT_BYTES_EXCEEDED,
            format!(
                "agent \"{agent}\" holds {held} bytes on the hub; {} \"{}\" of {size} bytes would make {total}, over --agent-max-bytes {}",
                key.0.as_str().to_ascii_lowercase(),
                key.1,
                bounds.max_bytes
            ),
        ));
    }
    Ok(())
}

/// Refuses an object labelled [`IGNORE_SYNC_LABEL`]: its hub copy would be outside every
/// principal's watch, so outside the agent's bounds too (a hub API server's worth of
/// Applications nobody counts). An agent never sends one: it does not sync them either.
pub fn check_not_ignored(
    agent: &AgentName,
    resource: &ResourceRef,
    object: &Value,
) -> Result<(), Refusal> {
    let ignored = object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .is_some_and(|l| l.contains_key(IGNORE_SYNC_LABEL));
    if !ignored {
        return Ok(());
    }
    Err(Refusal {
        reason: "Invalid",
        metric: "Invalid",
        message: format!(
            "agent \"{agent}\" sent {resource} labelled {IGNORE_SYNC_LABEL}: objects excluded from sync are not written to the hub"
        ),
    })
}

/// Each agent's writes of the last [`LEDGER_TTL`], laid over what the watch cache holds.
#[derive(Debug, Default)]
pub struct Ledger {
    recent: Mutex<HashMap<AgentName, RecentWrites>>,
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<AgentName, RecentWrites>> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an applied write.
    pub fn record(&self, agent: &AgentName, admitted: Admitted) {
        self.lock()
            .entry(agent.clone())
            .or_default()
            .insert(admitted.key, (admitted.size, Instant::now()));
    }

    /// Lays the agent's recent writes over `holdings` (and forgets the older ones).
    pub fn overlay(&self, agent: &AgentName, holdings: &mut Holdings) {
        let mut recent = self.lock();
        let Some(writes) = recent.get_mut(agent) else {
            return;
        };
        writes.retain(|_, (_, at)| at.elapsed() < LEDGER_TTL);
        for (key, (size, _)) in writes.iter() {
            match size {
                Some(s) => holdings.insert(key.clone(), *s),
                None => holdings.remove(key),
            };
        }
        if writes.is_empty() {
            recent.remove(agent);
        }
    }
}

type RecentWrites = HashMap<HeldKey, (Option<usize>, Instant)>;

/// Whether a hub object was written by some agent (it carries the agent label): only those
/// are kept as stubs when too large to cache.
pub fn agent_written(obj: &DynamicObject) -> bool {
    obj.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(AGENT_NAME_LABEL) && !l.contains_key(IGNORE_SYNC_LABEL))
}

pub(crate) fn labelled_by(obj: &DynamicObject, agent: &AgentName) -> bool {
    obj.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(AGENT_NAME_LABEL))
        .is_some_and(|l| l == agent.as_str())
}

/// Whether a parent's `.status.resources` lists the Application `child` (as Argo CD's
/// controller records the resources of an Application: group `argoproj.io`, kind
/// `Application`, name; the namespace is the spoke's, which the hub does not know).
pub fn tracks_child(parent: &DynamicObject, child: &str) -> bool {
    parent
        .data
        .pointer("/status/resources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| {
            r.get("group").and_then(Value::as_str) == Some(argocd_agent_kubernetes::ARGOPROJ_GROUP)
                && r.get("kind").and_then(Value::as_str) == Some("Application")
                && r.get("name").and_then(Value::as_str) == Some(child)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_domain::Namespace;
    use serde_json::json;

    fn agent() -> AgentName {
        AgentName::new("edge-1").unwrap()
    }

    fn app(name: &str) -> HeldKey {
        (ResourceKind::Application, name.into())
    }

    fn bounds(objects: usize, apps: usize, bytes: u64) -> AgentBounds {
        AgentBounds {
            max_object_size: objects,
            max_applications: apps,
            max_bytes: bytes,
        }
    }

    #[test]
    fn an_object_over_the_size_bound_is_refused_naming_both_sizes() {
        let r = ResourceRef::new(
            ResourceKind::Application,
            Namespace::new("edge-1").unwrap(),
            "big",
        );
        let b = bounds(100, 0, 0);
        assert!(check_object_size(&b, &agent(), &r, 100).is_ok());
        let refused = check_object_size(&b, &agent(), &r, 101).unwrap_err();
        assert_eq!(
            (refused.reason, refused.metric),
            (OBJECT_TOO_LARGE, OBJECT_TOO_LARGE)
        );
        assert!(refused.message.contains("101 bytes"), "{}", refused.message);
        assert!(
            refused.message.contains("at most 100"),
            "{}",
            refused.message
        );
        // 0: no bound.
        assert!(check_object_size(&bounds(0, 0, 0), &agent(), &r, usize::MAX).is_ok());
    }

    #[test]
    fn an_object_excluded_from_sync_is_never_written() {
        let r = ResourceRef::new(
            ResourceKind::Application,
            Namespace::new("edge-1").unwrap(),
            "hidden",
        );
        let hidden = json!({"metadata": {"name": "hidden", "labels": {IGNORE_SYNC_LABEL: "true"}}});
        let refused = check_not_ignored(&agent(), &r, &hidden).unwrap_err();
        assert_eq!((refused.reason, refused.metric), ("Invalid", "Invalid"));
        let plain = json!({"metadata": {"name": "hidden", "labels": {"team": "a"}}});
        assert!(check_not_ignored(&agent(), &r, &plain).is_ok());
    }

    #[test]
    fn a_new_application_over_the_count_is_refused_an_update_is_not() {
        let held: Holdings = [(app("a"), 10), (app("b"), 10)].into();
        let b = bounds(0, 2, 0);
        let r = check_holdings(&b, &agent(), &app("c"), 10, &held).unwrap_err();
        assert_eq!(r.metric, TOO_MANY_APPLICATIONS);
        assert!(r.message.contains("holds 2 Applications"), "{}", r.message);
        assert!(check_holdings(&b, &agent(), &app("a"), 50, &held).is_ok());
        // Projects do not count as Applications.
        let project = (ResourceKind::AppProject, "team".to_owned());
        assert!(check_holdings(&b, &agent(), &project, 10, &held).is_ok());
        assert!(check_holdings(&bounds(0, 3, 0), &agent(), &app("c"), 10, &held).is_ok());
    }

    #[test]
    fn bytes_count_the_replaced_object_once_and_shrinking_is_always_taken() {
        let held: Holdings = [(app("a"), 60), (app("b"), 30)].into();
        let b = bounds(0, 0, 100);
        // 60 + 30 + 10 = 100: at the bound.
        assert!(check_holdings(&b, &agent(), &app("c"), 10, &held).is_ok());
        let r = check_holdings(&b, &agent(), &app("c"), 11, &held).unwrap_err();
        assert_eq!(r.metric, AGENT_BYTES_EXCEEDED);
        assert!(r.message.contains("would make 101"), "{}", r.message);
        // Replacing a: 30 + 70 = 100.
        assert!(check_holdings(&b, &agent(), &app("a"), 70, &held).is_ok());
        assert!(check_holdings(&b, &agent(), &app("a"), 71, &held).is_err());
        // Over the bound already (the bound lowered): shrinking and same-size writes go.
        let over = bounds(0, 0, 50);
        assert!(check_holdings(&over, &agent(), &app("a"), 60, &held).is_ok());
        assert!(check_holdings(&over, &agent(), &app("a"), 61, &held).is_err());
    }

    #[test]
    fn the_ledger_lays_recent_writes_and_deletes_over_the_cache() {
        let ledger = Ledger::default();
        ledger.record(
            &agent(),
            Admitted {
                key: app("new"),
                size: Some(7),
            },
        );
        ledger.record(
            &agent(),
            Admitted {
                key: app("gone"),
                size: None,
            },
        );
        let mut held: Holdings = [(app("gone"), 5), (app("kept"), 3)].into();
        ledger.overlay(&agent(), &mut held);
        assert_eq!(held, [(app("new"), 7), (app("kept"), 3)].into());
        let mut other = Holdings::new();
        ledger.overlay(&AgentName::new("edge-2").unwrap(), &mut other);
        assert!(other.is_empty());
    }

    #[test]
    fn a_parent_tracks_the_applications_its_status_lists() {
        let parent: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "parent"},
            "status": {"resources": [
                {"group": "argoproj.io", "version": "v1alpha1", "kind": "Application",
                 "namespace": "argocd", "name": "child-a"},
                {"group": "", "version": "v1", "kind": "ConfigMap", "namespace": "argocd",
                 "name": "child-b"},
                {"group": "apps", "kind": "Application", "name": "child-c"}
            ]}
        }))
        .unwrap();
        assert!(tracks_child(&parent, "child-a"));
        assert!(!tracks_child(&parent, "child-b"), "another kind");
        assert!(!tracks_child(&parent, "child-c"), "another group");
        assert!(!tracks_child(&parent, "child-d"));
        let bare: DynamicObject =
            serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        assert!(!tracks_child(&bare, "child-a"));
    }
}
