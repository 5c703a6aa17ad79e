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

use crate::state::update::Rejection;
use serde::{Deserialize, Serialize};
use sluice_types::SplitLease;

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

    /// Whether a lease of `repetition` is allowed: a worker asks for a repetition only after
    /// the end of the one before it, so no request is ever more than one past the cursor's.
    /// Such a request is refused, never followed (it would skip the cursor past repetitions
    /// nobody read, and near `u64::MAX` overflow it).
    pub fn check(&self, repetition: u64) -> Result<(), Rejection> {
        // At `u64::MAX` no request can be past the next repetition.
        if self
            .repetition
            .checked_add(1)
            .is_some_and(|next| repetition > next)
        {
            return Err(Rejection::InvalidArgument(format!(
                "split repetition {repetition} is beyond the provider's next repetition (it is \
                 in repetition {})",
                self.repetition
            )));
        }
        Ok(())
    }

    /// Leases up to `max` splits of `repetition` (at least one when any is left), after
    /// [`SplitCursor::check`].
    pub fn lease(&mut self, repetition: u64, max: u64) -> Result<SplitLease, Rejection> {
        let end_of_splits = |repetition| SplitLease {
            repetition,
            start: 0,
            end: 0,
            end_of_splits: true,
        };
        self.check(repetition)?;
        if repetition < self.repetition {
            return Ok(end_of_splits(repetition));
        }
        if repetition > self.repetition {
            self.repetition = repetition;
            self.next = 0;
        }
        if self.next >= self.num_splits {
            // Exhausted: on to the next repetition; the last one (`u64::MAX`) stays exhausted.
            if let Some(next) = repetition.checked_add(1) {
                self.repetition = next;
                self.next = 0;
            }
            return Ok(end_of_splits(repetition));
        }
        let start = self.next;
        let end = start.saturating_add(max.max(1)).min(self.num_splits);
        self.next = end;
        #[cfg(feature = "planted-bug")]
        let start = planted_bug(start);
        Ok(SplitLease {
            repetition,
            start,
            end,
            end_of_splits: false,
        })
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
            ((2, 1), lease(0, 1, 2)), // a worker moved on first: the cursor follows, one ahead
            ((1, 1), eos(1)),
        ];
        let mut cursor = SplitCursor::new(5);
        for (i, ((repetition, max), want)) in steps.iter().enumerate() {
            assert_eq!(cursor.lease(*repetition, *max), Ok(*want), "step {i}");
        }
    }

    #[test]
    fn a_repetition_past_the_next_is_refused_and_changes_nothing() {
        // (cursor repetition, requested repetition)
        let cases: &[(u64, u64)] = &[
            (0, 2),
            (0, u64::MAX),
            (5, 7),
            (u64::MAX - 1, u64::MAX),
            (u64::MAX, u64::MAX),
        ];
        for &(at, requested) in cases {
            let mut cursor = SplitCursor::new(5);
            cursor.repetition = at;
            let before = cursor.clone();
            let refused = cursor.lease(requested, 1);
            if requested > at.saturating_add(1) {
                assert!(
                    matches!(&refused, Err(Rejection::InvalidArgument(m)) if m.contains(&format!("split repetition {requested} is beyond"))),
                    "{at} -> {requested}: {refused:?}"
                );
                assert_eq!(cursor, before, "{at} -> {requested}");
            } else {
                assert!(refused.is_ok(), "{at} -> {requested}: {refused:?}");
            }
        }
    }

    #[test]
    fn the_last_repetition_ends_without_overflow() {
        // Two requests at u64::MAX (the fault that once made apply panic): the cursor ends the
        // repetition and stays put, never wrapping to repetition 0.
        let mut cursor = SplitCursor::new(1);
        cursor.repetition = u64::MAX - 1;
        assert_eq!(cursor.lease(u64::MAX, 1), Ok(lease(0, 1, u64::MAX)));
        assert_eq!(cursor.lease(u64::MAX, 1), Ok(eos(u64::MAX)));
        assert_eq!(cursor.lease(u64::MAX, 1), Ok(eos(u64::MAX)));
        assert_eq!(cursor.repetition, u64::MAX);
        assert!(cursor.lease(0, 1).is_ok_and(|l| l.end_of_splits));
    }

    #[test]
    fn an_empty_provider_ends_at_once() {
        let mut cursor = SplitCursor::new(0);
        assert_eq!(cursor.lease(0, 8), Ok(eos(0)));
        assert_eq!(cursor.repetition, 1);
    }
}
