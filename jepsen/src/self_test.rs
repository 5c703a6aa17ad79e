//! `self-test`: proves the harness can fail. For each planted bug it builds `sluice` with that
//! bug's cargo feature into its own target dir (`target/<feature>`), so the normal binary is
//! never replaced, runs a short fixed seed against it, and passes only if the run is `invalid`
//! for the right reason:
//! - `dispatcher` (feature `planted-bug`): a lease starting at a multiple of 64 re-issues the 4
//!   splits before it; at-most-once must be broken.
//! - `worker` (feature `planted-resend-bug`): a worker re-sends an element after the reader
//!   acknowledged it; a split must be found delivered twice. The run cuts the readers' links to
//!   the workers, so readers reconnect and acknowledge under faults.
//! - `resume` (feature `planted-resume-bug`): a worker taking over a failed worker's
//!   exactly-once stream skips one element more than the readers received; a split of a
//!   complete exactly-once epoch must be found lost. The run kills and restarts workers, so
//!   streams move mid-epoch.
//! - `restore` (feature `planted-restore-bug`): a dispatcher restoring an iteration from a
//!   reader's checkpoint forgets the last element each lineage's readers had taken, so the
//!   restored trainer receives it again; the trainer's epochs must be found to deliver a split
//!   twice relative to the states restored. The run plays only the trainer nemesis.
//!
//! The runs read with the default delivery, exactly-once; the dispatcher's bug must still be
//! found as splits leased twice (its run plays every nemesis, the trainer's kills included).
//!
//! Each bug's result is reported on its own line; the exit code is 0 only if every bug asked
//! for was caught.

use crate::checker::{CheckResult, Verdict};
use crate::cli::{RunArgs, SelfTestArgs};
use crate::runner::{self, workspace_root};
use anyhow::{bail, Context};

/// A bug planted in the binary for the self-test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Planted {
    Dispatcher,
    Worker,
    Resume,
    Restore,
}

impl Planted {
    fn parse(text: &str) -> Result<Planted, String> {
        match text.trim() {
            "dispatcher" => Ok(Planted::Dispatcher),
            "worker" => Ok(Planted::Worker),
            "resume" => Ok(Planted::Resume),
            "restore" => Ok(Planted::Restore),
            other => Err(format!(
                "unknown planted bug '{other}': expected dispatcher, worker, resume or restore"
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Planted::Dispatcher => "dispatcher",
            Planted::Worker => "worker",
            Planted::Resume => "resume",
            Planted::Restore => "restore",
        }
    }

    /// The cargo feature of crate `sluice` that plants it.
    fn feature(self) -> &'static str {
        match self {
            Planted::Dispatcher => "planted-bug",
            Planted::Worker => "planted-resend-bug",
            Planted::Resume => "planted-resume-bug",
            Planted::Restore => "planted-restore-bug",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Planted::Dispatcher => "splits leased twice",
            Planted::Worker => "an element re-sent after its acknowledgement",
            Planted::Resume => "an element skipped when a stream is taken over",
            Planted::Restore => {
                "an element taken before a checkpoint delivered again after a restore"
            }
        }
    }

    /// The faults its run plays (`None`: the defaults).
    fn nemesis(self) -> Option<&'static str> {
        match self {
            Planted::Dispatcher => None,
            Planted::Worker => Some("reader-partition,worker-partition,pause"),
            Planted::Resume => Some("worker-kill,worker-restart"),
            Planted::Restore => Some("trainer"),
        }
    }

    /// Whether the checkers found this bug.
    fn caught(self, verdict: Verdict, results: &[CheckResult]) -> bool {
        let check = |name: &str| results.iter().find(|r| r.name == name);
        let count = |name: &str, key: &str| {
            check(name)
                .and_then(|r| r.counts.get(key).copied())
                .unwrap_or(0)
        };
        verdict == Verdict::Invalid
            && match self {
                Planted::Dispatcher => {
                    check("at-most-once").map(|r| r.verdict) == Some(Verdict::Invalid)
                }
                Planted::Worker => {
                    count("at-most-once", "duplicate_elements") > 0
                        || count("loss-bound", "delivered_twice") > 0
                }
                // Under exactly-once every loss is one, whatever happened to the worker.
                Planted::Resume => {
                    check("loss-bound").map(|r| r.verdict) == Some(Verdict::Invalid)
                        && count("loss-bound", "lost_with_worker")
                            + count("loss-bound", "lost_while_worker_lived")
                            + count("loss-bound", "lost_unleased")
                            > 0
                }
                Planted::Restore => {
                    check("trainer-exactly-once").map(|r| r.verdict) == Some(Verdict::Invalid)
                        && count("trainer-exactly-once", "duplicate_elements")
                            + count("trainer-exactly-once", "lost_elements")
                            > 0
                }
            }
    }
}

/// One bug's result.
enum Finding {
    Caught,
    Missed(Verdict),
    Failed(anyhow::Error),
}

pub async fn main(args: SelfTestArgs) -> i32 {
    let planted: Vec<Planted> = match args
        .planted
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(Planted::parse)
        .collect()
    {
        Ok(planted) => planted,
        Err(e) => {
            println!("self-test: {e}");
            return 2;
        }
    };
    let mut results = Vec::new();
    for bug in planted {
        let result = match run_one(&args, bug).await {
            Ok((true, _)) => Finding::Caught,
            Ok((false, verdict)) => Finding::Missed(verdict),
            Err(e) => Finding::Failed(e),
        };
        results.push((bug, result));
    }
    println!("self-test results:");
    for (bug, result) in &results {
        match result {
            Finding::Caught => println!(
                "  {:<10} caught: {} (invalid, as required)",
                bug.name(),
                bug.what()
            ),
            Finding::Missed(verdict) => println!(
                "  {:<10} FAILED: {} was not caught (the run was {verdict})",
                bug.name(),
                bug.what()
            ),
            Finding::Failed(e) => println!("  {:<10} harness failure: {e:#}", bug.name()),
        }
    }
    if results.iter().any(|(_, r)| matches!(r, Finding::Missed(_))) {
        1
    } else if results.iter().any(|(_, r)| matches!(r, Finding::Failed(_))) {
        2
    } else {
        0
    }
}

/// Builds the bugged binary and runs against it. Returns whether the bug was caught, and the
/// run's verdict.
async fn run_one(args: &SelfTestArgs, bug: Planted) -> anyhow::Result<(bool, Verdict)> {
    let root = workspace_root();
    let feature = bug.feature();
    let target = root.join("target").join(feature);
    println!(
        "self-test {}: building sluice with {feature} \
         (cargo build -p sluice --features {feature} --target-dir target/{feature})",
        bug.name()
    );
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args([
            "build",
            "-p",
            "sluice",
            "--features",
            feature,
            "--target-dir",
        ])
        .arg(&target)
        .current_dir(&root)
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .context("run cargo build")?;
    let bin = target.join("debug/sluice");
    if !status.success() || !bin.is_file() {
        bail!("building sluice with {feature} failed ({status})");
    }
    let defaults = RunArgs::defaults(args.out.join(bug.name()));
    let run = RunArgs {
        time: args.time,
        seed: Some(args.seed),
        sluice_bin: Some(bin),
        plain: args.plain,
        nemesis: bug
            .nemesis()
            .map(str::to_string)
            .unwrap_or(defaults.nemesis.clone()),
        ..defaults
    };
    let outcome = runner::run(run).await?;
    Ok((
        bug.caught(outcome.verdict, &outcome.results),
        outcome.verdict,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn result(name: &'static str, verdict: Verdict, counts: &[(&'static str, u64)]) -> CheckResult {
        CheckResult {
            name,
            verdict,
            counts: counts.iter().copied().collect::<BTreeMap<_, _>>(),
            problems: Vec::new(),
        }
    }

    #[test]
    fn each_planted_bug_must_be_caught_for_its_own_reason() {
        let leased_twice = [
            result(
                "at-most-once",
                Verdict::Invalid,
                &[("duplicate_leased_splits", 4)],
            ),
            result("loss-bound", Verdict::Valid, &[("delivered_twice", 0)]),
        ];
        let resent = [
            result(
                "at-most-once",
                Verdict::Invalid,
                &[("duplicate_elements", 1)],
            ),
            result("loss-bound", Verdict::Invalid, &[("delivered_twice", 1)]),
        ];
        let lost = [
            result("at-most-once", Verdict::Valid, &[("duplicate_elements", 0)]),
            result(
                "loss-bound",
                Verdict::Invalid,
                &[("lost_while_worker_lived", 3)],
            ),
        ];
        let restored_twice = [
            result("at-most-once", Verdict::Valid, &[("duplicate_elements", 0)]),
            result(
                "trainer-exactly-once",
                Verdict::Invalid,
                &[("duplicate_elements", 2), ("lost_elements", 0)],
            ),
        ];
        let lost_with_worker = [
            result("at-most-once", Verdict::Valid, &[("duplicate_elements", 0)]),
            result("loss-bound", Verdict::Invalid, &[("lost_with_worker", 1)]),
        ];
        // (bug, the run's verdict, its checks, caught)
        let cases: [(Planted, Verdict, &[CheckResult], bool); 13] = [
            (Planted::Dispatcher, Verdict::Invalid, &leased_twice, true),
            (Planted::Dispatcher, Verdict::Invalid, &lost, false),
            (Planted::Worker, Verdict::Invalid, &resent, true),
            (Planted::Worker, Verdict::Invalid, &leased_twice, false),
            (Planted::Worker, Verdict::Invalid, &lost, false),
            (Planted::Worker, Verdict::Unknown, &resent, false),
            (Planted::Resume, Verdict::Invalid, &lost, true),
            (Planted::Resume, Verdict::Invalid, &lost_with_worker, true),
            (Planted::Resume, Verdict::Invalid, &resent, false),
            (Planted::Resume, Verdict::Unknown, &lost, false),
            (Planted::Restore, Verdict::Invalid, &restored_twice, true),
            (Planted::Restore, Verdict::Invalid, &resent, false),
            (Planted::Restore, Verdict::Unknown, &restored_twice, false),
        ];
        for (bug, verdict, results, caught) in cases {
            assert_eq!(bug.caught(verdict, results), caught, "{bug:?} {verdict}");
        }
        assert_eq!(Planted::parse(" worker"), Ok(Planted::Worker));
        assert_eq!(Planted::parse("resume"), Ok(Planted::Resume));
        assert!(Planted::parse("disp").unwrap_err().contains("'disp'"));
    }
}
