//! (e) The loss bound. How much may be lost depends on the job's delivery (recorded with each
//! epoch; `run --delivery`):
//! - exactly-once (the default): every split of a complete epoch is delivered exactly once,
//!   whatever the faults. A split delivered twice, or never, is a violation; a lost split is
//!   reported with the lease that held it and what happened to that worker.
//! - at-most-once (tf.data's): every split leased is delivered exactly once, or was leased to a
//!   worker that died (or was removed) before producing it. A split delivered twice, or lost
//!   while the worker holding it lived, is a violation.
//!
//! Stated in the history's terms, for each complete epoch (its reader saw the end of input):
//! - a split is held by the lease that covers it, i.e. by one incarnation of one worker process
//!   (`worker-I lease`, with its `incarnation` and `task`). Under exactly-once, a task that takes
//!   a failed task's stream over produces that task's leased splits again without leasing them
//!   (it replays the leases the dispatcher recorded), so no lease event names it: a split's
//!   holder is the task that leased it first;
//! - delivered: a reader's `element` events of that job and split; two or more is a violation;
//! - lost (none) is a violation under exactly-once. Under at-most-once it is allowed only if,
//!   before the epoch ended, the holding incarnation died (`worker-I exit`), or the dispatcher
//!   removed the worker (`monitor worker-removed`), or the worker was given a new task of the
//!   same iteration (its old task was removed); and only if no later split of the same task was
//!   delivered: a task produces its splits in order, so a later split delivered proves this one
//!   was produced before the death, and lost in transit. Either way the loss is counted as lost
//!   with the worker (`lost_with_worker`) or while it lived (`lost_while_worker_lived`);
//! - a split of a complete epoch that no recorded lease covers (the reply of a lease can be lost
//!   with the process that asked for it) is a violation under exactly-once; under at-most-once
//!   it may be lost only if some worker died or was removed during the epoch.
//!
//! Epochs that did not complete (cut short at the end of the fault phase, or abandoned) are not
//! judged for loss: their reader stopped before the rest arrived. A worker process that exited
//! on its own (`cause: crash`) is a violation in itself.
//!
//! A job's iteration comes from the monitor (`iteration` events), or from the final statuses.

use super::{CheckResult, Verdict};
use crate::history::{parse_delivery, recorded_delivery, Event, Kind, LeaseRange};
use sluice_client::Delivery;
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
    delivery: Delivery,
}

/// What the history says about the worker processes.
#[derive(Default)]
struct Fates {
    /// (worker, incarnation) -> time of death and its cause
    deaths: HashMap<(String, u64), (u64, String)>,
    /// worker -> times the dispatcher was seen removing it
    removals: HashMap<String, Vec<u64>>,
}

/// `delivery`: judge every epoch as this, whatever the history records (`check --delivery`).
pub fn check(events: &[Event], delivery: Option<Delivery>) -> CheckResult {
    let mut result = CheckResult::new("loss-bound");
    // Epochs that record no delivery: the run's, or at-most-once (an older build's history).
    let run_delivery = delivery
        .or_else(|| recorded_delivery(events))
        .unwrap_or(Delivery::AtMostOnce);
    let mut leases: BTreeMap<u64, Vec<Lease>> = BTreeMap::new();
    let mut job_of: HashMap<u64, String> = HashMap::new();
    let mut epochs: BTreeMap<String, Epoch> = BTreeMap::new();
    let mut delivered: HashMap<(String, u64), u64> = HashMap::new();
    let mut fates = Fates::default();
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
                    let recorded = v["delivery"].as_str().and_then(|d| parse_delivery(d).ok());
                    epochs.insert(
                        job.to_string(),
                        Epoch {
                            start_ms: e.t_ms,
                            end_ms: None,
                            complete: false,
                            splits: v["splits"].as_u64().unwrap_or(0),
                            delivery: delivery.or(recorded).unwrap_or(run_delivery),
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
                let cause = v["cause"].as_str().unwrap_or("unknown cause").to_string();
                fates
                    .deaths
                    .entry((e.process.clone(), incarnation))
                    .or_insert((e.t_ms, cause));
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
                fates.removals.entry(worker).or_default().push(e.t_ms);
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
        "epochs_exactly_once",
        "epochs_at_most_once",
    ] {
        result.count(key, 0);
    }
    for epoch in epochs.values().filter(|e| e.complete) {
        match epoch.delivery {
            Delivery::ExactlyOnce => result.count("epochs_exactly_once", 1),
            Delivery::AtMostOnce => result.count("epochs_at_most_once", 1),
        }
    }

    // Jobs whose leases were judged below; the other complete epochs are judged as unleased.
    let mut judged: BTreeSet<&str> = BTreeSet::new();
    for (iteration, held) in &leases {
        let Some(job) = job_of.get(iteration) else {
            let splits: u64 = held.iter().map(|l| l.end - l.start).sum();
            result.count("not_judged", splits);
            continue;
        };
        judged.insert(job.as_str());
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
        // Each leased split once, with the leases that cover it (one, unless a lease was handed
        // out twice, which the at-most-once checker reports), in the order they were recorded.
        let mut holders: BTreeMap<u64, Vec<&Lease>> = BTreeMap::new();
        for lease in held.iter().filter(|l| l.end > l.start) {
            for split in lease.start..lease.end {
                holders.entry(split).or_default().push(lease);
            }
        }
        // Splits delivered twice, and lost ones, grouped by their first holder: the lease's
        // index in `held`, with whether a later split of its task was delivered.
        let index_of = |lease: &Lease| held.iter().position(|l| std::ptr::eq(l, lease));
        let mut twice: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        let mut lost: BTreeMap<usize, (Vec<u64>, bool)> = BTreeMap::new();
        for (&split, covering) in &holders {
            result.count("leased_splits", 1);
            let first = index_of(covering[0]).unwrap_or(0);
            match (times(split), epoch) {
                (1, _) => result.count("delivered_once", 1),
                (2.., _) => twice.entry(first).or_default().push(split),
                (0, Some(epoch)) if epoch.complete => {
                    let end = epoch.end_ms.unwrap_or(u64::MAX);
                    let produced_later = covering.iter().any(|lease| {
                        produced
                            .get(&(lease.worker.as_str(), lease.incarnation, lease.task))
                            .is_some_and(|last| *last > split)
                    });
                    // Under exactly-once a later split may come from the task that took the
                    // stream over, so it proves nothing about this one: the worker's fate
                    // alone says which count the loss goes to (both are violations).
                    let in_order = epoch.delivery == Delivery::AtMostOnce && produced_later;
                    let with_worker = !in_order
                        && covering
                            .iter()
                            .all(|lease| excused(lease, held, &fates, end));
                    if with_worker {
                        result.count("lost_with_worker", 1);
                    } else {
                        result.count("lost_while_worker_lived", 1);
                    }
                    if epoch.delivery == Delivery::ExactlyOnce || !with_worker {
                        let group = lost.entry(first).or_default();
                        group.0.push(split);
                        group.1 |= produced_later;
                    }
                }
                (0, _) => result.count("not_judged", 1),
            }
        }
        for (index, splits) in twice {
            result.count("delivered_twice", splits.len() as u64);
            result.flag(
                Verdict::Invalid,
                format!(
                    "{} splits of job {job} delivered more than once: {}; held by {}",
                    splits.len(),
                    ranges(&splits),
                    holder(&held[index])
                ),
            );
        }
        let Some(epoch) = epoch else { continue };
        let end = epoch.end_ms.unwrap_or(0);
        for (index, (splits, in_transit)) in lost {
            let lease = &held[index];
            let problem = match epoch.delivery {
                Delivery::ExactlyOnce => format!(
                    "{} splits of job {job} (iteration {iteration}) lost under exactly-once delivery: {}; \
                     held by {}, which {} before the epoch ended at {end} ms",
                    splits.len(),
                    ranges(&splits),
                    holder(lease),
                    fate(lease, held, &fates, end),
                ),
                Delivery::AtMostOnce => format!(
                    "{} splits of job {job} (iteration {iteration}) lost while their worker lived: {}; \
                     held by {}, which {} before the epoch ended at {end} ms",
                    splits.len(),
                    ranges(&splits),
                    holder(lease),
                    if in_transit {
                        "had produced them (a later split of its task was delivered)"
                    } else {
                        "neither died nor was removed"
                    },
                ),
            };
            result.flag(Verdict::Invalid, problem);
        }
        let covered: BTreeSet<u64> = holders.keys().copied().collect();
        if epoch.complete {
            unleased(&mut result, job, epoch, &covered, &delivered, &fates);
        }
    }
    // Complete exactly-once epochs of jobs with no lease judged above (none recorded, or their
    // iteration unknown): every split must still have arrived; a lost one has no known lease.
    // (Under at-most-once, what such an epoch may lose cannot be told.)
    let unjudged = |(j, e): &(&String, &Epoch)| {
        e.complete && e.delivery == Delivery::ExactlyOnce && !judged.contains(j.as_str())
    };
    for (job, epoch) in epochs.iter().filter(unjudged) {
        unleased(
            &mut result,
            job,
            epoch,
            &BTreeSet::new(),
            &delivered,
            &fates,
        );
    }
    result
}

/// Judges the splits of a complete epoch of `job` that no recorded lease covers (`covered`:
/// the ones leases cover): lost ones are a violation under exactly-once, and under
/// at-most-once unless some worker died or was removed during the epoch.
fn unleased(
    result: &mut CheckResult,
    job: &str,
    epoch: &Epoch,
    covered: &BTreeSet<u64>,
    delivered: &HashMap<(String, u64), u64>,
    fates: &Fates,
) {
    let end = epoch.end_ms.unwrap_or(u64::MAX);
    let lost: Vec<u64> = (0..epoch.splits)
        .filter(|s| !covered.contains(s) && !delivered.contains_key(&(job.to_string(), *s)))
        .collect();
    if lost.is_empty() {
        return;
    }
    result.count("lost_unleased", lost.len() as u64);
    let mut left: Vec<String> = fates
        .deaths
        .iter()
        .filter(|(_, (t, _))| *t >= epoch.start_ms && *t <= end)
        .map(|((worker, incarnation), (t, cause))| {
            format!("{worker} incarnation {incarnation} exited at {t} ms ({cause})")
        })
        .chain(fates.removals.iter().flat_map(|(worker, times)| {
            times
                .iter()
                .filter(move |t| **t >= epoch.start_ms && **t <= end)
                .map(move |t| format!("the dispatcher removed {worker} at {t} ms"))
        }))
        .collect();
    left.sort();
    match epoch.delivery {
        Delivery::ExactlyOnce => result.flag(
            Verdict::Invalid,
            format!(
                "{} splits of job {job} lost under exactly-once delivery with no lease known for them: {}; \
                 during the epoch ({}..{} ms): {}",
                lost.len(),
                ranges(&lost),
                epoch.start_ms,
                end,
                if left.is_empty() {
                    "no worker died or was removed".to_string()
                } else {
                    left.join(", ")
                }
            ),
        ),
        Delivery::AtMostOnce if left.is_empty() => result.flag(
            Verdict::Invalid,
            format!(
                "{} splits of job {job} (first {}) were lost with no lease recorded, and no worker died or was removed during the epoch",
                lost.len(),
                lost[0]
            ),
        ),
        Delivery::AtMostOnce => {}
    }
}

/// A lease's holder, for people.
fn holder(lease: &Lease) -> String {
    format!(
        "{} incarnation {} (task {}, lease [{}, {}) at {} ms)",
        lease.worker, lease.incarnation, lease.task, lease.start, lease.end, lease.t_ms
    )
}

/// What happened to the holder of `lease` before the epoch ended at `end`: as the end of a
/// sentence starting with the holder.
fn fate(lease: &Lease, held: &[Lease], fates: &Fates, end: u64) -> String {
    let mut what = Vec::new();
    if let Some((t, cause)) = fates
        .deaths
        .get(&(lease.worker.clone(), lease.incarnation))
        .filter(|(t, _)| *t <= end)
    {
        what.push(format!("exited at {t} ms ({cause})"));
    }
    for t in removals_of(lease, fates, end) {
        what.push(format!("was removed by the dispatcher at {t} ms"));
    }
    if let Some(l) = held.iter().find(|l| replaces(l, lease, end)) {
        what.push(format!(
            "was given task {} of the iteration at {} ms",
            l.task, l.t_ms
        ));
    }
    if what.is_empty() {
        "neither died nor was removed".to_string()
    } else {
        what.join(", ")
    }
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

/// Whether a split of `lease` may be lost under at-most-once: before the epoch ended at `end`,
/// its incarnation died, or its worker was removed (after the lease), or the worker got another
/// task of the iteration (`held`: the iteration's leases), which means its old task was removed.
fn excused(lease: &Lease, held: &[Lease], fates: &Fates, end: u64) -> bool {
    let died = fates
        .deaths
        .get(&(lease.worker.clone(), lease.incarnation))
        .is_some_and(|(t, _)| *t <= end);
    let removed = removals_of(lease, fates, end).next().is_some();
    let replaced = held.iter().any(|l| replaces(l, lease, end));
    died || removed || replaced
}

/// The times the dispatcher removed `lease`'s worker after the lease and before `end`.
fn removals_of<'a>(lease: &'a Lease, fates: &'a Fates, end: u64) -> impl Iterator<Item = u64> + 'a {
    fates
        .removals
        .get(&lease.worker)
        .into_iter()
        .flatten()
        .copied()
        .filter(move |t| *t <= end && t + REMOVAL_SLACK_MS >= lease.t_ms)
}

/// Whether lease `l` is of another task of the same worker, recorded after `lease` and before
/// `end`.
fn replaces(l: &Lease, lease: &Lease, end: u64) -> bool {
    l.worker == lease.worker && l.task != lease.task && l.t_ms >= lease.t_ms && l.t_ms <= end
}

#[cfg(test)]
#[path = "loss_bound_tests.rs"]
mod tests;
