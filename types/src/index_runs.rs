//! `IndexRuns`: a set of element indices as sorted, disjoint, non-adjacent runs `[start, end)`.
//!
//! Exactly-once delivery counts the elements of a task's stream by index: readers report the
//! runs they received, the dispatcher keeps their union per stream, and a worker that takes a
//! stream over skips what it holds. Readers receive long runs (a message's elements are
//! consecutive), and the union of every reader's runs is nearly a prefix, so the set stays a
//! handful of runs whatever the stream's length.
//!
//! The serde encoding (the runs, in order) is persisted by the dispatcher. Decoding does not
//! trust it: [`IndexRuns::from_runs`] rebuilds the invariants from any list.

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IndexRuns {
    /// start -> end, disjoint and non-adjacent.
    runs: BTreeMap<u64, u64>,
}

impl<'de> Deserialize<'de> for IndexRuns {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let runs = BTreeMap::<u64, u64>::deserialize(deserializer)?;
        Ok(IndexRuns::from_runs(runs))
    }
}

impl IndexRuns {
    pub fn new() -> Self {
        IndexRuns::default()
    }

    /// The set of every `[start, end)` given (empty and reversed runs add nothing).
    pub fn from_runs(runs: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut set = IndexRuns::new();
        for (start, end) in runs {
            set.insert(start, end);
        }
        set
    }

    /// Adds `[start, end)`, merging with the runs it touches.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut start, mut end) = (start, end);
        // A run starting at or before `start` that reaches it.
        if let Some((&s, &e)) = self.runs.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
            }
        }
        // Runs starting inside (or right at the end of) the new one.
        let inside: Vec<u64> = self.runs.range(start..=end).map(|(&s, _)| s).collect();
        for s in inside {
            let e = self.runs.remove(&s).expect("listed");
            end = end.max(e);
        }
        self.runs.insert(start, end);
    }

    /// Adds every run of `other`.
    pub fn extend(&mut self, other: &IndexRuns) {
        for (start, end) in other.iter() {
            self.insert(start, end);
        }
    }

    pub fn contains(&self, index: u64) -> bool {
        self.runs
            .range(..=index)
            .next_back()
            .is_some_and(|(_, &end)| index < end)
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Number of runs.
    pub fn num_runs(&self) -> usize {
        self.runs.len()
    }

    /// Number of indices.
    pub fn count(&self) -> u64 {
        self.runs.iter().map(|(s, e)| e - s).sum()
    }

    /// The runs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs.iter().map(|(&s, &e)| (s, e))
    }

    /// `n` consecutive indices *not* in the set, starting with the `k`-th index not in it (from
    /// 0): the indices a stream that skips this set gives its elements `k..k + n`, as runs.
    pub fn complement_runs(&self, k: u64, n: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if n == 0 {
            return out;
        }
        // Walk the gaps between runs, counting the indices they hold.
        let mut skipped = 0u64; // indices not in the set before `gap_start`
        let mut gap_start = 0u64;
        let mut left = n;
        let mut want = k;
        for (start, end) in self.iter().chain(std::iter::once((u64::MAX, u64::MAX))) {
            let gap = start.saturating_sub(gap_start);
            if want < skipped + gap {
                let first = gap_start + (want - skipped);
                let take = (gap - (want - skipped)).min(left);
                out.push((first, first + take));
                left -= take;
                want += take;
                if left == 0 {
                    break;
                }
            }
            skipped += gap;
            gap_start = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Runs = &'static [(u64, u64)];

    #[test]
    fn inserts_merge_touching_and_overlapping_runs() {
        // (runs inserted in order) -> the set's runs
        let cases: &[(Runs, Runs)] = &[
            (&[], &[]),
            (&[(3, 3), (5, 4)], &[]),
            (&[(0, 5), (5, 8)], &[(0, 8)]),
            (&[(5, 8), (0, 5)], &[(0, 8)]),
            (&[(0, 2), (4, 6), (1, 5)], &[(0, 6)]),
            (
                &[(10, 20), (0, 2), (2, 3), (30, 31)],
                &[(0, 3), (10, 20), (30, 31)],
            ),
            (&[(0, 10), (2, 3)], &[(0, 10)]),
            (&[(2, 3), (0, 10)], &[(0, 10)]),
            (&[(u64::MAX - 1, u64::MAX)], &[(u64::MAX - 1, u64::MAX)]),
        ];
        for (inserted, want) in cases {
            let set = IndexRuns::from_runs(inserted.iter().copied());
            assert_eq!(
                set.iter().collect::<Vec<_>>(),
                want.to_vec(),
                "{inserted:?}"
            );
            let count: u64 = want.iter().map(|(s, e)| e - s).sum();
            assert_eq!(set.count(), count);
        }
    }

    #[test]
    fn contains_follows_the_runs() {
        let set = IndexRuns::from_runs([(2, 4), (7, 8)]);
        let inside: Vec<u64> = (0..10).filter(|i| set.contains(*i)).collect();
        assert_eq!(inside, vec![2, 3, 7]);
    }

    #[test]
    fn complement_runs_number_the_indices_left_out() {
        let set = IndexRuns::from_runs([(0, 3), (5, 6), (9, 12)]);
        // Indices not in the set: 3 4 6 7 8 12 13 ...
        let cases: &[((u64, u64), Runs)] = &[
            ((0, 0), &[]),
            ((0, 1), &[(3, 4)]),
            ((0, 2), &[(3, 5)]),
            ((0, 3), &[(3, 5), (6, 7)]),
            ((1, 4), &[(4, 5), (6, 9)]),
            ((4, 3), &[(8, 9), (12, 14)]),
            ((5, 2), &[(12, 14)]),
        ];
        for &((k, n), want) in cases {
            assert_eq!(set.complement_runs(k, n), want.to_vec(), "k {k} n {n}");
        }
        assert_eq!(IndexRuns::new().complement_runs(7, 3), vec![(7, 10)]);
    }

    #[test]
    fn any_list_of_runs_builds_a_valid_set() {
        // Overlapping, reversed and unsorted runs, as a corrupt or hostile encoding could hold.
        let set = IndexRuns::from_runs([(20, 10), (3, 9), (0, 5)]);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![(0, 9)]);
    }
}
