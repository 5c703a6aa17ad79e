//! The dispatcher side of one split provider of a distributed_epoch iteration.
//!
//! A cursor is where the provider is, never what it produced: a split's content is recomputed
//! by the worker from the dataset definition and the split index. Leasing moves the cursor
//! forward inside a committed log entry before the lease reaches the worker, so a split index
//! is handed out at most once per repetition, across leader changes and restarts.
//!
//! Repetitions follow tf.data's `GetSplit`: a request for an older repetition gets
//! `end_of_splits`; a request for a newer one moves the cursor to it (a pipeline with an inner
//! `repeat` restarted its source); exhausting a repetition answers `end_of_splits` and moves to
//! the next repetition.

use crate::state::update::SplitLease;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitCursor {
    /// The repetition the provider is in.
    pub repetition: u64,
    /// The first split of `repetition` not yet leased.
    pub next: u64,
    /// Splits per repetition (fixed at registration: range length, slice count, file count).
    pub num_splits: u64,
}

impl SplitCursor {
    pub fn new(num_splits: u64) -> Self {
        SplitCursor {
            repetition: 0,
            next: 0,
            num_splits,
        }
    }

    /// Leases up to `max` splits of `repetition` (at least one when any is left).
    pub fn lease(&mut self, repetition: u64, max: u64) -> SplitLease {
        let end_of_splits = |repetition| SplitLease {
            repetition,
            start: 0,
            end: 0,
            end_of_splits: true,
        };
        if repetition < self.repetition {
            return end_of_splits(repetition);
        }
        if repetition > self.repetition {
            self.repetition = repetition;
            self.next = 0;
        }
        if self.next >= self.num_splits {
            self.repetition += 1;
            self.next = 0;
            return end_of_splits(repetition);
        }
        let start = self.next;
        let end = start.saturating_add(max.max(1)).min(self.num_splits);
        self.next = end;
        #[cfg(feature = "planted-bug")]
        let start = planted_bug(start);
        SplitLease {
            repetition,
            start,
            end,
            end_of_splits: false,
        }
    }
}

/// The planted bug of the chaos harness's self-test: a lease starting at a multiple of 64 also
/// re-issues the 4 splits before it, which an earlier lease already handed out. Deterministic,
/// so every replica agrees on the wrong answer, as a real logic bug would.
#[cfg(feature = "planted-bug")]
fn planted_bug(start: u64) -> u64 {
    if start > 0 && start % 64 == 0 {
        start - 4
    } else {
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(start: u64, end: u64, repetition: u64) -> SplitLease {
        SplitLease {
            repetition,
            start,
            end,
            end_of_splits: false,
        }
    }
    fn eos(repetition: u64) -> SplitLease {
        SplitLease {
            repetition,
            start: 0,
            end: 0,
            end_of_splits: true,
        }
    }

    #[test]
    fn leases_follow_the_cursor_table() {
        // (requested repetition, max) -> expected lease, applied in order on a cursor of 5 splits.
        let steps: &[((u64, u64), SplitLease)] = &[
            ((0, 2), lease(0, 2, 0)),
            ((0, 2), lease(2, 4, 0)),
            ((0, 0), lease(4, 5, 0)), // max 0 still makes progress
            ((0, 2), eos(0)),         // exhausted: end, cursor moves to repetition 1
            ((0, 2), eos(0)),         // a late worker on repetition 0 also gets the end
            ((1, 10), lease(0, 5, 1)),
            ((3, 1), lease(0, 1, 3)), // jump to a newer repetition
            ((2, 1), eos(2)),
        ];
        let mut cursor = SplitCursor::new(5);
        for (i, ((repetition, max), want)) in steps.iter().enumerate() {
            assert_eq!(cursor.lease(*repetition, *max), *want, "step {i}");
        }
    }

    #[test]
    fn an_empty_provider_ends_at_once() {
        let mut cursor = SplitCursor::new(0);
        assert_eq!(cursor.lease(0, 8), eos(0));
        assert_eq!(cursor.repetition, 1);
    }
}
