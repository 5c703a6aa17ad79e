//! `LeaseBook`: the leases seen so far and each job's iteration, so a reader can record with
//! every element the worker (and incarnation) whose lease held its split.
//!
//! Only a convenience for people reading the history: a lease line may be read from its
//! worker's pipe after the element it covers reached a reader, so an element may go without a
//! worker. The checkers attribute splits from the lease events themselves. Under exactly-once
//! delivery the worker named is the one whose lease held the split: after a takeover, another
//! worker's task may have produced it (it replays the recorded leases without leasing them).

use crate::history::LeaseRange;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A clone-able handle on the book.
#[derive(Clone, Default)]
pub struct LeaseBook(Arc<Mutex<Book>>);

#[derive(Default)]
struct Book {
    /// Lease ranges of provider 0, repetition 0 (a `range` job's splits), per iteration:
    /// `(start, end, worker, incarnation)`.
    leases: HashMap<u64, Vec<(u64, u64, String, u64)>>,
    /// Each job's iteration (a harness job has one).
    iterations: HashMap<String, u64>,
}

impl LeaseBook {
    /// Adds a lease event's value (as the history records it).
    pub fn add(&self, lease: &Value) {
        let (Some(range), Some(incarnation)) =
            (LeaseRange::of(lease), lease["incarnation"].as_u64())
        else {
            return;
        };
        if !range.is_first_range() {
            return;
        }
        let LeaseRange {
            iteration,
            start,
            end,
            ..
        } = range;
        let worker = lease["worker"].as_str().unwrap_or_default().to_string();
        // A std mutex: held only to update the maps, never across `.await`.
        let mut book = self.0.lock().expect("lease book poisoned");
        book.leases
            .entry(iteration)
            .or_default()
            .push((start, end, worker, incarnation));
    }

    /// Records job `job`'s iteration; returns whether it was new.
    pub fn set_iteration(&self, job: &str, iteration: u64) -> bool {
        let mut book = self.0.lock().expect("lease book poisoned");
        book.iterations.insert(job.to_string(), iteration).is_none()
    }

    /// The worker and incarnation whose lease holds split `split` of job `job`, if known.
    pub fn holder(&self, job: &str, split: u64) -> Option<(String, u64)> {
        let book = self.0.lock().expect("lease book poisoned");
        let iteration = book.iterations.get(job)?;
        book.leases
            .get(iteration)?
            .iter()
            .find(|(start, end, _, _)| (*start..*end).contains(&split))
            .map(|(_, _, worker, incarnation)| (worker.clone(), *incarnation))
    }
}
