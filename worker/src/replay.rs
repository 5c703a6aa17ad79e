//! `ReplaySupplier`: the splits of a task that takes over an exactly-once stream.
//!
//! The stream's content is a function of the splits its tasks consumed, in order. The task
//! taking it over first consumes the leases recorded for the stream (the dispatcher hands them
//! over in the task's definition), each split provider its own leases in the order they were
//! granted (a `zip(range(n), range(n))` reads two providers, interleaved as its pipeline asks),
//! and only then leases new splits: so its pipeline produces the same elements, in the same
//! order, as the failed worker's did, and then goes on. A recorded repetition that ends before the next recorded one
//! starts asks the dispatcher, which answers with that repetition's end, as it answered the
//! task that recorded it.

use sluice_element::DatasetError;
use sluice_executor::SplitSupplier;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Splits `[next, end)` of a repetition.
#[derive(Debug)]
struct Recorded {
    repetition: u64,
    next: u64,
    end: u64,
}

pub struct ReplaySupplier {
    /// Each provider's recorded leases, in the order they were granted.
    recorded: Mutex<HashMap<u32, VecDeque<Recorded>>>,
    then: Arc<dyn SplitSupplier>,
}

impl ReplaySupplier {
    /// `leases` as the dispatcher sends them: flattened triples `repetition, start, end`
    /// (an incomplete triple at the end is ignored; the dispatcher sends whole ones), and
    /// `providers` the split provider of each triple (empty: all provider 0; a triple past its
    /// end is provider 0's too).
    pub fn new(leases: &[u64], providers: &[u32], then: Arc<dyn SplitSupplier>) -> ReplaySupplier {
        let mut recorded: HashMap<u32, VecDeque<Recorded>> = HashMap::new();
        for (i, l) in leases.chunks_exact(3).enumerate() {
            if l[1] >= l[2] {
                continue;
            }
            let provider = providers.get(i).copied().unwrap_or(0);
            recorded.entry(provider).or_default().push_back(Recorded {
                repetition: l[0],
                next: l[1],
                end: l[2],
            });
        }
        ReplaySupplier {
            recorded: Mutex::new(recorded),
            then,
        }
    }
}

impl SplitSupplier for ReplaySupplier {
    fn next_split(&self, provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
        {
            let mut all = self.recorded.lock().expect("replay lock poisoned");
            if let Some(recorded) = all.get_mut(&provider) {
                while let Some(front) = recorded.front_mut() {
                    if front.repetition < repetition {
                        // The pipeline moved past a repetition it has splits of: it stopped
                        // reading this provider's repetition early (a zip whose other input
                        // ended), as the pipeline that recorded them did, or it is not that
                        // pipeline (its output is not determined by its splits). Either way
                        // those splits are not read any more.
                        recorded.pop_front();
                        continue;
                    }
                    if front.repetition > repetition {
                        break;
                    }
                    let index = front.next;
                    front.next += 1;
                    if front.next == front.end {
                        recorded.pop_front();
                    }
                    return Ok(Some(index));
                }
            }
        }
        self.then.next_split(provider, repetition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out two splits of each provider's repetition, from 100 + 10 * provider on, then
    /// its end.
    struct Fresh(Mutex<Vec<(u32, u64)>>);

    impl SplitSupplier for Fresh {
        fn next_split(&self, provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
            let mut asked = self.0.lock().unwrap();
            let n = asked
                .iter()
                .filter(|a| **a == (provider, repetition))
                .count() as u64;
            asked.push((provider, repetition));
            Ok((n < 2).then_some(100 + 10 * u64::from(provider) + n))
        }
    }

    #[test]
    fn recorded_splits_come_first_in_order_then_fresh_ones() {
        let fresh = Arc::new(Fresh(Mutex::new(Vec::new())));
        // Repetition 0: [3, 5) then [8, 9); repetition 1: [0, 1).
        let replay = ReplaySupplier::new(&[0, 3, 5, 0, 8, 9, 1, 0, 1], &[], fresh.clone());
        let mut got = Vec::new();
        for repetition in 0..2 {
            while let Some(split) = replay.next_split(0, repetition).unwrap() {
                got.push((repetition, split));
            }
        }
        assert_eq!(
            got,
            vec![
                (0, 3),
                (0, 4),
                (0, 8),
                (0, 100),
                (0, 101),
                (1, 0),
                (1, 100),
                (1, 101)
            ]
        );
    }

    #[test]
    fn each_provider_gets_its_own_recorded_splits_in_order() {
        let fresh = Arc::new(Fresh(Mutex::new(Vec::new())));
        // Granted in this order: provider 0 [0, 2), provider 1 [5, 7), provider 0 [4, 5),
        // provider 1 repetition 1 [0, 1).
        let replay = ReplaySupplier::new(
            &[0, 0, 2, 0, 5, 7, 0, 4, 5, 1, 0, 1],
            &[0, 1, 0, 1],
            fresh.clone(),
        );
        // The pipeline reads the providers in an order of its own: each gets its own splits.
        let mut got = Vec::new();
        for (provider, repetition) in [
            (1, 0),
            (0, 0),
            (1, 0),
            (0, 0),
            (0, 0),
            (1, 0),
            (1, 1),
            (1, 1),
            (0, 0),
        ] {
            got.push((provider, replay.next_split(provider, repetition).unwrap()));
        }
        assert_eq!(
            got,
            vec![
                (1, Some(5)),
                (0, Some(0)),
                (1, Some(6)),
                (0, Some(1)),
                (0, Some(4)),
                (1, Some(110)), // provider 1's repetition 0 is replayed: fresh splits follow
                (1, Some(0)),
                (1, Some(110)),
                (0, Some(100)),
            ]
        );
        assert_eq!(*fresh.0.lock().unwrap(), vec![(1, 0), (1, 1), (0, 0)]);
    }

    #[test]
    fn a_provider_that_moved_past_a_recorded_repetition_drops_it() {
        let fresh = Arc::new(Fresh(Mutex::new(Vec::new())));
        // Provider 1 was recorded in repetition 0 and 1; the pipeline asks for repetition 1 at
        // once (its zip ended the pass before it): repetition 0's leftovers are not read.
        let replay = ReplaySupplier::new(&[0, 3, 5, 1, 7, 8], &[1, 1], fresh);
        assert_eq!(replay.next_split(1, 1).unwrap(), Some(7));
        assert_eq!(replay.next_split(0, 0).unwrap(), Some(100));
    }
}
