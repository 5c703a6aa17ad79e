//! (f) The trainer's epochs: exactly once *relative to its checkpoints*. A trainer killed and
//! restored from its last state must see the epoch as if it had never been killed after that
//! state: what it read before each state it was restored from, plus what it read after its last
//! restore, is the epoch, each split once, none lost (workers died or not: the epochs deliver
//! exactly once).
//!
//! In the history's terms (see `trainer`), per trainer epoch (job), its runs in order: run `i`
//! started at step `s_i` (the `step` of the state it restored from, 0 for the first run). When
//! run `i + 1` restored from step `s_{i+1}`, run `i` *kept* the first `s_{i+1} - s_i` elements it
//! printed (those it read before that state); what it printed after them was read after the
//! state and must come again. The epoch's last run keeps everything it printed. Then:
//! - a split kept twice is a violation (`duplicate_elements`): delivered again after a restore
//!   that should have excluded it, or twice within one run;
//! - in an epoch that completed (its last run read to the end), a split of `0..splits` kept by
//!   no run is a violation (`lost_elements`);
//! - a restore from a step beyond what the run before printed (`s_{i+1} - s_i` greater than its
//!   elements), or behind the step that run started at, or a state of another job, is a
//!   violation too: the state claims elements the reader never wrote out.
//!
//! Epochs cut short (the fault phase ended, a timeout, a reader that died before its first
//! state) are judged for duplicates only. Counts: the epochs, the runs, the restores, the
//! kills, the elements kept, and the elements read after a state and dropped by a restore
//! (`replayed_after_restore`: the work a kill cost).

use super::{CheckResult, Verdict};
use crate::history::{Event, Kind};
use std::collections::{BTreeMap, BTreeSet};

/// One reading process of a trainer epoch.
#[derive(Default)]
struct Run {
    /// The step it started at (its restored state's), 0 for a fresh start.
    start_step: u64,
    /// The restored state's job, when it restored one.
    resumed_job: Option<String>,
    splits: Vec<i64>,
    /// How it ended: `complete`, `killed`, `failed`, ... (`None`: no end recorded).
    end: Option<String>,
    t_ms: u64,
}

#[derive(Default)]
struct Epoch {
    splits: u64,
    complete: bool,
    runs: BTreeMap<u64, Run>,
}

pub fn check(events: &[Event]) -> CheckResult {
    let mut result = CheckResult::new("trainer-exactly-once");
    let mut epochs: BTreeMap<String, Epoch> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.process == crate::trainer::PROCESS)
    {
        let v = &e.value;
        let Some(job) = v["job"].as_str() else {
            result.flag(
                Verdict::Unknown,
                format!("trainer event without a job: {v}"),
            );
            continue;
        };
        let epoch = epochs.entry(job.to_string()).or_default();
        let run = v["run"].as_u64().unwrap_or(0);
        match (e.f.as_str(), e.kind) {
            ("trainer-epoch", Kind::Invoke) => epoch.splits = v["splits"].as_u64().unwrap_or(0),
            ("trainer-epoch", kind) => epoch.complete = kind == Kind::Ok,
            ("trainer-run", Kind::Invoke) => {
                let resume = &v["resume"];
                epoch.runs.insert(
                    run,
                    Run {
                        start_step: resume["step"].as_u64().unwrap_or(0),
                        resumed_job: resume["job"].as_str().map(str::to_string),
                        t_ms: e.t_ms,
                        ..Run::default()
                    },
                );
                if !resume.is_null() {
                    result.count("restores", 1);
                }
            }
            ("trainer-run", kind) => {
                let end = if kind == Kind::Ok {
                    "complete".to_string()
                } else {
                    v["end"].as_str().unwrap_or("unknown").to_string()
                };
                if end == "killed" {
                    result.count("kills", 1);
                }
                epoch.runs.entry(run).or_default().end = Some(end);
            }
            ("trainer-element", Kind::Ok) => match v["split"].as_i64() {
                Some(split) => epoch.runs.entry(run).or_default().splits.push(split),
                None => result.flag(
                    Verdict::Invalid,
                    format!("trainer job {job} run {run} printed a line that is no split: {v}"),
                ),
            },
            _ => {}
        }
    }
    for (job, epoch) in &epochs {
        judge(&mut result, job, epoch);
    }
    for key in [
        "epochs",
        "epochs_complete",
        "runs",
        "restores",
        "kills",
        "elements_kept",
        "replayed_after_restore",
        "duplicate_elements",
        "lost_elements",
    ] {
        result.counts.entry(key).or_insert(0);
    }
    result
}

/// Judges one trainer epoch.
fn judge(result: &mut CheckResult, job: &str, epoch: &Epoch) {
    result.count("epochs", 1);
    result.count("runs", epoch.runs.len() as u64);
    // split -> the runs that kept it (with its position in the run's output)
    let mut kept: BTreeMap<i64, Vec<(u64, usize)>> = BTreeMap::new();
    let runs: Vec<(&u64, &Run)> = epoch.runs.iter().collect();
    for (i, (&number, run)) in runs.iter().enumerate() {
        if let Some(resumed) = &run.resumed_job {
            if resumed != job {
                result.flag(
                    Verdict::Invalid,
                    format!("trainer job {job} run {number} restored a state of job {resumed}"),
                );
            }
        }
        let keeps = match runs.get(i + 1) {
            None => run.splits.len(),
            Some((next_number, next)) => {
                let Some(keeps) = next.start_step.checked_sub(run.start_step) else {
                    result.flag(
                        Verdict::Invalid,
                        format!(
                            "trainer job {job} run {next_number} restored step {}, behind step \
                             {} that run {number} started at",
                            next.start_step, run.start_step
                        ),
                    );
                    continue;
                };
                let keeps = usize::try_from(keeps).unwrap_or(usize::MAX);
                if keeps > run.splits.len() {
                    result.flag(
                        Verdict::Invalid,
                        format!(
                            "trainer job {job} run {next_number} restored step {}, but run \
                             {number} (from step {}) printed only {} elements",
                            next.start_step,
                            run.start_step,
                            run.splits.len()
                        ),
                    );
                }
                keeps.min(run.splits.len())
            }
        };
        result.count("elements_kept", keeps as u64);
        result.count("replayed_after_restore", (run.splits.len() - keeps) as u64);
        for (position, &split) in run.splits[..keeps].iter().enumerate() {
            kept.entry(split).or_default().push((number, position));
        }
    }
    let describe = |number: u64, position: usize| {
        let run = &epoch.runs[&number];
        format!(
            "run {number} (from step {}, started at {} ms, ended {}) as its element {position}, \
             step {}",
            run.start_step,
            run.t_ms,
            run.end.as_deref().unwrap_or("unrecorded"),
            run.start_step + position as u64
        )
    };
    for (split, by) in &kept {
        if by.len() > 1 {
            result.count("duplicate_elements", (by.len() - 1) as u64);
            let places: Vec<String> = by.iter().map(|&(r, p)| describe(r, p)).collect();
            result.flag(
                Verdict::Invalid,
                format!(
                    "split {split} of trainer job {job} kept {} times: by {}",
                    by.len(),
                    places.join("; and by ")
                ),
            );
        }
    }
    if !epoch.complete {
        return;
    }
    result.count("epochs_complete", 1);
    let lost: BTreeSet<u64> = (0..epoch.splits)
        .filter(|s| i64::try_from(*s).is_ok_and(|s| !kept.contains_key(&s)))
        .collect();
    let beyond: Vec<i64> = kept
        .keys()
        .copied()
        .filter(|&s| s < 0 || s as u64 >= epoch.splits)
        .collect();
    if !beyond.is_empty() {
        result.flag(
            Verdict::Invalid,
            format!(
                "trainer job {job} received splits outside 0..{}: {beyond:?}",
                epoch.splits
            ),
        );
    }
    if lost.is_empty() {
        return;
    }
    result.count("lost_elements", lost.len() as u64);
    let restores: Vec<String> = epoch
        .runs
        .iter()
        .map(|(n, r)| {
            format!(
                "run {n} from step {} printed {} ({})",
                r.start_step,
                r.splits.len(),
                r.end.as_deref().unwrap_or("unrecorded")
            )
        })
        .collect();
    result.flag(
        Verdict::Invalid,
        format!(
            "{} splits of complete trainer job {job} were lost ({}); its runs: {}",
            lost.len(),
            ranges(&lost),
            restores.join(", ")
        ),
    );
}

/// `0-3, 7, 9-12`, at most 10 runs.
fn ranges(splits: &BTreeSet<u64>) -> String {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &s in splits {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == s => *end = s,
            _ => runs.push((s, s)),
        }
    }
    let mut text: Vec<String> = runs
        .iter()
        .take(10)
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    if runs.len() > 10 {
        text.push(format!("and {} more runs", runs.len() - 10));
    }
    text.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::fixtures::ev;
    use serde_json::{json, Value};

    /// A trainer epoch of `splits`: each run is (its restored step, the splits it printed, how
    /// it ended); `complete`: the last run read to the end.
    fn epoch(job: &str, splits: u64, runs: &[(Option<u64>, Vec<i64>, &str)]) -> Vec<Event> {
        let p = crate::trainer::PROCESS;
        let mut h = vec![ev(
            0,
            p,
            Kind::Invoke,
            "trainer-epoch",
            json!({"job": job, "splits": splits, "state_every": 10}),
        )];
        let mut complete = false;
        for (run, (step, printed, end)) in runs.iter().enumerate() {
            let resume: Value = match step {
                Some(step) => json!({"format": 1, "dataset": "ab", "job": job, "epoch": 0,
                                     "step": step, "reader": "7"}),
                None => Value::Null,
            };
            h.push(ev(
                1,
                p,
                Kind::Invoke,
                "trainer-run",
                json!({"job": job, "run": run, "pid": 1, "resume": resume}),
            ));
            for split in printed {
                h.push(ev(
                    2,
                    p,
                    Kind::Ok,
                    "trainer-element",
                    json!({"job": job, "run": run, "split": split}),
                ));
            }
            let (kind, value) = if *end == "complete" {
                complete = true;
                (
                    Kind::Ok,
                    json!({"job": job, "run": run, "elements": printed.len()}),
                )
            } else {
                (
                    Kind::Info,
                    json!({"job": job, "run": run, "elements": printed.len(), "end": end}),
                )
            };
            h.push(ev(3, p, kind, "trainer-run", value));
        }
        let kind = if complete { Kind::Ok } else { Kind::Info };
        h.push(ev(4, p, kind, "trainer-epoch", json!({"job": job})));
        h
    }

    #[test]
    fn a_restored_epoch_that_replays_what_followed_the_state_is_valid() {
        // Run 0 printed 0..25 and took states at 10 and 20; killed. Run 1 restored step 20,
        // so 20..25 come again; killed before its next state. Run 2 restores 20 again.
        let h = epoch(
            "t1-e0",
            40,
            &[
                (None, (0..25).collect(), "killed"),
                (Some(20), (20..27).collect(), "killed"),
                (Some(20), (20..40).collect(), "complete"),
            ],
        );
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.problems);
        assert_eq!(r.counts["elements_kept"], 40);
        assert_eq!(r.counts["replayed_after_restore"], 5 + 7);
        assert_eq!(r.counts["restores"], 2);
        assert_eq!(r.counts["kills"], 2);
        assert_eq!(r.counts["epochs_complete"], 1);
    }

    #[test]
    fn an_element_from_before_the_state_delivered_again_is_a_duplicate() {
        // The restored reader gets split 19 again (taken before the state at 20).
        let mut again: Vec<i64> = vec![19];
        again.extend(20..40);
        let h = epoch(
            "t1-e0",
            40,
            &[
                (None, (0..23).collect(), "killed"),
                (Some(20), again, "complete"),
            ],
        );
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.counts["duplicate_elements"], 1);
        assert!(r.problems[0].contains("split 19 of trainer job t1-e0 kept 2 times"));
    }

    #[test]
    fn an_element_read_after_the_state_and_not_delivered_again_is_lost() {
        // Run 0 read 20..23 after its state at 20; run 1 never delivers 21.
        let after: Vec<i64> = (20..40).filter(|&s| s != 21).collect();
        let h = epoch(
            "t1-e0",
            40,
            &[
                (None, (0..23).collect(), "killed"),
                (Some(20), after, "complete"),
            ],
        );
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.counts["lost_elements"], 1);
        assert!(r.problems[0].contains("(21)"), "{:?}", r.problems);
    }

    #[test]
    fn an_incomplete_epoch_is_judged_for_duplicates_only() {
        let h = epoch(
            "t1-e0",
            40,
            &[
                (None, (0..23).collect(), "killed"),
                (Some(20), (20..30).collect(), "cancelled"),
            ],
        );
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.problems);
        assert_eq!(r.counts["epochs_complete"], 0);
    }

    #[test]
    fn a_state_beyond_what_the_run_printed_is_a_violation() {
        let h = epoch(
            "t1-e0",
            40,
            &[
                (None, (0..15).collect(), "killed"),
                (Some(20), (20..40).collect(), "complete"),
            ],
        );
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert!(r.problems.iter().any(|p| p.contains("printed only 15")));
    }
}
