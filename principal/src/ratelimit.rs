//! Per-agent rate limit on inbound write events (`--agent-event-rate`,
//! `--agent-event-burst`): a token bucket per agent, checked before anything touches the
//! hub, so a flood from one agent is refused at once instead of queueing behind the hub's
//! Kubernetes client (whose QPS budget all agents share).
//!
//! Written by hand (a dozen lines of arithmetic) rather than pulling in a rate-limiter
//! crate: the bucket needs an explicit clock for tests and a refusal count for the log.

use std::time::{Duration, Instant};

use argocd_agent_domain::EventType;

/// Default of `--agent-event-rate` (events per second per agent).
pub const DEFAULT_EVENT_RATE: f64 = 20.0;
/// Default of `--agent-event-burst`.
pub const DEFAULT_EVENT_BURST: u32 = 200;
/// Reason of the error event sent for a refused event (as HTTP 429's reason in Kubernetes).
pub const TOO_MANY_REQUESTS: &str = "TooManyRequests";
/// At most one log line per agent per this interval about refused events.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The limit: `rate` events per second with bursts of `burst`; a rate of 0 turns it off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EventRate {
    /// Events per second refilled into the bucket (0, negative or not finite: no limit).
    pub rate: f64,
    /// Size of the bucket: events accepted at once above the rate (0 counts as 1).
    pub burst: u32,
}

impl Default for EventRate {
    fn default() -> Self {
        EventRate {
            rate: DEFAULT_EVENT_RATE,
            burst: DEFAULT_EVENT_BURST,
        }
    }
}

impl EventRate {
    /// No limit.
    pub const UNLIMITED: EventRate = EventRate {
        rate: 0.0,
        burst: 0,
    };

    /// Whether this limit refuses nothing (`rate` is 0, negative or not finite).
    pub fn is_unlimited(&self) -> bool {
        self.rate <= 0.0 || !self.rate.is_finite()
    }
}

/// Whether an event counts against the limit: events that may write to the hub or make it
/// send something (create, spec-update, status-update, delete, request-update, operations).
/// Heartbeats, acknowledgements, errors and answers to the principal's own requests do not.
pub fn is_limited(ty: EventType) -> bool {
    matches!(
        ty,
        EventType::Create
            | EventType::SpecUpdate
            | EventType::StatusUpdate
            | EventType::Delete
            | EventType::RequestUpdate
            | EventType::SetOperation
            | EventType::TerminateOperation
            | EventType::Resync
    )
}

/// What [`EventLimiter::check`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the limit.
    Allowed,
    /// Over the limit.
    Refused {
        /// `Some(n)` when a log line is due now (at most one per second): `n` events were
        /// refused since the last line (this one included).
        log: Option<u64>,
    },
}

/// One agent's bucket. Starts full.
#[derive(Debug)]
pub struct EventLimiter {
    limit: EventRate,
    tokens: f64,
    last: Instant,
    unlogged: u64,
    last_log: Option<Instant>,
}

impl EventLimiter {
    /// A full bucket for `limit`, as of `now`.
    pub fn new(limit: EventRate, now: Instant) -> Self {
        EventLimiter {
            limit,
            tokens: f64::from(limit.burst.max(1)),
            last: now,
            unlogged: 0,
            last_log: None,
        }
    }

    /// The limit this bucket enforces.
    pub fn limit(&self) -> EventRate {
        self.limit
    }

    /// Takes one token for an event arriving at `now`.
    pub fn check(&mut self, now: Instant) -> Verdict {
        if self.limit.is_unlimited() {
            return Verdict::Allowed;
        }
        let burst = f64::from(self.limit.burst.max(1));
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.limit.rate).min(burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Verdict::Allowed;
        }
        self.unlogged += 1;
        let due = self
            .last_log
            .is_none_or(|t| now.saturating_duration_since(t) >= LOG_INTERVAL);
        if due {
            self.last_log = Some(now);
            let n = std::mem::take(&mut self.unlogged);
            Verdict::Refused { log: Some(n) }
        } else {
            Verdict::Refused { log: None }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(rate: f64, burst: u32) -> (EventLimiter, Instant) {
        let t0 = Instant::now();
        (EventLimiter::new(EventRate { rate, burst }, t0), t0)
    }

    fn allowed(v: Verdict) -> bool {
        v == Verdict::Allowed
    }

    #[test]
    fn a_full_bucket_passes_the_burst_then_refuses() {
        let (mut l, t0) = limiter(10.0, 5);
        for i in 0..5 {
            assert!(allowed(l.check(t0)), "event {i} of the burst");
        }
        assert!(!allowed(l.check(t0)));
        assert!(!allowed(l.check(t0)));
    }

    #[test]
    fn tokens_come_back_at_the_rate_and_never_beyond_the_burst() {
        let (mut l, t0) = limiter(10.0, 3);
        for _ in 0..3 {
            assert!(allowed(l.check(t0)));
        }
        assert!(!allowed(l.check(t0)));
        // 100 ms at 10/s: one token.
        let t1 = t0 + Duration::from_millis(100);
        assert!(allowed(l.check(t1)));
        assert!(!allowed(l.check(t1)));
        // A long pause refills to the burst only.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(allowed(l.check(t2)));
        }
        assert!(!allowed(l.check(t2)));
    }

    #[test]
    fn a_steady_flood_passes_at_the_rate() {
        let (mut l, t0) = limiter(50.0, 10);
        // 10,000 events/s for two seconds: the burst plus 50/s pass.
        let passed = (0..20_000u64)
            .filter(|i| allowed(l.check(t0 + Duration::from_micros(100 * i))))
            .count();
        assert!((105..=112).contains(&passed), "passed {passed}");
    }

    #[test]
    fn a_rate_of_zero_is_unlimited() {
        let (mut l, t0) = limiter(0.0, 0);
        assert!((0..100_000).all(|_| allowed(l.check(t0))));
        assert!(EventRate::UNLIMITED.is_unlimited());
        assert!(!EventRate::default().is_unlimited());
    }

    #[test]
    fn a_burst_of_zero_still_passes_one_event_at_a_time() {
        let (mut l, t0) = limiter(1.0, 0);
        assert!(allowed(l.check(t0)));
        assert!(!allowed(l.check(t0)));
        assert!(allowed(l.check(t0 + Duration::from_secs(1))));
    }

    #[test]
    fn refusals_are_logged_at_most_once_a_second_with_their_count() {
        let (mut l, t0) = limiter(1.0, 1);
        assert!(allowed(l.check(t0)));
        assert_eq!(l.check(t0), Verdict::Refused { log: Some(1) });
        for _ in 0..9 {
            assert_eq!(
                l.check(t0 + Duration::from_millis(500)),
                Verdict::Refused { log: None }
            );
        }
        // The token that came back at 1 s is taken; the next refusal logs the 9 + 1.
        let t1 = t0 + Duration::from_millis(1000);
        assert!(allowed(l.check(t1)));
        assert_eq!(l.check(t1), Verdict::Refused { log: Some(10) });
    }

    #[test]
    fn only_events_that_write_or_ask_the_hub_count() {
        for ty in [
            EventType::Create,
            EventType::SpecUpdate,
            EventType::StatusUpdate,
            EventType::Delete,
            EventType::RequestUpdate,
        ] {
            assert!(is_limited(ty), "{ty}");
        }
        for ty in [
            EventType::Ping,
            EventType::Pong,
            EventType::Processed,
            EventType::Error,
            EventType::ResourceResponse,
            EventType::RedisResponse,
        ] {
            assert!(!is_limited(ty), "{ty}");
        }
    }
}
