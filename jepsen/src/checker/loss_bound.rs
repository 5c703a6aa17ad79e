//! (e) The loss bound: every split leased is delivered exactly once, or was leased to a worker
//! that died (or was removed) before producing it. A split delivered twice, or lost while the
//! worker holding it lived, is a violation.
//!
//! Stated in the history's terms, for each complete epoch (its reader saw the end of input):
//! - a split is held by the lease that covers it, i.e. by one incarnation of one worker process
//!   (`worker-I lease`, with its `incarnation` and `task`);
//! - delivered: a reader's `element` events of that job and split; two or more is a violation;
//! - lost (none) is allowed only if, before the epoch ended, the holding incarnation died
//!   (`worker-I exit`), or the dispatcher removed the worker (`monitor worker-removed`), or the
//!   worker was given a new task of the same iteration (its old task was removed); and only if
//!   no later split of the same task was delivered: a task produces its splits in order, so a
//!   later split delivered proves this one was produced before the death, and lost in transit;
//! - a split of a complete epoch that no recorded lease covers (the reply of a lease can be lost
//!   with the process that asked for it) may be lost only if some worker died or was removed
//!   during the epoch.
//!
//! Epochs that did not complete (cut short at the end of the fault phase, or abandoned) are not
//! judged for loss: their reader stopped before the rest arrived. A worker process that exited
//! on its own (`cause: crash`) is a violation in itself.
//!
//! A job's iteration comes from the monitor (`iteration` events), or from the final statuses.

use super::{CheckResult, Verdict};
use crate::history::{Event, Kind, LeaseRange};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A lease as the history records it.
struct Lease {
    t_ms: u64,
    worker: String,
    incarnation: u64,
    task: u64,
    start: u64,
    end: u64,
}

/// One reader epoch of a job.
struct Epoch {
    start_ms: u64,
    end_ms: Option<u64>,
    complete: bool,
    splits: u64,
}

pub fn check(events: &[Event]) -> CheckResult {
    let mut result = CheckResult::new("loss-bound");
    let mut leases: BTreeMap<u64, Vec<Lease>> = BTreeMap::new();
    let mut job_of: HashMap<u64, String> = HashMap::new();
    let mut epochs: BTreeMap<String, Epoch> = BTreeMap::new();
    let mut delivered: HashMap<(String, u64), u64> = HashMap::new();
    // (worker, incarnation) -> time of death
    let mut deaths: HashMap<(String, u64), u64> = HashMap::new();
    // worker -> times the dispatcher was seen removing it
    let mut removals: HashMap<String, Vec<u64>> = HashMap::new();
    for e in events {
        let v = &e.value;
        match (e.f.as_str(), e.kind) {
            ("lease", Kind::Ok) if v["end_of_splits"].as_bool() != Some(true) => {
                let Some(range) = LeaseRange::of(v).filter(LeaseRange::is_first_range) else {
                    continue;
                };
                leases.entry(range.iteration).or_default().push(Lease {
                    t_ms: e.t_ms,
                    worker: v["worker"].as_str().unwrap_or(&e.process).to_string(),
                    incarnation: v["incarnation"].as_u64().unwrap_or(0),
                    task: v["task"].as_u64().unwrap_or(0),
                    start: range.start,
                    end: range.end,
                });
            }
            ("lease", Kind::Ok) => {
                // An end-of-splits lease still names the worker's task of the iteration.
                if let (Some(it), Some(task)) = (v["iteration"].as_u64(), v["task"].as_u64()) {
                    leases.entry(it).or_default().push(Lease {
                        t_ms: e.t_ms,
                        worker: v["worker"].as_str().unwrap_or(&e.process).to_string(),
                        incarnation: v["incarnation"].as_u64().unwrap_or(0),
                        task,
                        start: 0,
                        end: 0,
                    });
                }
            }
            ("iteration", Kind::Ok) => {
                if let (Some(job), Some(it)) = (v["job"].as_str(), v["iteration"].as_u64()) {
                    job_of.entry(it).or_insert_with(|| job.to_string());
                }
            }
            ("final-status", Kind::Ok) => {
                let status = &v["status"];
                let names: HashMap<u64, &str> = status["jobs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|j| Some((j["job_id"].as_u64()?, j["name"].as_str()?)))
                    .collect();
                for it in status["iterations"].as_array().into_iter().flatten() {
                    let id = it["iteration_id"].as_u64();
                    let job = it["job_id"].as_u64().and_then(|j| names.get(&j));
                    if let (Some(id), Some(job)) = (id, job) {
                        job_of.entry(id).or_insert_with(|| job.to_string());
                    }
                }
            }
            ("epoch", Kind::Invoke) => {
                if let Some(job) = v["job"].as_str() {
                    epochs.insert(
                        job.to_string(),
                        Epoch {
                            start_ms: e.t_ms,
                            end_ms: None,
                            complete: false,
                            splits: v["splits"].as_u64().unwrap_or(0),
                        },
                    );
                }
            }
            ("epoch", kind) => {
                if let Some(epoch) = v["job"].as_str().and_then(|j| epochs.get_mut(j)) {
                    epoch.end_ms = Some(e.t_ms);
                    epoch.complete = kind == Kind::Ok;
                }
            }
            ("element", Kind::Ok) => {
                let (Some(job), Some(split)) = (v["job"].as_str(), v["split"].as_u64()) else {
                    continue;
                };
                *delivered.entry((job.to_string(), split)).or_insert(0) += 1;
            }
            ("exit", Kind::Ok) => {
                let incarnation = v["incarnation"].as_u64().unwrap_or(0);
                deaths
                    .entry((e.process.clone(), incarnation))
                    .or_insert(e.t_ms);
                if v["cause"] == "crash" {
                    result.count("crashes", 1);
                    result.flag(
                        Verdict::Invalid,
                        format!(
                            "{} incarnation {incarnation} exited on its own at {} ms",
                            e.process, e.t_ms
                        ),
                    );
                }
            }
            ("worker-removed", Kind::Ok) => {
                let worker = v["worker"].as_str().unwrap_or_default().to_string();
                removals.entry(worker).or_default().push(e.t_ms);
            }
            _ => {}
        }
    }
    for key in [
        "leased_splits",
        "delivered_once",
        "delivered_twice",
        "lost_with_worker",
        "lost_while_worker_lived",
        "lost_unleased",
        "not_judged",
        "crashes",
    ] {
        result.count(key, 0);
    }

    for (iteration, held) in &leases {
        let Some(job) = job_of.get(iteration) else {
            let splits: u64 = held.iter().map(|l| l.end - l.start).sum();
            result.count("not_judged", splits);
            continue;
        };
        let epoch = epochs.get(job);
        let times = |split: u64| delivered.get(&(job.clone(), split)).copied().unwrap_or(0);
        // The last split each holder (worker, incarnation, task) is known to have produced: a
        // task produces its splits in order, so a split before it was produced too.
        let mut produced: HashMap<(&str, u64, u64), u64> = HashMap::new();
        for lease in held {
            for split in (lease.start..lease.end).filter(|s| times(*s) > 0) {
                let last = produced
                    .entry((&lease.worker, lease.incarnation, lease.task))
                    .or_insert(split);
                *last = (*last).max(split);
            }
        }
        let mut covered: BTreeSet<u64> = BTreeSet::new();
        for lease in held.iter().filter(|l| l.end > l.start) {
            let mut twice = Vec::new();
            let mut lost_alive = Vec::new();
            let mut in_transit = false;
            for split in lease.start..lease.end {
                covered.insert(split);
                result.count("leased_splits", 1);
                match (times(split), epoch) {
                    (1, _) => result.count("delivered_once", 1),
                    (2.., _) => twice.push(split),
                    (0, Some(epoch)) if epoch.complete => {
                        let end = epoch.end_ms.unwrap_or(u64::MAX);
                        let produced_later = produced
                            .get(&(lease.worker.as_str(), lease.incarnation, lease.task))
                            .is_some_and(|last| *last > split);
                        if !produced_later && excused(lease, held, &deaths, &removals, end) {
                            result.count("lost_with_worker", 1);
                        } else {
                            in_transit |= produced_later;
                            lost_alive.push(split);
                        }
                    }
                    (0, _) => result.count("not_judged", 1),
                }
            }
            let holder = format!(
                "{} incarnation {} (task {}, lease [{}, {}) at {} ms)",
                lease.worker, lease.incarnation, lease.task, lease.start, lease.end, lease.t_ms
            );
            if !twice.is_empty() {
                result.count("delivered_twice", twice.len() as u64);
                result.flag(
                    Verdict::Invalid,
                    format!(
                        "{} splits of job {job} delivered more than once: {}; held by {holder}",
                        twice.len(),
                        ranges(&twice)
                    ),
                );
            }
            if !lost_alive.is_empty() {
                result.count("lost_while_worker_lived", lost_alive.len() as u64);
                result.flag(
                    Verdict::Invalid,
                    format!(
                        "{} splits of job {job} (iteration {iteration}) lost while their worker lived: {}; \
                         held by {holder}, which {} before the epoch ended at {} ms",
                        lost_alive.len(),
                        ranges(&lost_alive),
                        if in_transit {
                            "had produced them (a later split of its task was delivered)"
                        } else {
                            "neither died nor was removed"
                        },
                        epoch.and_then(|e| e.end_ms).unwrap_or(0)
                    ),
                );
            }
        }
        // Splits of a complete epoch that no recorded lease covers.
        if let Some(epoch) = epoch.filter(|e| e.complete) {
            let end = epoch.end_ms.unwrap_or(u64::MAX);
            let someone_left = deaths
                .values()
                .chain(removals.values().flatten())
                .any(|t| *t >= epoch.start_ms && *t <= end);
            let lost: Vec<u64> = (0..epoch.splits)
                .filter(|s| !covered.contains(s) && !delivered.contains_key(&(job.clone(), *s)))
                .collect();
            if !lost.is_empty() {
                result.count("lost_unleased", lost.len() as u64);
                if !someone_left {
                    result.flag(
                        Verdict::Invalid,
                        format!(
                            "{} splits of job {job} (first {}) were lost with no lease recorded, and no worker died or was removed during the epoch",
                            lost.len(),
                            lost[0]
                        ),
                    );
                }
            }
        }
    }
    result
}

/// `3, 4, 5, 9` as `3..=5, 9`.
fn ranges(splits: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < splits.len() {
        let mut j = i;
        while j + 1 < splits.len() && splits[j + 1] == splits[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            splits[i].to_string()
        } else {
            format!("{}..={}", splits[i], splits[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// How much earlier than a lease's record a removal may be seen and still count for it: the
/// lease line reaches the history through a pipe, a little after the worker got it.
const REMOVAL_SLACK_MS: u64 = 500;

/// Whether a split of `lease` may be lost: before the epoch ended at `end`, its incarnation
/// died, or its worker was removed (after the lease), or the worker got another task of the
/// iteration (`held`: the iteration's leases), which means its old task was removed.
fn excused(
    lease: &Lease,
    held: &[Lease],
    deaths: &HashMap<(String, u64), u64>,
    removals: &HashMap<String, Vec<u64>>,
    end: u64,
) -> bool {
    let died = deaths
        .get(&(lease.worker.clone(), lease.incarnation))
        .is_some_and(|t| *t <= end);
    let removed = removals
        .get(&lease.worker)
        .into_iter()
        .flatten()
        .any(|t| *t <= end && t + REMOVAL_SLACK_MS >= lease.t_ms);
    let replaced = held.iter().any(|l| {
        l.worker == lease.worker && l.task != lease.task && l.t_ms >= lease.t_ms && l.t_ms <= end
    });
    died || removed || replaced
}

#[cfg(test)]
#[path = "loss_bound_tests.rs"]
mod tests;
