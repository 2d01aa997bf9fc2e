//! How both binaries stop: every task runs on one `TaskTracker` and watches one shutdown
//! token; at the end the tracker is closed and drained for a bounded time.

use argocd_agent_identity::text;
use std::time::Duration;

use tokio_util::task::TaskTracker;

/// How long shutdown waits for tasks (sessions, workers, listeners, Lease releases) to end.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Closes `tasks` and waits at most [`DRAIN_TIMEOUT`] for them to finish. Returns `false`,
/// with a warning naming how many were left, when some were still running.
pub async fn drain(tasks: &TaskTracker) -> bool {
    drain_within(tasks, DRAIN_TIMEOUT).await
}

/// [`drain`] with its own limit.
pub async fn drain_within(tasks: &TaskTracker, limit: Duration) -> bool {
    tasks.close();
    if tokio::time::timeout(limit, tasks.wait()).await.is_err() {
        tracing::warn!(
            remaining = tasks.len(),
            "shutdown: tasks still running after {limit}",
            limit = text::duration(limit)
        );
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_tasks_and_gives_up_after_the_limit() {
        let tasks = TaskTracker::new();
        tasks.spawn(tokio::time::sleep(Duration::from_secs(1)));
        assert!(drain_within(&tasks, Duration::from_secs(5)).await);
        let tasks = TaskTracker::new();
        tasks.spawn(tokio::time::sleep(Duration::from_secs(60)));
        assert!(!drain_within(&tasks, Duration::from_secs(5)).await);
    }
}
