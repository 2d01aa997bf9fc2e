//! How the agent waits between sessions: exponential backoff with jitter, reset by a session
//! that lasted or by a principal replica that sends the agent elsewhere, and held short for a
//! while when the dial is refused (no principal listens). The load generator's simulated
//! agents use this same type, so a reconnect storm in a benchmark is the one real agents
//! make.

use std::time::Duration;

/// A session that lasted this long resets the backoff: reconnects stay cheap.
pub const STABLE_SESSION: Duration = Duration::from_secs(30);

/// The longest wait after a refused dial, while refusals have lasted less than
/// [`REFUSED_WINDOW`].
pub const REFUSED_MAX: Duration = Duration::from_secs(2);

/// How long refused dials are retried within [`REFUSED_MAX`]; after that the backoff grows
/// as after any other failure, so a principal that stays down is not dialed every second
/// by its whole fleet.
pub const REFUSED_WINDOW: Duration = Duration::from_secs(60);

/// How the last attempt ended, for [`Backoff::after`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// A connection was made: a session ran, or the principal refused it, ended it, or did
    /// not finish its handshake in time. The wait doubles up to the maximum.
    Session,
    /// The principal asked the agent to come back at once (another replica serves it).
    Redirected,
    /// The TCP connection was refused: no principal listens (every replica is down or not
    /// ready, so a Service has no endpoint). Such a dial costs the principals nothing, so
    /// it is retried after a random wait of at most [`REFUSED_MAX`], and the backoff does
    /// not grow: once a principal is back the fleet is served within seconds, spread over
    /// that window, instead of waiting out a backoff grown while nothing listened. A
    /// handshake that times out on a saturated principal is a [`Attempt::Session`]: its
    /// retries back off, or they would keep the principal saturated.
    Refused,
}

/// Reconnect backoff: starts at `initial`, doubles after each wait up to `max`, and each
/// wait adds up to half of itself as jitter so a fleet does not reconnect in step.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    /// How long dials have been refused in a row (attempts and waits).
    refused_for: Duration,
}

impl Backoff {
    /// A backoff between `initial` and `max` (the agent's `--backoff-initial` and
    /// `--backoff-max`; by default 500 ms and 30 s).
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            current: initial,
            refused_for: Duration::ZERO,
        }
    }

    /// Starts over from `initial`.
    pub fn reset(&mut self) {
        self.current = self.initial;
        self.refused_for = Duration::ZERO;
    }

    /// How long to wait after an attempt that lasted `lasted` and ended as `attempt`. A
    /// session that lasted or a redirect starts over. A refused dial, while refusals have
    /// lasted under [`REFUSED_WINDOW`], waits at random between half the initial wait and
    /// [`REFUSED_MAX`] (full jitter) and leaves the backoff as it was. Otherwise the wait is
    /// the current backoff plus up to half of it as jitter, and the next one doubles.
    pub fn after(&mut self, lasted: Duration, attempt: Attempt) -> Duration {
        if lasted > STABLE_SESSION || attempt == Attempt::Redirected {
            self.reset();
        }
        if attempt == Attempt::Refused {
            self.refused_for += lasted;
            if self.refused_for < REFUSED_WINDOW {
                let low = self.initial / 2;
                let high = REFUSED_MAX.max(low);
                let wait = low + (high - low).mul_f64(fastrand::f64());
                self.refused_for += wait;
                return wait;
            }
        } else {
            self.refused_for = Duration::ZERO;
        }
        let wait = self.current + self.current.mul_f64(fastrand::f64() * 0.5);
        self.current = (self.current * 2).min(self.max);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_up_to_the_max_with_at_most_half_jitter() {
        let mut b = Backoff::new(500 * MS, 4000 * MS);
        for base in [500, 1000, 2000, 4000, 4000] {
            let wait = b.after(Duration::ZERO, Attempt::Session);
            assert!(
                wait >= base * MS && wait <= base * 3 / 2 * MS,
                "{wait:?} for {base}"
            );
        }
    }

    #[test]
    fn a_stable_session_or_a_redirect_starts_over() {
        let mut b = Backoff::new(500 * MS, 30_000 * MS);
        for _ in 0..4 {
            b.after(Duration::ZERO, Attempt::Session);
        }
        assert!(b.after(STABLE_SESSION + MS, Attempt::Session) <= 750 * MS);
        for _ in 0..4 {
            b.after(Duration::ZERO, Attempt::Session);
        }
        assert!(b.after(Duration::ZERO, Attempt::Redirected) <= 750 * MS);
    }

    #[test]
    fn refused_dials_are_retried_within_seconds_at_random_for_a_minute() {
        let mut b = Backoff::new(500 * MS, 30_000 * MS);
        // The session that lasted ended with the principal's death; then nothing listens.
        b.after(STABLE_SESSION + MS, Attempt::Session);
        let mut waits = Vec::new();
        let mut total = Duration::ZERO;
        while total < REFUSED_WINDOW - REFUSED_MAX {
            let wait = b.after(MS, Attempt::Refused);
            total += wait + MS;
            waits.push(wait);
        }
        assert!(waits.iter().all(|w| *w >= 250 * MS && *w <= REFUSED_MAX));
        assert!(waits.iter().any(|w| *w < 800 * MS), "spread low: {waits:?}");
        assert!(
            waits.iter().any(|w| *w > 1_500 * MS),
            "spread high: {waits:?}"
        );
        // The backoff did not grow meanwhile: a handshake that then times out waits the
        // second step (the session's end took the first), not one grown by the refusals.
        let wait = b.after(Duration::ZERO, Attempt::Session);
        assert!(wait >= 1_000 * MS && wait <= 1_500 * MS, "{wait:?}");
    }

    #[test]
    fn refusals_that_last_a_minute_back_off_as_any_failure() {
        let mut b = Backoff::new(500 * MS, 30_000 * MS);
        let mut total = Duration::ZERO;
        while total < REFUSED_WINDOW {
            total += b.after(MS, Attempt::Refused) + MS;
        }
        // Now the waits double again: 0.5, 1, 2, 4 s...
        let waits: Vec<Duration> = (0..6).map(|_| b.after(MS, Attempt::Refused)).collect();
        assert!(waits[5] >= 16_000 * MS, "{waits:?}");
        // A connection that is made ends the streak: the next refusal is short again.
        b.after(MS, Attempt::Session);
        assert!(b.after(MS, Attempt::Refused) <= REFUSED_MAX);
    }
}
