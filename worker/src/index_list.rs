//! `IndexList`: the stream indices of a run of elements, as consecutive runs `[start, end)` in
//! element order (exactly-once tasks number their elements; other tasks' lists are empty and
//! cost nothing).

/// Indices of elements, in their order, as runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexList {
    runs: Vec<(u64, u64)>,
}

impl IndexList {
    pub fn from_runs(runs: impl IntoIterator<Item = (u64, u64)>) -> IndexList {
        let mut list = IndexList::default();
        for (start, end) in runs {
            list.push(start, end);
        }
        list
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Appends `[start, end)`, merged with the last run when it continues it.
    pub fn push(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        match self.runs.last_mut() {
            Some((_, last_end)) if *last_end == start => *last_end = end,
            _ => self.runs.push((start, end)),
        }
    }

    pub fn extend(&mut self, other: IndexList) {
        for (start, end) in other.runs {
            self.push(start, end);
        }
    }

    /// The indices of the first `n` elements (all there are when fewer); `self` keeps the rest.
    pub fn split_to(&mut self, n: u64) -> IndexList {
        let mut front = IndexList::default();
        let mut left = n;
        while left > 0 {
            let Some(&(start, end)) = self.runs.first() else {
                break;
            };
            let take = (end - start).min(left);
            front.push(start, start + take);
            left -= take;
            if start + take == end {
                self.runs.remove(0);
            } else {
                self.runs[0].0 = start + take;
            }
        }
        front
    }

    /// As flattened `start, end` pairs (`ElementBatch.index_runs`).
    pub fn flattened(&self) -> Vec<u64> {
        self.runs.iter().flat_map(|&(s, e)| [s, e]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_pushes_keep_the_order_and_merge_what_continues() {
        let mut list = IndexList::from_runs([(0, 3), (3, 5), (9, 12)]);
        assert_eq!(list.flattened(), vec![0, 5, 9, 12]);
        assert_eq!(list.split_to(2).flattened(), vec![0, 2]);
        assert_eq!(list.split_to(4).flattened(), vec![2, 5, 9, 10]);
        assert_eq!(list.split_to(10).flattened(), vec![10, 12]);
        assert!(list.is_empty());
        assert!(list.split_to(3).is_empty());
    }
}
