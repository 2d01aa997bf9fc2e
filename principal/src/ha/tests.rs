use std::collections::HashMap;
use std::time::Duration;

use argocd_agent_domain::AgentName;
use argocd_agent_kubernetes::Kind;
use kube::api::DynamicObject;
use tokio::time::Instant;

use super::rebalance::newest_sessions;
use super::state::{Held, now_micro, set_annotation, set_spec};
use super::*;

#[test]
fn rebalancing_sheds_the_newest_sessions_and_never_one_being_handed_over() {
    let held = |session: u64, handover: bool| Held {
        session,
        rv: 0,
        next_renew: Instant::now(),
        handover_to: handover.then(|| "principal-1".to_string()),
    };
    let agent = |a: &str| AgentName::new(a).unwrap();
    let map: HashMap<AgentName, Held> = [
        (agent("old"), held(3, false)),
        (agent("newest"), held(40, true)),
        (agent("new"), held(17, false)),
        (agent("middle"), held(9, false)),
    ]
    .into_iter()
    .collect();
    assert_eq!(newest_sessions(&map, 2), [agent("new"), agent("middle")]);
    assert_eq!(
        newest_sessions(&map, 10),
        [agent("new"), agent("middle"), agent("old")]
    );
    assert!(newest_sessions(&map, 0).is_empty());
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn fair_share_and_excess() {
    let live = ids(&["a_1", "b_1", "c_1"]);
    // After a failover: a and b hold three each, c (restarted) none.
    let holders = ids(&["a_1", "a_1", "a_1", "b_1", "b_1", "b_1", "dead_0"]);
    let s = Shares::compute(&live, holders.into_iter());
    assert_eq!(
        s.fair, 2,
        "six agents on three live replicas (the dead one's lease ignored)"
    );
    assert_eq!(s.excess("a_1", 0), 1);
    assert_eq!(s.excess("a_1", 1), 0, "slack tolerates one above");
    assert_eq!(s.excess("c_1", 0), 0);
    assert!(s.someone_below("a_1"));
    // Balanced: nobody sheds.
    let s = Shares::compute(
        &live,
        ids(&["a_1", "a_1", "b_1", "b_1", "c_1", "c_1"]).into_iter(),
    );
    assert_eq!(s.excess("a_1", 0), 0);
    assert!(!s.someone_below("a_1"));
    // Everyone above: nobody has room, nobody sheds.
    let s = Shares::compute(
        &ids(&["a_1", "b_1"]),
        ids(&["a_1", "a_1", "a_1", "b_1", "b_1", "b_1"]).into_iter(),
    );
    assert_eq!(s.excess("a_1", 0), 0);
}

#[test]
fn replica_of_holder_identity() {
    assert_eq!(replica_of("principal-0_1a2b3c4d"), "principal-0");
    assert_eq!(replica_of("plain"), "plain");
}

#[test]
fn lease_spec_round_trip() {
    let mut obj = DynamicObject::new("x", &Kind::Lease.api_resource()).within("argocd");
    set_spec(&mut obj, |s| {
        s.holder_identity = Some("r_1".into());
        s.renew_time = Some(now_micro());
        s.lease_duration_seconds = Some(10);
        s.lease_transitions = Some(3);
    });
    set_annotation(&mut obj, TAKEOVER_ANNOTATION, Some("s_2"));
    obj.metadata.resource_version = Some("42".into());
    let v = LeaseView::of(&obj);
    assert_eq!(v.holder.as_deref(), Some("r_1"));
    assert_eq!(v.duration, Some(Duration::from_secs(10)));
    assert_eq!(v.transitions, 3);
    assert_eq!(v.takeover.as_deref(), Some("s_2"));
    assert_eq!(v.resource_version, Some(42));
    let now = jiff::Timestamp::now();
    assert!(!v.expired(now, Duration::ZERO));
    let later = now
        .checked_add(jiff::SignedDuration::from_secs(11))
        .unwrap();
    assert!(v.expired(later, Duration::ZERO));
    assert!(!v.expired(later, Duration::from_secs(5)), "skew tolerated");
    // A released lease has no holder and is free.
    set_spec(&mut obj, |s| s.holder_identity = None);
    assert_eq!(LeaseView::of(&obj).holder, None);
}

#[test]
fn config_validation() {
    assert!(HaConfig::new("principal-0").validate().is_ok());
    assert!(HaConfig::new("Principal_0").validate().is_err());
    assert!(HaConfig::new("").validate().is_err());
    let mut c = HaConfig::new("p");
    c.agent_lease_duration = Duration::from_secs(1);
    assert!(c.validate().is_err());
    assert!(!default_replica_id().is_empty());
}
