//! The per-peer outbound queue: keyed by resource, at most one unacknowledged event per
//! resource and lane, newer updates replace queued older ones, a delete clears queued
//! updates, and unacknowledged events are resent with backoff until a `processed` event
//! names them.
//!
//! Resends adapt to the peer: the stream is reliable (HTTP/2 over TCP), so an event is only
//! lost if the peer dropped it or the connection broke (a reconnect requeues everything in
//! flight). The first resend waits the larger of `resend_initial` and a timeout learned from
//! acknowledgement round trips (SRTT + 4·RTTVAR, as TCP's RTO; samples of resent events are
//! not used). When that time has passed, the event is resent only if the peer skipped it
//! (an event sent after it was acknowledged) or went quiet (no acknowledgement within one
//! timeout); a peer that is still acknowledging older work is merely slow, and resending to
//! it would only double the traffic it is already behind on.
//!
//! Before a queue has a round trip of its own, it starts from [`SharedRtt`]: the estimate
//! from the acknowledgements of every peer the process serves (as Linux seeds a new TCP
//! connection's RTO from the metrics it cached for the route). A storm that slows every
//! peer down then lengthens the first timeout of the sessions that start during it, instead
//! of resending their first events to peers that are merely slow.
//!
//! Memory is bounded by `max_pending` keys (one event per key) plus `max_in_flight` events;
//! payloads are `Arc`s, so resending never copies an object.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::event::{Event, EventType, ResourceRef};

/// Independent streams of changes for one resource: an object change never replaces a
/// queued status change and vice versa.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// create, spec-update, delete
    Object,
    /// status-update
    Status,
    /// set-operation
    Operation,
    /// terminate-operation (its own lane: a terminate request neither replaces nor is
    /// replaced by an operation set after or before it)
    Terminate,
}

impl Lane {
    /// The lane of an event type (`None` for events that are not queued).
    pub fn of(ty: EventType) -> Option<Lane> {
        match ty {
            EventType::Create | EventType::SpecUpdate | EventType::Delete => Some(Lane::Object),
            EventType::StatusUpdate => Some(Lane::Status),
            EventType::SetOperation => Some(Lane::Operation),
            EventType::TerminateOperation => Some(Lane::Terminate),
            _ => None,
        }
    }
}

/// Key of a queued event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueKey {
    /// The object the event is about.
    pub resource: ResourceRef,
    /// Which of the object's change streams it belongs to.
    pub lane: Lane,
}

/// Limits of one queue.
#[derive(Debug, Clone)]
pub struct QueueLimits {
    /// Distinct resource keys waiting to be sent.
    pub max_pending: usize,
    /// Events sent and not yet acknowledged.
    pub max_in_flight: usize,
    /// First resend delay; doubles up to `resend_max`.
    pub resend_initial: Duration,
    /// Longest resend delay.
    pub resend_max: Duration,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            max_pending: 100_000,
            max_in_flight: 256,
            resend_initial: Duration::from_secs(2),
            resend_max: Duration::from_secs(60),
        }
    }
}

/// Why an event could not be queued.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    /// `max_pending` distinct keys are already waiting; the event was dropped (the next
    /// resync repairs it).
    #[error(
        "queue full ({max} resources pending): dropped {ty} for {resource}; resync will repair it"
    )]
    Full {
        /// The queue's `max_pending`.
        max: usize,
        /// Type of the dropped event.
        ty: EventType,
        /// Object of the dropped event.
        resource: ResourceRef,
    },
    /// Only resource events with a [`Lane`] are queued; this type has none.
    #[error("event type {0} is not a queued resource event")]
    NotQueued(EventType),
}

#[derive(Debug)]
struct InFlight {
    event: Event,
    deadline: Instant,
    attempts: u32,
    /// Send order (first send), to tell a skipped event from a slow peer.
    seq: u64,
    /// When it was first sent (for the round-trip estimate).
    sent: Instant,
    /// The peer asked for it again later ([`SendQueue::retry_later`]): resent at the
    /// deadline even while the peer acknowledges other events.
    retry: bool,
}

/// Round-trip estimate from acknowledgements (RFC 6298's SRTT and RTTVAR).
#[derive(Debug, Default, Clone, Copy)]
struct Rtt {
    srtt: Option<Duration>,
    rttvar: Duration,
}

impl Rtt {
    fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                let diff = srtt.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((srtt * 7 + r) / 8);
            }
        }
    }

    fn timeout(&self) -> Option<Duration> {
        self.srtt.map(|s| s + self.rttvar * 4)
    }
}

/// A round-trip estimate shared by the queues of one process (one principal's agents):
/// fed by every queue's unambiguous samples, read by a queue that has none of its own yet.
#[derive(Debug, Default)]
pub struct SharedRtt(Mutex<Rtt>);

impl SharedRtt {
    /// An estimate with no sample yet.
    pub fn new() -> Arc<SharedRtt> {
        Arc::new(SharedRtt::default())
    }

    fn sample(&self, r: Duration) {
        crate::sync::lock(&self.0).sample(r);
    }

    /// SRTT + 4·RTTVAR over every peer's samples so far (`None` before the first); a queue
    /// starting from it still waits at least its `resend_initial`.
    pub fn timeout(&self) -> Option<Duration> {
        crate::sync::lock(&self.0).timeout()
    }
}

#[derive(Debug, Default)]
struct State {
    pending: HashMap<QueueKey, Event>,
    order: VecDeque<QueueKey>,
    in_flight: HashMap<QueueKey, InFlight>,
    ids: HashMap<String, QueueKey>,
    next_seq: u64,
    /// Highest send order acknowledged.
    acked_seq: Option<u64>,
    last_ack: Option<Instant>,
    rtt: Rtt,
    /// `rtt` holds only the round trip of the session's handshake, no acknowledgement yet
    /// ([`SendQueue::handshake_round_trip`]).
    handshake_only: bool,
}

/// Outbound queue towards one peer. Shared between the producers (watch handlers) and the
/// session's writer task.
#[derive(Debug)]
pub struct SendQueue {
    state: Mutex<State>,
    notify: Notify,
    limits: QueueLimits,
    resends: std::sync::atomic::AtomicU64,
    shared: Option<Arc<SharedRtt>>,
}

impl SendQueue {
    /// An empty queue bounded by `limits`.
    pub fn new(limits: QueueLimits) -> SendQueue {
        SendQueue {
            state: Mutex::new(State::default()),
            notify: Notify::new(),
            limits,
            resends: std::sync::atomic::AtomicU64::new(0),
            shared: None,
        }
    }

    /// An empty queue bounded by `limits` that starts from `shared` until it has measured
    /// its own peer, and adds its samples to it.
    pub fn sharing(limits: QueueLimits, shared: Arc<SharedRtt>) -> SendQueue {
        SendQueue {
            shared: Some(shared),
            ..SendQueue::new(limits)
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means another task panicked mid-update; the maps stay usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a resource event. A newer event for the same resource and lane replaces a queued
    /// older one; a delete also drops queued status and operation events of that resource.
    pub fn push(&self, event: Event) -> Result<(), QueueError> {
        let lane = Lane::of(event.ty).ok_or(QueueError::NotQueued(event.ty))?;
        let Some(resource) = event.resource.clone() else {
            return Err(QueueError::NotQueued(event.ty));
        };
        let mut st = self.lock();
        if event.ty == EventType::Delete {
            for other in [Lane::Status, Lane::Operation, Lane::Terminate] {
                let k = QueueKey {
                    resource: resource.clone(),
                    lane: other,
                };
                if st.pending.remove(&k).is_some() {
                    st.order.retain(|o| o != &k);
                }
            }
        }
        let key = QueueKey { resource, lane };
        if let Some(slot) = st.pending.get_mut(&key) {
            *slot = event;
        } else {
            if st.pending.len() >= self.limits.max_pending {
                return Err(QueueError::Full {
                    max: self.limits.max_pending,
                    ty: event.ty,
                    resource: key.resource,
                });
            }
            st.pending.insert(key.clone(), event);
            st.order.push_back(key);
        }
        drop(st);
        self.notify.notify_one();
        Ok(())
    }

    /// Marks the event with this id as delivered. Returns its key and the event delivered
    /// if it was in flight.
    pub fn ack(&self, id: &str) -> Option<(QueueKey, Event)> {
        let mut st = self.lock();
        let key = st.ids.remove(id)?;
        let f = st.in_flight.remove(&key)?;
        let now = Instant::now();
        // Karn's rule: the ack of a resent event may answer either send, so it is no sample.
        let sample = (f.attempts == 0).then(|| now.saturating_duration_since(f.sent));
        if let Some(r) = sample {
            st.rtt.sample(r);
            st.handshake_only = false;
        }
        st.acked_seq = Some(st.acked_seq.map_or(f.seq, |a| a.max(f.seq)));
        st.last_ack = Some(now);
        drop(st);
        if let (Some(r), Some(shared)) = (sample, &self.shared) {
            shared.sample(r);
        }
        self.notify.notify_one();
        Some((key, f.event))
    }

    /// The peer refused the event with this id for now (rate limited): it is sent again
    /// after the backoff of its attempts so far (the first wait is the resend timeout, then
    /// doubling with each resend up to `resend_max`), unless a newer
    /// event for the same resource is already queued, which then replaces it. Never
    /// dropped: the change is delivered once the peer accepts it. Returns whether the id
    /// was in flight.
    pub fn retry_later(&self, id: &str) -> bool {
        let mut st = self.lock();
        let Some(key) = st.ids.get(id).cloned() else {
            return false;
        };
        if st.pending.contains_key(&key) {
            // Superseded: the queued newer event goes out instead (one in flight per key).
            st.ids.remove(id);
            st.in_flight.remove(&key);
            drop(st);
            self.notify.notify_one();
            return true;
        }
        let attempts = st.in_flight.get(&key).map_or(0, |f| f.attempts);
        let deadline = Instant::now() + self.backoff(&st, attempts);
        if let Some(f) = st.in_flight.get_mut(&key) {
            // The resend at the deadline counts an attempt, so repeated refusals back off.
            f.deadline = deadline;
            f.retry = true;
        }
        drop(st);
        self.notify.notify_one();
        true
    }

    /// After a reconnect: everything in flight is sent again (unless a newer event for the
    /// same key is already queued), in front of the rest.
    pub fn requeue_in_flight(&self) {
        let mut st = self.lock();
        let in_flight: Vec<_> = st.in_flight.drain().collect();
        st.ids.clear();
        for (key, f) in in_flight {
            if !st.pending.contains_key(&key) {
                st.pending.insert(key.clone(), f.event);
                st.order.push_front(key);
            }
        }
        drop(st);
        self.notify.notify_one();
    }

    /// Drops every queued and unacknowledged event (the peer is served elsewhere now, and
    /// its next session here starts with a resync); returns how many were dropped. The
    /// learned round-trip time stays.
    pub fn clear(&self) -> usize {
        let mut st = self.lock();
        let dropped = st.pending.len() + st.in_flight.len();
        st.pending.clear();
        st.order.clear();
        st.in_flight.clear();
        st.ids.clear();
        dropped
    }

    /// Number of queued plus unacknowledged events.
    pub fn len(&self) -> usize {
        let st = self.lock();
        st.pending.len() + st.in_flight.len()
    }

    /// Whether nothing is queued or unacknowledged.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Events sent again because no acknowledgement came in time, since the queue was made.
    pub fn resends(&self) -> u64 {
        self.resends.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Unacknowledged events.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight.len()
    }

    /// The resend timeout before the first resend: `resend_initial`, or the learned one
    /// (this peer's, or before it has any, the shared one) when that is longer.
    fn base_timeout(&self, st: &State) -> Duration {
        let shared = || self.shared.as_ref().and_then(|s| s.timeout());
        let learned = match st.rtt.timeout() {
            // Until the peer's first acknowledgement, a quick handshake does not shorten
            // what the other peers' acknowledgements say a round trip takes now.
            Some(own) if st.handshake_only => Some(shared().map_or(own, |s| s.max(own))),
            Some(own) => Some(own),
            None => shared(),
        };
        learned
            .map_or(self.limits.resend_initial, |t| {
                t.max(self.limits.resend_initial)
            })
            .min(self.limits.resend_max)
    }

    fn backoff(&self, st: &State, attempts: u32) -> Duration {
        let factor = 1u32.checked_shl(attempts.min(16)).unwrap_or(u32::MAX);
        self.base_timeout(st)
            .saturating_mul(factor)
            .min(self.limits.resend_max)
    }

    /// A new session to the peer completed its handshake in `r`: its first round trip, the
    /// peer's own work included. The estimate starts over from it, as TCP's starts from the
    /// round trip of its SYN: a peer that took seconds to complete its handshake (a
    /// saturated fleet redialing) is not resent its first events after the floor while it
    /// is merely slow. Until the peer acknowledges an event, the timeout is also at least
    /// the one the other peers' acknowledgements give ([`SharedRtt`]). Not shared: only
    /// acknowledgements feed [`SharedRtt`].
    pub fn handshake_round_trip(&self, r: Duration) {
        let mut st = self.lock();
        st.rtt = Rtt::default();
        st.rtt.sample(r);
        st.handshake_only = true;
    }

    /// The current resend timeout (what an event sent now would wait before a resend).
    pub fn resend_timeout(&self) -> Duration {
        let st = self.lock();
        self.base_timeout(&st)
    }

    /// The next event to send now, or the instant at which one becomes due.
    fn poll_next(&self, now: Instant) -> Result<Event, Option<Instant>> {
        let mut st = self.lock();
        // Resends first: they are the oldest work.
        let mut earliest: Option<Instant> = None;
        let mut due: Option<QueueKey> = None;
        for (k, f) in &st.in_flight {
            if f.deadline <= now {
                due = Some(k.clone());
                break;
            }
            earliest = Some(earliest.map_or(f.deadline, |e| e.min(f.deadline)));
        }
        if let Some(k) = due {
            let timeout = self.base_timeout(&st);
            let (seq, attempts) = st.in_flight.get(&k).map_or((0, 0), |f| (f.seq, f.attempts));
            let skipped = st.acked_seq.is_some_and(|a| a > seq);
            let progressing = st
                .last_ack
                .is_some_and(|t| now.saturating_duration_since(t) < timeout);
            let retry = st.in_flight.get(&k).is_some_and(|f| f.retry);
            if !skipped && progressing && !retry {
                // The peer is working through older events: wait another timeout.
                if let Some(f) = st.in_flight.get_mut(&k) {
                    f.deadline = now + timeout;
                }
                drop(st);
                return self.poll_next(now);
            }
            let attempts = attempts + 1;
            let deadline = now + self.backoff(&st, attempts);
            if let Some(f) = st.in_flight.get_mut(&k) {
                f.attempts = attempts;
                f.deadline = deadline;
                f.retry = false;
                self.resends
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(f.event.clone());
            }
        }
        if st.in_flight.len() < self.limits.max_in_flight {
            let pos = {
                let in_flight = &st.in_flight;
                st.order.iter().position(|k| !in_flight.contains_key(k))
            };
            if let Some(pos) = pos
                && let Some(key) = st.order.remove(pos)
                && let Some(event) = st.pending.remove(&key)
            {
                let deadline = now + self.backoff(&st, 0);
                let seq = st.next_seq;
                st.next_seq += 1;
                st.ids.insert(event.id.clone(), key.clone());
                st.in_flight.insert(
                    key,
                    InFlight {
                        event: event.clone(),
                        deadline,
                        attempts: 0,
                        seq,
                        sent: now,
                        retry: false,
                    },
                );
                return Ok(event);
            }
        }
        Err(earliest)
    }

    /// Waits for the next event to send (new, or due for resend). Cancel-safe.
    pub async fn next(&self) -> Event {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The poll's result is out of scope before the waits: held across them (a
            // match on it would be), its room for an event would be part of every idle
            // session's future.
            let due = match self.poll_next(Instant::now()) {
                Ok(e) => return e,
                Err(due) => due,
            };
            match due {
                Some(deadline) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Payload, ResourceKind};
    use serde_json::json;
    use std::sync::Arc;

    fn ev(ty: EventType, name: &str, v: i64) -> Event {
        Event::resource(
            "test",
            ty,
            ResourceRef {
                kind: ResourceKind::Application,
                namespace: crate::Namespace::new("ns").unwrap(),
                name: name.into(),
            },
            Payload::Object(Arc::new(json!({"v": v}))),
        )
    }

    fn q() -> SendQueue {
        SendQueue::new(QueueLimits {
            max_pending: 3,
            max_in_flight: 10,
            resend_initial: Duration::from_millis(50),
            resend_max: Duration::from_millis(200),
        })
    }

    /// An idle session waits in `next` for as long as it lives: the wait holds no room
    /// for an event (a match on the poll's result would keep it across the wait).
    #[test]
    fn waiting_for_the_next_event_holds_no_event() {
        let q = q();
        let waiting = q.next();
        assert!(
            std::mem::size_of_val(&waiting) < std::mem::size_of::<Event>(),
            "{} bytes waiting, an event is {}",
            std::mem::size_of_val(&waiting),
            std::mem::size_of::<Event>()
        );
    }

    fn val(e: &Event) -> i64 {
        e.object().and_then(|o| o["v"].as_i64()).unwrap()
    }

    #[tokio::test]
    async fn newer_update_replaces_queued_older_one() {
        let q = q();
        q.push(ev(EventType::SpecUpdate, "a", 1)).unwrap();
        q.push(ev(EventType::SpecUpdate, "a", 2)).unwrap();
        assert_eq!(q.len(), 1);
        assert_eq!(val(&q.next().await), 2);
    }

    #[tokio::test]
    async fn at_most_one_unacknowledged_event_per_resource() {
        let q = q();
        q.push(ev(EventType::SpecUpdate, "a", 1)).unwrap();
        let first = q.next().await;
        q.push(ev(EventType::SpecUpdate, "a", 2)).unwrap();
        q.push(ev(EventType::SpecUpdate, "b", 3)).unwrap();
        // "a" is in flight, so "b" comes next even though "a" was queued first.
        assert_eq!(val(&q.next().await), 3);
        assert!(q.ack(&first.id).is_some());
        assert_eq!(val(&q.next().await), 2);
    }

    #[tokio::test]
    async fn delete_clears_queued_status_updates() {
        let q = q();
        q.push(ev(EventType::StatusUpdate, "a", 1)).unwrap();
        q.push(ev(EventType::Delete, "a", 2)).unwrap();
        assert_eq!(q.len(), 1);
        assert_eq!(q.next().await.ty, EventType::Delete);
    }

    #[tokio::test]
    async fn status_and_spec_lanes_do_not_replace_each_other() {
        let q = q();
        q.push(ev(EventType::SpecUpdate, "a", 1)).unwrap();
        q.push(ev(EventType::StatusUpdate, "a", 2)).unwrap();
        assert_eq!(q.len(), 2);
    }

    #[tokio::test]
    async fn unacknowledged_event_is_resent_with_the_same_id() {
        let q = q();
        q.push(ev(EventType::Create, "a", 1)).unwrap();
        let first = q.next().await;
        let again = tokio::time::timeout(Duration::from_secs(2), q.next())
            .await
            .unwrap();
        assert_eq!(first.id, again.id);
        assert_eq!(q.resends(), 1);
        q.ack(&first.id);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_peer_that_keeps_acknowledging_older_events_gets_no_resends() {
        let q = Arc::new(q());
        for n in ["a", "b", "c"] {
            q.push(ev(EventType::SpecUpdate, n, 1)).unwrap();
        }
        let a = q.next().await;
        let b = q.next().await;
        let c = q.next().await;
        // The writer keeps asking for work, as a session does.
        let writer = {
            let q = q.clone();
            tokio::spawn(async move {
                loop {
                    q.next().await;
                }
            })
        };
        // The peer acknowledges one event every 40 ms (each resend timeout is 50 ms, so "b"
        // and "c" are past it before their acknowledgements come).
        for e in [&a, &b, &c] {
            tokio::time::sleep(Duration::from_millis(40)).await;
            assert!(q.ack(&e.id).is_some());
        }
        writer.abort();
        assert_eq!(q.resends(), 0, "a slow but working peer was resent to");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_limited_event_is_resent_later_with_backoff_even_while_others_are_acked() {
        let q = Arc::new(q());
        for n in ["a", "b"] {
            q.push(ev(EventType::SpecUpdate, n, 1)).unwrap();
        }
        let a = q.next().await;
        let b = q.next().await;
        let t0 = Instant::now();
        // "a" is refused for now; "b" is acknowledged (the peer is progressing, which would
        // hold back an ordinary resend).
        assert!(q.retry_later(&a.id));
        assert!(q.ack(&b.id).is_some());
        let again = q.next().await;
        assert_eq!(again.id, a.id, "the refused event, not dropped");
        let first_wait = t0.elapsed();
        assert!(
            first_wait >= Duration::from_millis(50) && first_wait < Duration::from_millis(100),
            "{first_wait:?}"
        );
        // Refused again: the next wait doubles.
        let t1 = Instant::now();
        assert!(q.retry_later(&a.id));
        let third = q.next().await;
        assert_eq!(third.id, a.id);
        assert!(
            t1.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t1.elapsed()
        );
        assert!(q.ack(&a.id).is_some());
        assert!(q.is_empty());
        assert!(!q.retry_later("unknown"), "an id not in flight");
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_limited_event_superseded_by_a_queued_newer_one_gives_way_to_it() {
        let q = q();
        q.push(ev(EventType::SpecUpdate, "a", 1)).unwrap();
        let first = q.next().await;
        q.push(ev(EventType::SpecUpdate, "a", 2)).unwrap();
        assert!(q.retry_later(&first.id));
        let next = tokio::time::timeout(Duration::from_millis(10), q.next())
            .await
            .expect("the newer event goes out at once");
        assert_eq!(val(&next), 2);
        assert_ne!(next.id, first.id);
        assert_eq!(q.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_the_peer_skipped_is_resent() {
        let q = q();
        q.push(ev(EventType::SpecUpdate, "a", 1)).unwrap();
        q.push(ev(EventType::SpecUpdate, "b", 1)).unwrap();
        let a = q.next().await;
        let b = q.next().await;
        // "b" (sent after "a") is acknowledged, "a" never is: "a" was dropped.
        q.ack(&b.id);
        let again = tokio::time::timeout(Duration::from_secs(1), q.next())
            .await
            .unwrap();
        assert_eq!(again.id, a.id);
        assert_eq!(q.resends(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_resend_timeout_follows_a_slow_peer_round_trip() {
        let q = q();
        assert_eq!(q.resend_timeout(), Duration::from_millis(50));
        for i in 0..8 {
            q.push(ev(EventType::SpecUpdate, "a", i)).unwrap();
            let e = q.next().await;
            tokio::time::advance(Duration::from_millis(120)).await;
            q.ack(&e.id);
        }
        // Learned from 120 ms round trips, capped at resend_max (200 ms).
        let t = q.resend_timeout();
        assert!(t > Duration::from_millis(120), "{t:?}");
        assert!(t <= Duration::from_millis(200), "{t:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_slow_to_complete_its_handshake_is_not_resent_its_first_event() {
        let limits = || QueueLimits {
            resend_max: Duration::from_secs(60),
            ..q().limits
        };
        // The session's TLS handshake took 400 ms (a saturated peer): its first event is
        // not resent at the 50 ms floor while the peer takes 600 ms to answer it.
        let slow = SendQueue::sharing(limits(), SharedRtt::new());
        slow.handshake_round_trip(Duration::from_millis(400));
        assert!(slow.resend_timeout() >= Duration::from_millis(1200));
        slow.push(ev(EventType::SpecUpdate, "a", 1)).unwrap();
        let e = slow.next().await;
        let resent = tokio::time::timeout(Duration::from_millis(600), slow.next()).await;
        assert!(resent.is_err(), "resent to a peer as slow as its handshake");
        slow.ack(&e.id);
        assert_eq!(slow.resends(), 0);
        // Without the handshake's round trip the same peer is resent to at the floor.
        let unseeded = SendQueue::sharing(limits(), SharedRtt::new());
        unseeded.push(ev(EventType::SpecUpdate, "a", 1)).unwrap();
        let e = unseeded.next().await;
        let again = tokio::time::timeout(Duration::from_millis(600), unseeded.next()).await;
        assert_eq!(again.expect("resent").id, e.id);
        // A quick handshake does not shorten what the others' acknowledgements say, until
        // the peer's own first acknowledgement.
        let shared = SharedRtt::new();
        let other = SendQueue::sharing(limits(), shared.clone());
        for i in 0..8 {
            other.push(ev(EventType::SpecUpdate, "b", i)).unwrap();
            let e = other.next().await;
            tokio::time::advance(Duration::from_millis(300)).await;
            other.ack(&e.id);
        }
        let quick = SendQueue::sharing(limits(), shared);
        quick.handshake_round_trip(Duration::from_millis(5));
        assert!(quick.resend_timeout() > Duration::from_millis(300));
        for i in 0..8 {
            quick.push(ev(EventType::SpecUpdate, "c", i)).unwrap();
            let e = quick.next().await;
            tokio::time::advance(Duration::from_millis(5)).await;
            quick.ack(&e.id);
        }
        assert_eq!(quick.resend_timeout(), Duration::from_millis(50));
        // A new session starts over from its own handshake.
        quick.handshake_round_trip(Duration::from_secs(1));
        assert!(quick.resend_timeout() >= Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_peer_starts_from_the_round_trips_of_the_others() {
        let limits = || QueueLimits {
            resend_max: Duration::from_secs(60),
            ..q().limits
        };
        let shared = SharedRtt::new();
        // Every peer answers in 120 ms (the machine is busy): one peer's queue learns it.
        let first = SendQueue::sharing(limits(), shared.clone());
        for i in 0..8 {
            first.push(ev(EventType::SpecUpdate, "a", i)).unwrap();
            let e = first.next().await;
            tokio::time::advance(Duration::from_millis(120)).await;
            first.ack(&e.id);
        }
        // A peer whose session starts now has no sample of its own: its first event is not
        // resent before the others' timeout, so its 120 ms answer comes first.
        let new = SendQueue::sharing(limits(), shared.clone());
        assert!(new.resend_timeout() > Duration::from_millis(120));
        new.push(ev(EventType::SpecUpdate, "b", 1)).unwrap();
        let e = new.next().await;
        let resent = tokio::time::timeout(Duration::from_millis(120), new.next()).await;
        assert!(
            resent.is_err(),
            "resent to a peer as slow as all the others"
        );
        new.ack(&e.id);
        assert_eq!(new.resends(), 0);
        // Without the shared estimate the same peer is resent to at 50 ms.
        let alone = SendQueue::new(limits());
        alone.push(ev(EventType::SpecUpdate, "b", 1)).unwrap();
        let e = alone.next().await;
        let again = tokio::time::timeout(Duration::from_millis(120), alone.next()).await;
        assert_eq!(again.expect("resent").id, e.id);
        // Its own samples then win over the shared ones: a fast peer stays fast.
        let fast = SendQueue::sharing(limits(), shared);
        for i in 0..8 {
            fast.push(ev(EventType::SpecUpdate, "c", i)).unwrap();
            let e = fast.next().await;
            tokio::time::advance(Duration::from_millis(5)).await;
            fast.ack(&e.id);
        }
        assert_eq!(fast.resend_timeout(), Duration::from_millis(50));
    }

    #[tokio::test]
    async fn full_queue_refuses_new_keys_but_accepts_replacements() {
        let q = q();
        for n in ["a", "b", "c"] {
            q.push(ev(EventType::SpecUpdate, n, 1)).unwrap();
        }
        assert!(matches!(
            q.push(ev(EventType::SpecUpdate, "d", 1)),
            Err(QueueError::Full { .. })
        ));
        q.push(ev(EventType::SpecUpdate, "a", 9)).unwrap();
    }

    #[tokio::test]
    async fn reconnect_requeues_in_flight_unless_newer_is_queued() {
        let q = q();
        q.push(ev(EventType::SpecUpdate, "a", 1)).unwrap();
        q.push(ev(EventType::SpecUpdate, "b", 1)).unwrap();
        let _ = q.next().await;
        let _ = q.next().await;
        q.push(ev(EventType::SpecUpdate, "a", 2)).unwrap();
        q.requeue_in_flight();
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.len(), 2);
        let mut vals = vec![val(&q.next().await), val(&q.next().await)];
        vals.sort();
        assert_eq!(vals, vec![1, 2]);
    }

    #[tokio::test]
    async fn clear_drops_queued_and_in_flight_and_the_queue_works_after() {
        let q = q();
        q.push(ev(EventType::SpecUpdate, "a", 1)).unwrap();
        q.push(ev(EventType::SpecUpdate, "b", 1)).unwrap();
        let sent = q.next().await;
        assert_eq!(q.clear(), 2);
        assert!(q.is_empty());
        // The id of what was in flight is no longer known: its ack changes nothing.
        assert!(q.ack(&sent.id).is_none());
        q.requeue_in_flight();
        assert!(q.is_empty());
        q.push(ev(EventType::SpecUpdate, "c", 3)).unwrap();
        assert_eq!(val(&q.next().await), 3);
    }

    #[tokio::test]
    async fn non_resource_events_are_not_queued() {
        let q = q();
        assert!(matches!(
            q.push(Event::new("x", EventType::Ping, Payload::None)),
            Err(QueueError::NotQueued(_))
        ));
    }
}
