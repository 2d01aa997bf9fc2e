//! How the agent waits between sessions: exponential backoff with jitter, reset by a session
//! that lasted or by a principal replica that sends the agent elsewhere, and held to a few
//! seconds while the principal cannot be reached at all. The load generator's simulated
//! agents use this same type, so a reconnect storm in a benchmark is the one real agents
//! make.

use std::time::Duration;

/// A session that lasted this long resets the backoff: reconnects stay cheap.
pub const STABLE_SESSION: Duration = Duration::from_secs(30);

/// The longest wait after an attempt that reached no principal. Such an attempt costs the
/// principal nothing (no endpoint answered) or an accept and a close (a principal that is
/// not ready closes connections before TLS), so a fleet may keep trying every few seconds,
/// and once the principals are back it is served within seconds instead of waiting out a
/// backoff grown while they were gone.
pub const UNREACHABLE_MAX: Duration = Duration::from_secs(5);

/// How the last attempt ended, for [`Backoff::after`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// A connection was made: a session ran, or the principal refused or ended it. The wait
    /// doubles up to the maximum.
    Session,
    /// The principal asked the agent to come back at once (another replica serves it).
    Redirected,
    /// No connection was made: nothing answered, or the principal closed the connection
    /// before its TLS handshake (it is not ready). The wait is drawn at random up to
    /// [`UNREACHABLE_MAX`] (or the current backoff, if smaller).
    Unreachable,
}

/// Reconnect backoff: starts at `initial`, doubles after each wait up to `max`, and each
/// wait adds up to half of itself as jitter so a fleet does not reconnect in step.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A backoff between `initial` and `max` (the agent's `--backoff-initial` and
    /// `--backoff-max`; by default 500 ms and 30 s).
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            current: initial,
        }
    }

    /// Starts over from `initial`.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }

    /// How long to wait after an attempt that lasted `lasted` and ended as `attempt`. A
    /// session that lasted or a redirect starts over; an unreachable principal gets a wait
    /// drawn between half the initial wait and the smaller of the current backoff and
    /// [`UNREACHABLE_MAX`] (full jitter: a recovering fleet does not come back in step).
    /// Otherwise the wait is the current backoff plus up to half of it as jitter. Then the
    /// next wait doubles.
    pub fn after(&mut self, lasted: Duration, attempt: Attempt) -> Duration {
        if lasted > STABLE_SESSION || attempt == Attempt::Redirected {
            self.reset();
        }
        let wait = if attempt == Attempt::Unreachable {
            let low = self.initial / 2;
            let high = self.current.min(UNREACHABLE_MAX).max(low);
            low + (high - low).mul_f64(fastrand::f64())
        } else {
            self.current + self.current.mul_f64(fastrand::f64() * 0.5)
        };
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
    fn an_unreachable_principal_is_tried_again_within_a_few_seconds_at_random() {
        let mut b = Backoff::new(500 * MS, 30_000 * MS);
        // A backoff grown by refused sessions...
        for _ in 0..8 {
            b.after(Duration::ZERO, Attempt::Session);
        }
        // ...waits at most UNREACHABLE_MAX once nothing answers, spread over the range.
        let waits: Vec<Duration> = (0..200)
            .map(|_| b.after(Duration::ZERO, Attempt::Unreachable))
            .collect();
        assert!(
            waits
                .iter()
                .all(|w| *w >= 250 * MS && *w <= UNREACHABLE_MAX)
        );
        assert!(waits.iter().any(|w| *w < 2_000 * MS), "spread low");
        assert!(waits.iter().any(|w| *w > 3_500 * MS), "spread high");
        // Early on, never more than the current backoff.
        let mut b = Backoff::new(500 * MS, 30_000 * MS);
        assert!(b.after(Duration::ZERO, Attempt::Unreachable) <= 500 * MS);
        // A connection that is made again backs off as before (the backoff kept growing).
        let wait = b.after(Duration::ZERO, Attempt::Session);
        assert!(wait >= 1_000 * MS, "{wait:?}");
    }
}
