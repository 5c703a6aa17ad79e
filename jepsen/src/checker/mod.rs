//! The checkers, one property per file, each a pure function of the history (and, for
//! coverage, the schedule). Each returns a `CheckResult`; the run's verdict is the worst of
//! them: any `invalid` makes it invalid, else any `unknown` makes it unknown.
//!
//! Layout:
//! - `at_most_once`: (a) no split of an iteration leased or delivered twice.
//! - `no_lost_state`: (b) acknowledged writes on every node after convergence, nodes agree,
//!   no stale reads.
//! - `progress`: (c) a leader and a complete fresh epoch within 15 s of the heal, and no
//!   delivery gap over `--max-delivery-gap`.
//! - `coverage`: (d) the planned faults happened while the workload ran.
//! - `loss_bound`: (e) under exactly-once delivery, every split of a complete epoch delivered
//!   once; under at-most-once, every leased split delivered once, or lost with the worker
//!   holding it.
//! - `trainer`: (f) the trainer's epochs (a reading process killed and restored from its
//!   last state) deliver exactly once relative to the states restored.
//! - `gaps`: the delivery gaps of a history, per fault (used by `progress` and the report).

pub mod at_most_once;
pub mod coverage;
pub mod gaps;
pub mod loss_bound;
pub mod no_lost_state;
pub mod progress;
pub mod trainer;

use crate::history::{Event, Kind};
use crate::schedule::Schedule;
use serde::Serialize;
use sluice_client::Delivery;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// How long after the heal the cluster has to make progress.
pub const PROGRESS_DEADLINE_MS: u64 = 15_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Valid,
    Unknown,
    Invalid,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Valid => "valid",
            Verdict::Unknown => "unknown",
            Verdict::Invalid => "invalid",
        })
    }
}

/// One checker's finding.
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    pub name: &'static str,
    pub verdict: Verdict,
    pub counts: BTreeMap<&'static str, u64>,
    /// What is wrong (invalid) or missing (unknown); the first few of each kind.
    pub problems: Vec<String>,
}

/// Problems listed per checker at most (the counts carry the totals).
pub const MAX_PROBLEMS: usize = 20;

impl CheckResult {
    fn new(name: &'static str) -> CheckResult {
        CheckResult {
            name,
            verdict: Verdict::Valid,
            counts: BTreeMap::new(),
            problems: Vec::new(),
        }
    }

    /// Lowers the verdict to `verdict` (if worse) and notes why.
    fn flag(&mut self, verdict: Verdict, problem: String) {
        self.verdict = self.verdict.max(verdict);
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(problem);
        }
    }

    fn count(&mut self, name: &'static str, n: u64) {
        *self.counts.entry(name).or_insert(0) += n;
    }
}

/// What the run asked the checkers to hold it to, beyond the fixed properties.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckOptions {
    /// The longest delivery gap allowed (`--max-delivery-gap`); `None`: gaps are only reported.
    pub max_delivery_gap: Option<Duration>,
    /// Judge every epoch as this delivery instead of the one the history records
    /// (`check --delivery`).
    pub delivery: Option<Delivery>,
}

/// Every checker over one history.
pub fn check_all(
    events: &[Event],
    schedule: &Schedule,
    options: &CheckOptions,
) -> Vec<CheckResult> {
    vec![
        at_most_once::check(events),
        loss_bound::check(events, options.delivery),
        no_lost_state::check(events),
        progress::check(events, options.max_delivery_gap),
        coverage::check(events, schedule),
        trainer::check(events),
    ]
}

/// The worst verdict.
pub fn overall(results: &[CheckResult]) -> Verdict {
    results
        .iter()
        .map(|r| r.verdict)
        .max()
        .unwrap_or(Verdict::Unknown)
}

/// Operation outcomes per type, for the verdict line.
pub fn op_counts(events: &[Event]) -> BTreeMap<&'static str, u64> {
    let mut counts = BTreeMap::new();
    for e in events {
        if !matches!(e.f.as_str(), "register" | "read" | "status" | "epoch") {
            continue;
        }
        let key = match e.kind {
            Kind::Invoke => "ops",
            Kind::Ok => "ok",
            Kind::Fail => "fail",
            Kind::Info => "info",
        };
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

/// The harness's heal event time, if the run got there.
pub(crate) fn heal_time(events: &[Event]) -> Option<u64> {
    events
        .iter()
        .find(|e| e.process == "harness" && e.f == "heal" && e.kind == Kind::Ok)
        .map(|e| e.t_ms)
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Hand-made histories for the checker tests.
    use crate::history::{Event, Kind};
    use serde_json::{json, Value};

    pub fn ev(t: u64, process: &str, kind: Kind, f: &str, value: Value) -> Event {
        Event::new(t, process, kind, f, value)
    }

    pub fn lease(t: u64, worker: &str, iteration: u64, start: u64, end: u64) -> Event {
        ev(
            t,
            worker,
            Kind::Ok,
            "lease",
            json!({"worker": worker, "task": 1, "iteration": iteration, "provider": 0,
                   "repetition": 0, "start": start, "end": end, "end_of_splits": false}),
        )
    }

    pub fn element(t: u64, client: &str, job: &str, split: u64) -> Event {
        ev(
            t,
            client,
            Kind::Ok,
            "element",
            json!({"job": job, "split": split}),
        )
    }

    /// A node's final status with the given datasets, jobs and cursor of iteration 1.
    pub fn final_status(t: u64, node: u64, applied: u64, datasets: &[&str], next: u64) -> Event {
        ev(
            t,
            "harness",
            Kind::Ok,
            "final-status",
            json!({"node": node, "status": {
                "node": node, "state": if node == 1 { "Leader" } else { "Follower" },
                "applied_index": applied, "datasets": datasets,
                "jobs": [{"job_id": 1, "name": "j1", "dataset_id": "1", "sharding_policy": "DYNAMIC"}],
                "iterations": [{"iteration_id": 1, "job_id": 1, "repetition": 0, "tasks": [1],
                                "num_clients": 0, "finished": true,
                                "split_cursors": [{"repetition": 0, "next": next, "num_splits": 100}]}],
                "workers": [], "members": [],
            }}),
        )
    }
}
