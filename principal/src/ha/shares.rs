//! Fair shares: how many agents each live replica holds, and how many one should shed.

use std::collections::HashMap;

/// What a share computation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shares {
    /// Live replicas' holder identities -> agents each holds.
    pub held: HashMap<String, usize>,
    /// Agents per live replica, rounded up (`usize::MAX` with no live replica).
    pub fair: usize,
}

impl Shares {
    /// Agents held per live replica; `fair` = ceil(total / live replicas).
    pub fn compute(live: &[String], agent_holders: impl Iterator<Item = String>) -> Shares {
        let mut held: HashMap<String, usize> = live.iter().map(|r| (r.clone(), 0)).collect();
        for h in agent_holders {
            if let Some(n) = held.get_mut(&h) {
                *n += 1;
            }
        }
        let total: usize = held.values().sum();
        let fair = if held.is_empty() {
            usize::MAX
        } else {
            total.div_ceil(held.len())
        };
        Shares { held, fair }
    }

    /// Whether a live replica other than `me` is below its fair share.
    pub fn someone_below(&self, me: &str) -> bool {
        self.held.iter().any(|(r, n)| r != me && *n < self.fair)
    }

    /// How many sessions `me` closes in one rebalance round: `batch`, or a quarter of its
    /// excess when that is more, never more than the excess. A replica that took most of
    /// the fleet after a restart of every replica (the first one ready gets every dial)
    /// sheds thousands: at `batch` a round it would take an hour, a quarter a round takes
    /// a few minutes, each round a small storm the replicas absorb in seconds.
    pub fn shed(&self, me: &str, slack: usize, batch: usize) -> usize {
        let excess = self.excess(me, slack);
        excess.min(batch.max(excess / 4))
    }

    /// How many agents `me` should shed with `slack`: those above fair + slack, when
    /// someone else has room.
    pub fn excess(&self, me: &str, slack: usize) -> usize {
        let mine = self.held.get(me).copied().unwrap_or(0);
        if self.someone_below(me) {
            mine.saturating_sub(self.fair.saturating_add(slack))
        } else {
            0
        }
    }
}
