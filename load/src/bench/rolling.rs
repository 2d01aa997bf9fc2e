//! The Deployment controller's rolling update, reduced to the counts the storms need: how
//! many new pods to start and how many old ones to terminate after each pod becomes ready.
//!
//! It follows Kubernetes' `pkg/controller/deployment/rolling.go` (`rolloutRolling`,
//! `reconcileNewReplicaSet`, `reconcileOldReplicaSets`,
//! `scaleDownOldReplicaSetsForRollingUpdate`) and `NewRSNewReplicas` in
//! `deployment/util`: both ReplicaSets are counted by their `spec.replicas`, so a pod that is
//! terminating no longer counts, and the surge pod it leaves room for starts at once. With
//! `deploy/`'s `maxSurge: 1, maxUnavailable: 1` and three replicas, the first sync terminates
//! one old pod and starts two new ones; each new pod that becomes ready lets one more old pod
//! go. Old pods are assumed ready until terminated, and `minReadySeconds` is 0 (the
//! Deployment's default and `deploy/`'s), so a ready pod is an available one.

/// The rolling-update strategy of `deploy/principal/deployment.yaml`.
pub(super) const MAX_SURGE: usize = 1;
/// The rolling-update strategy of `deploy/principal/deployment.yaml`.
pub(super) const MAX_UNAVAILABLE: usize = 1;

/// A Deployment's old and new ReplicaSet during a rolling update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rolling {
    replicas: usize,
    surge: usize,
    unavailable: usize,
    /// The old ReplicaSet's `spec.replicas`: pods not yet terminated, all ready.
    old: usize,
    /// The new ReplicaSet's `spec.replicas`: pods started.
    new: usize,
    /// The new ReplicaSet's available pods.
    new_ready: usize,
}

/// What one sync of the controller changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scaled {
    /// The new ReplicaSet scaled up: this many pods start.
    Up(usize),
    /// The old ReplicaSet scaled down: this many pods terminate.
    Down(usize),
}

impl Rolling {
    /// A rollout of `replicas` pods about to start. `surge` and `unavailable` are absolute
    /// (the API server refuses both at 0).
    pub(super) fn new(replicas: usize, surge: usize, unavailable: usize) -> Rolling {
        assert!(
            surge + unavailable > 0,
            "maxSurge and maxUnavailable both 0"
        );
        Rolling {
            replicas,
            surge,
            unavailable,
            old: replicas,
            new: 0,
            new_ready: 0,
        }
    }

    /// Syncs until nothing changes (every scale is an event that queues the next sync) and
    /// returns how many new pods to start and how many old pods to terminate now.
    pub(super) fn settle(&mut self) -> (usize, usize) {
        let (mut start, mut stop) = (0, 0);
        while let Some(s) = self.sync() {
            match s {
                Scaled::Up(n) => start += n,
                Scaled::Down(n) => stop += n,
            }
        }
        (start, stop)
    }

    /// One new pod became available.
    pub(super) fn ready(&mut self) {
        self.new_ready = (self.new_ready + 1).min(self.new);
    }

    /// Every pod is new and available.
    pub(super) fn done(&self) -> bool {
        self.old == 0 && self.new_ready == self.replicas
    }

    /// One `rolloutRolling`: scale the new ReplicaSet up if the surge allows, else scale
    /// the old one down if availability allows.
    fn sync(&mut self) -> Option<Scaled> {
        // reconcileNewReplicaSet / NewRSNewReplicas: every ReplicaSet's spec counts.
        let max_total = self.replicas + self.surge;
        let current = self.old + self.new;
        if self.new < self.replicas && current < max_total {
            let up = (max_total - current).min(self.replicas - self.new);
            self.new += up;
            return Some(Scaled::Up(up));
        }
        // reconcileOldReplicaSets: never below minAvailable, and never while the new
        // ReplicaSet's unavailable pods would make up the difference.
        if self.old == 0 {
            return None;
        }
        let min_available = self.replicas.saturating_sub(self.unavailable);
        let new_unavailable = self.new - self.new_ready;
        if self.old + self.new <= min_available + new_unavailable {
            return None;
        }
        // Old pods are all healthy, so cleanupUnhealthyReplicas scales nothing; then
        // scaleDownOldReplicaSetsForRollingUpdate down to minAvailable.
        let available = self.old + self.new_ready;
        if available <= min_available {
            return None;
        }
        let down = (available - min_available).min(self.old);
        self.old -= down;
        Some(Scaled::Down(down))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a rollout where new pods become ready one at a time; returns each settle's
    /// (started, terminated).
    fn steps(replicas: usize, surge: usize, unavailable: usize) -> Vec<(usize, usize)> {
        let mut r = Rolling::new(replicas, surge, unavailable);
        let mut out = vec![r.settle()];
        while !r.done() {
            r.ready();
            out.push(r.settle());
            assert!(out.len() <= replicas + 1, "no progress: {r:?}");
        }
        out
    }

    #[test]
    fn deploys_strategy_starts_two_successors_at_once_for_three_replicas() {
        // One old pod goes, which leaves room for a second surge pod: two start at once.
        assert_eq!(
            steps(3, MAX_SURGE, MAX_UNAVAILABLE),
            vec![(2, 1), (1, 1), (0, 1), (0, 0)]
        );
    }

    #[test]
    fn without_unavailability_the_old_pods_go_one_per_ready_successor() {
        assert_eq!(steps(3, 1, 0), vec![(1, 0), (1, 1), (1, 1), (0, 1)]);
    }

    #[test]
    fn without_surge_an_old_pod_goes_before_its_successor_starts() {
        assert_eq!(steps(3, 0, 1), vec![(1, 1), (1, 1), (1, 1), (0, 0)]);
    }

    #[test]
    fn the_totals_never_break_the_strategy() {
        for (n, s, u) in [(3, 1, 1), (5, 2, 1), (4, 1, 2), (2, 1, 1), (1, 1, 1)] {
            let mut r = Rolling::new(n, s, u);
            let (mut started, mut stopped) = (0, 0);
            loop {
                let (a, b) = r.settle();
                started += a;
                stopped += b;
                assert!(r.old + r.new <= n + s, "{r:?}: over the surge");
                assert!(r.old + r.new_ready >= n - u, "{r:?}: under minAvailable");
                if r.done() {
                    break;
                }
                r.ready();
            }
            assert_eq!((started, stopped), (n, n), "{n} {s} {u}");
        }
    }

    /// The constants are what `deploy/` ships.
    #[test]
    fn the_strategy_is_deploys() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/principal/deployment.yaml"
        );
        let yaml = std::fs::read_to_string(path).expect("deploy/principal/deployment.yaml");
        let line = yaml
            .lines()
            .find(|l| l.trim_start().starts_with("rollingUpdate:"))
            .expect("a rollingUpdate strategy");
        // `rollingUpdate: {maxUnavailable: 1, maxSurge: 1}`: each entry of the flow mapping.
        let entries: Vec<&str> = line
            .split(['{', '}', ','])
            .skip(1)
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        let mut want = vec![
            format!("maxSurge: {MAX_SURGE}"),
            format!("maxUnavailable: {MAX_UNAVAILABLE}"),
        ];
        want.sort();
        let mut have: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        have.sort();
        assert_eq!(have, want, "{line}");
    }
}
