//! Log lines for refused connections without a log storm.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::text;

/// How often [`RefusalLog`] writes a line at most.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Log lines for refused connections without a log storm: the first refusal is logged at
/// once, later ones at most every 10 seconds (or as given) with the number left out in
/// between.
pub struct RefusalLog {
    listener: String,
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl RefusalLog {
    /// Refusals of `listener` (its name in the log line).
    pub fn new(listener: impl Into<String>) -> RefusalLog {
        RefusalLog::every(listener, REFUSAL_LOG_EVERY)
    }

    /// Refusals of `listener`, a line at most every `every`.
    pub fn every(listener: impl Into<String>, every: Duration) -> RefusalLog {
        RefusalLog {
            listener: listener.into(),
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// The listener's name, as the log lines give it.
    pub fn listener(&self) -> &str {
        &self.listener
    }

    /// `Some(n)` when a line is due (`n`: the refusals not logged since the last line),
    /// `None` when this refusal is only counted, to be reported with the next line.
    pub fn due(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.0.is_some_and(|t| t.elapsed() < self.every) {
            state.1 += 1;
            return None;
        }
        let held = state.1;
        *state = (Some(Instant::now()), 0);
        Some(held)
    }

    /// Logs (or counts, to log later) one refused connection (or request) from `peer`
    /// (`None`: a Unix socket's, or no single client's).
    pub fn refused(&self, peer: Option<SocketAddr>, reason: &'static str, limit: usize) {
        let Some(suppressed) = self.due() else {
            return;
        };
        let peer = peer.map_or_else(|| "-".to_owned(), |p| p.to_string());
        tracing::warn!(
            listener = %self.listener,
            %peer,
            reason,
            limit,
            not_logged_since_last = suppressed,
            "connection refused (further refusals logged at most every {every})",
            every = text::duration(self.every)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_logged_once_then_counted_until_the_next_line() {
        let log = RefusalLog::new("test");
        for _ in 0..5 {
            log.refused(None, "TooManyConnections", 1);
        }
        let (last, left_out) = *log.state.lock().unwrap();
        assert!(last.is_some());
        assert_eq!(left_out, 4, "one line, four refusals waiting for the next");
    }
}
