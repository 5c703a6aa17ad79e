//! `ReplaySupplier`: the splits of a task that takes over an exactly-once stream.
//!
//! The stream's content is a function of the splits its tasks consumed, in order. The task
//! taking it over first consumes the leases recorded for the stream (the dispatcher hands them
//! over in the task's definition), in the order they were granted, and only then leases new
//! splits: so its pipeline produces the same elements, in the same order, as the failed
//! worker's did, and then goes on. A recorded repetition that ends before the next recorded one
//! starts asks the dispatcher, which answers with that repetition's end, as it answered the
//! task that recorded it.

use sluice_element::DatasetError;
use sluice_executor::SplitSupplier;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Splits `[next, end)` of a repetition.
#[derive(Debug)]
struct Recorded {
    repetition: u64,
    next: u64,
    end: u64,
}

pub struct ReplaySupplier {
    recorded: Mutex<VecDeque<Recorded>>,
    then: Arc<dyn SplitSupplier>,
}

impl ReplaySupplier {
    /// `leases` as the dispatcher sends them: flattened triples `repetition, start, end`
    /// (an incomplete triple at the end is ignored; the dispatcher sends whole ones).
    pub fn new(leases: &[u64], then: Arc<dyn SplitSupplier>) -> ReplaySupplier {
        let recorded = leases
            .chunks_exact(3)
            .filter(|l| l[1] < l[2])
            .map(|l| Recorded {
                repetition: l[0],
                next: l[1],
                end: l[2],
            })
            .collect();
        ReplaySupplier {
            recorded: Mutex::new(recorded),
            then,
        }
    }
}

impl SplitSupplier for ReplaySupplier {
    fn next_split(&self, provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
        {
            let mut recorded = self.recorded.lock().expect("replay lock poisoned");
            while let Some(front) = recorded.front_mut() {
                if front.repetition < repetition {
                    // The pipeline moved past a repetition it has splits of: not the pipeline
                    // that recorded them (only a pipeline whose output is not determined by its
                    // splits does this); those splits cannot be produced any more.
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
        self.then.next_split(provider, repetition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out a repetition's splits from 100 on, then its end.
    struct Fresh(Mutex<Vec<(u64, u64)>>);

    impl SplitSupplier for Fresh {
        fn next_split(&self, _: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
            let mut asked = self.0.lock().unwrap();
            let n = asked.iter().filter(|(r, _)| *r == repetition).count() as u64;
            asked.push((repetition, n));
            Ok((n < 2).then_some(100 + n))
        }
    }

    #[test]
    fn recorded_splits_come_first_in_order_then_fresh_ones() {
        let fresh = Arc::new(Fresh(Mutex::new(Vec::new())));
        // Repetition 0: [3, 5) then [8, 9); repetition 1: [0, 1).
        let replay = ReplaySupplier::new(&[0, 3, 5, 0, 8, 9, 1, 0, 1], fresh.clone());
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
}
