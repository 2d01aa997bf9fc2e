//! How the agent waits between sessions: exponential backoff with jitter, reset by a session
//! that lasted or by a principal replica that sends the agent elsewhere. The load
//! generator's simulated agents use this same type, so a reconnect storm in a benchmark is
//! the one real agents make.

use std::time::Duration;

/// A session that lasted this long resets the backoff: reconnects stay cheap.
pub const STABLE_SESSION: Duration = Duration::from_secs(30);

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

    /// How long to wait after a session (or attempt) that lasted `lasted`; `redirected`: the
    /// principal asked the agent to come back at once (another replica serves it). Then the
    /// next wait doubles.
    pub fn after(&mut self, lasted: Duration, redirected: bool) -> Duration {
        if lasted > STABLE_SESSION || redirected {
            self.reset();
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
            let wait = b.after(Duration::ZERO, false);
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
            b.after(Duration::ZERO, false);
        }
        assert!(b.after(STABLE_SESSION + MS, false) <= 750 * MS);
        for _ in 0..4 {
            b.after(Duration::ZERO, false);
        }
        assert!(b.after(Duration::ZERO, true) <= 750 * MS);
    }
}
