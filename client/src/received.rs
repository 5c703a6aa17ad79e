//! `Received`: what this reader received from the tasks of an exactly-once job and has not yet
//! reported to the dispatcher, per task, as runs of the task stream's element indices.
//!
//! Task streams add what arrives (`ElementBatch.index_runs`, after dropping what arrived
//! before); the driver reports it every `REPORT_EVERY`, when a task's stream ends, and when it
//! lets go of a task it was asked to release, with the release.

use sluice_types::IndexRuns;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often what arrived is reported.
pub(crate) const REPORT_EVERY: Duration = Duration::from_millis(500);

#[derive(Clone, Debug, Default)]
pub(crate) struct Received(Arc<Mutex<HashMap<u64, IndexRuns>>>);

impl Received {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, IndexRuns>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The elements of a message of `task_id` whose indices are `flattened` (pairs `start,
    /// end`) arrived, but its first `skip` (which had arrived before); returns the indices of
    /// those kept, in order. An error when the indices do not number exactly `count` elements.
    pub(crate) fn record_message(
        &self,
        task_id: u64,
        flattened: &[u64],
        count: usize,
        skip: usize,
    ) -> Result<Vec<(u64, u64)>, String> {
        if flattened.is_empty() {
            return Ok(Vec::new());
        }
        let runs = runs_of(flattened)?;
        let numbered: u64 = runs.iter().map(|(s, e)| e - s).sum();
        if numbered != count as u64 {
            return Err(format!(
                "the worker numbered {numbered} elements of a message of {count}"
            ));
        }
        let mut left_to_skip = skip as u64;
        let mut kept = Vec::with_capacity(runs.len());
        let mut received = self.lock();
        let task = received.entry(task_id).or_default();
        for (start, end) in runs {
            let skipped = left_to_skip.min(end - start);
            left_to_skip -= skipped;
            if start + skipped < end {
                task.insert(start + skipped, end);
                kept.push((start + skipped, end));
            }
        }
        Ok(kept)
    }

    /// Takes what was recorded so far (to report it).
    pub(crate) fn take_all(&self) -> HashMap<u64, IndexRuns> {
        std::mem::take(&mut *self.lock())
    }

    /// Takes what was recorded of one task.
    pub(crate) fn take_task(&self, task_id: u64) -> IndexRuns {
        self.lock().remove(&task_id).unwrap_or_default()
    }

    /// Puts back what a report that failed carried.
    pub(crate) fn put_back(&self, task_id: u64, runs: &IndexRuns) {
        self.lock().entry(task_id).or_default().extend(runs);
    }
}

/// Flattened `start, end` pairs as ascending, disjoint, non-empty runs; anything else is an
/// error naming what is wrong.
fn runs_of(flattened: &[u64]) -> Result<Vec<(u64, u64)>, String> {
    if !flattened.len().is_multiple_of(2) {
        return Err(format!(
            "the worker sent {} index bounds, not pairs",
            flattened.len()
        ));
    }
    let mut runs = Vec::with_capacity(flattened.len() / 2);
    let mut previous_end = 0u64;
    for pair in flattened.chunks_exact(2) {
        let (start, end) = (pair[0], pair[1]);
        if start >= end || (!runs.is_empty() && start < previous_end) {
            return Err(format!(
                "the worker sent indices out of order or empty: [{start}, {end})"
            ));
        }
        previous_end = end;
        runs.push((start, end));
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_recorded_without_what_arrived_before() {
        let received = Received::default();
        // (flattened runs, elements, skipped) -> the task's runs after it, or the error
        type Step = (
            &'static [u64],
            usize,
            usize,
            Result<&'static [(u64, u64)], &'static str>,
        );
        let steps: &[Step] = &[
            (&[], 3, 0, Ok(&[])),
            (&[0, 4], 4, 0, Ok(&[(0, 4)])),
            (&[2, 6], 4, 2, Ok(&[(0, 6)])),
            (&[8, 9, 11, 13], 3, 1, Ok(&[(0, 6), (11, 13)])),
            (
                &[20, 22],
                3,
                0,
                Err("the worker numbered 2 elements of a message of 3"),
            ),
            (
                &[20, 22, 21, 23],
                4,
                0,
                Err("the worker sent indices out of order or empty: [21, 23)"),
            ),
            (
                &[20],
                1,
                0,
                Err("the worker sent 1 index bounds, not pairs"),
            ),
        ];
        for (flattened, count, skip, want) in steps {
            let got = received.record_message(7, flattened, *count, *skip);
            match want {
                Ok(runs) => {
                    assert!(got.is_ok(), "{flattened:?}");
                    let now: Vec<(u64, u64)> = received
                        .lock()
                        .get(&7)
                        .map(|r| r.iter().collect())
                        .unwrap_or_default();
                    assert_eq!(now, runs.to_vec(), "{flattened:?}");
                }
                Err(message) => assert_eq!(got, Err(message.to_string()), "{flattened:?}"),
            }
        }
        assert_eq!(received.take_task(7).count(), 8);
        assert!(received.take_all().is_empty());
    }
}
