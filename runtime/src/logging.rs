//! Logging setup shared by both binaries: `RUST_LOG`-style filter, text or JSON, plus the
//! OpenTelemetry span layer when tracing is configured ([`crate::telemetry`]).

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Installs the global tracing subscriber. `json` selects JSON lines (for log collectors).
pub fn init(level: &str, json: bool) {
    init_with_telemetry(level, json, None);
}

/// [`init`], exporting spans through `telemetry` when given. The log filter applies to the
/// log output only; which spans are exported is decided by [`crate::telemetry::layer`].
pub fn init_with_telemetry(
    level: &str,
    json: bool,
    telemetry: Option<&crate::telemetry::Telemetry>,
) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let fmt = if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(telemetry.map(crate::telemetry::layer))
        .try_init();
}

/// Lets a repeated warning through at most once per interval and counts the ones it held
/// back, so a failure that repeats for every agent and write (an unreachable Redis, say)
/// is one line a minute that says how often it happened, not a flood.
#[derive(Debug)]
pub struct LogLimiter {
    every: std::time::Duration,
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl LogLimiter {
    /// At most one line per `every`.
    pub fn new(every: std::time::Duration) -> LogLimiter {
        LogLimiter {
            every,
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// `Some(n)` when this occurrence should be logged, `n` being how many were held back
    /// since the last logged one; `None` when it should be held back (and is counted).
    pub fn admit(&self) -> Option<u64> {
        let now = std::time::Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (last, held) = &mut *state;
        match last {
            Some(at) if now.duration_since(*at) < self.every => {
                *held += 1;
                None
            }
            _ => {
                *last = Some(now);
                Some(std::mem::take(held))
            }
        }
    }
}

#[cfg(test)]
mod log_limiter_tests {
    use super::LogLimiter;
    use std::time::Duration;

    #[test]
    fn lets_one_through_per_interval_and_counts_the_rest() {
        let l = LogLimiter::new(Duration::from_millis(50));
        assert_eq!(l.admit(), Some(0));
        assert_eq!(l.admit(), None);
        assert_eq!(l.admit(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(l.admit(), Some(2));
        assert_eq!(l.admit(), None);
    }
}
