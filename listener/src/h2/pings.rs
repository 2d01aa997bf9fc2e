//! The minimum interval between a client's HTTP/2 PINGs (gRPC's keepalive enforcement
//! policy, the principal's `--keepalive-min-interval`).
//!
//! The rule gRPC servers apply: a PING that comes sooner than the minimum after the previous
//! one is a strike; a strike count above [`MAX_PING_STRIKES`] gets the connection a GOAWAY
//! with `ENHANCE_YOUR_CALM` and the debug data `too_many_pings`, then it is closed. A DATA or
//! HEADERS frame the server sends forgives the strikes (the next PING is not counted), as a
//! PING after real traffic is not abuse (gRPC-Go's `resetPingStrikes`, set on every data and
//! header write, checked in `handlePing`).
//!
//! Unlike gRPC-Go, that forgiveness is granted at most once per minimum interval. A server
//! that answers what its client sends (the principal answers every `ping` event with a
//! `pong`, and acknowledges events) would, under gRPC-Go's rule alone, forgive every PING of
//! a client alternating an event with a PING, and the client could ping without limit. With
//! the budget such a client strikes from its second PING in an interval. Pings of a
//! connection without streams are held to the same minimum (gRPC-Go holds them to two hours
//! unless told otherwise); an agent always has its event stream open.

use std::time::{Duration, Instant};

/// Strikes tolerated before the connection is closed (gRPC's value).
pub const MAX_PING_STRIKES: u32 = 2;

/// The debug data of the GOAWAY (what gRPC clients recognise to slow their pings down).
pub const TOO_MANY_PINGS: &[u8] = b"too_many_pings";

/// The strike count of one connection.
#[derive(Debug)]
pub(super) struct Strikes {
    pub min_interval: Duration,
    last_ping: Option<Instant>,
    pub strikes: u32,
    /// The server sent DATA or HEADERS since the last PING.
    pub forgiven: bool,
    /// When a PING was last forgiven (at most one per `min_interval`).
    last_forgiven: Option<Instant>,
}

impl Strikes {
    pub fn new(min_interval: Duration) -> Strikes {
        Strikes {
            min_interval,
            last_ping: None,
            strikes: 0,
            forgiven: false,
            last_forgiven: None,
        }
    }

    /// Counts a PING received at `now`; true once the connection has too many strikes.
    pub fn ping(&mut self, now: Instant) -> bool {
        let last = self.last_ping.replace(now);
        let budget = self
            .last_forgiven
            .is_none_or(|at| now.saturating_duration_since(at) >= self.min_interval);
        if std::mem::take(&mut self.forgiven) && budget {
            self.last_forgiven = Some(now);
            self.strikes = 0;
            return false;
        }
        if last.is_some_and(|last| now.saturating_duration_since(last) < self.min_interval) {
            self.strikes += 1;
        }
        self.strikes > MAX_PING_STRIKES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strikes_follow_the_grpc_rule() {
        let t0 = Instant::now();
        let mut s = Strikes::new(Duration::from_secs(10));
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        // Spaced pings never strike.
        assert!(!s.ping(at(0)));
        assert!(!s.ping(at(10)));
        assert!(!s.ping(at(25)));
        assert_eq!(s.strikes, 0);
        // Two quick ones are tolerated, the third closes.
        assert!(!s.ping(at(26)));
        assert!(!s.ping(at(27)));
        assert!(s.ping(at(28)));
        // Traffic from the server forgives: the next ping is not counted and clears them.
        s.strikes = 2;
        s.forgiven = true;
        assert!(!s.ping(at(29)));
        assert_eq!(s.strikes, 0);
        // But only once per minimum interval: traffic a client provokes buys no more.
        s.forgiven = true;
        assert!(!s.ping(at(30)), "a first strike");
        assert_eq!(s.strikes, 1);
        s.forgiven = true;
        assert!(!s.ping(at(31)));
        s.forgiven = true;
        assert!(s.ping(at(32)), "the third strike closes");
        // A quiet interval later, forgiveness is back.
        let mut s = Strikes::new(Duration::from_secs(10));
        s.forgiven = true;
        assert!(!s.ping(at(0)));
        s.strikes = 2;
        s.forgiven = true;
        assert!(!s.ping(at(10)));
        assert_eq!(s.strikes, 0);
    }
}
