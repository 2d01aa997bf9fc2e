//! How long an agent has been silent.

use std::time::Duration;

/// When an agent has been silent for the idle timeout.
///
/// One timer per session, due when the agent will have been silent for the timeout and
/// moved on only when it fires, so an agent that heartbeats wakes its session for its
/// heartbeats and about once per timeout, not for a periodic check as well (a check every
/// third of the 120 s timeout was 250 more wake-ups a second at 10,000 idle agents).
pub(super) struct Silence {
    timeout: Duration,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// Times the timer fired.
    fired: u32,
}

impl Silence {
    pub(super) fn new(timeout: Duration) -> Self {
        Silence {
            timeout,
            timer: Box::pin(tokio::time::sleep(timeout)),
            fired: 0,
        }
    }

    /// Completes once the agent, last heard from at `last_seen`, has been silent for the
    /// timeout. Cancel-safe: the timer is kept between calls.
    pub(super) async fn since(&mut self, last_seen: tokio::time::Instant) {
        loop {
            self.timer.as_mut().await;
            self.fired += 1;
            let silent_until = last_seen + self.timeout;
            if tokio::time::Instant::now() >= silent_until {
                return;
            }
            self.timer.as_mut().reset(silent_until);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_heartbeating_agent_wakes_the_silence_timer_about_once_per_timeout() {
        use tokio::time::Instant;
        let timeout = Duration::from_secs(120);
        let mut silence = Silence::new(timeout);
        let started = Instant::now();
        let mut last_seen = started;
        // Ten minutes of heartbeats every 30 s: never silent for the timeout.
        while started.elapsed() < Duration::from_secs(600) {
            tokio::select! {
                () = silence.since(last_seen) => panic!("closed at {:?} although it heartbeats", started.elapsed()),
                () = tokio::time::sleep(Duration::from_secs(30)) => last_seen = Instant::now(),
            }
        }
        // Due 120 s after the start, then 120 s after the heartbeat it saw last: at most
        // once every 90 s (a check every third of the timeout fired 15 times).
        assert!(silence.fired <= 600 / 90, "fired {} times", silence.fired);
        // Then the agent falls silent: closed the timeout after its last heartbeat, not
        // later.
        silence.since(last_seen).await;
        assert_eq!(Instant::now() - last_seen, timeout);
    }
}
