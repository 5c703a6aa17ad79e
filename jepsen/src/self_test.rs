//! `self-test`: proves the harness can fail. It builds the dispatcher with the `planted-bug`
//! feature (a lease starting at a multiple of 64 re-issues the 4 splits before it) into its own
//! target dir, `target/planted-bug`, so the normal binary is never replaced, runs a short fixed
//! seed against it, and passes only if the run is `invalid` with at-most-once broken.

use crate::checker::Verdict;
use crate::cli::{RunArgs, SelfTestArgs};
use crate::runner::{self, workspace_root};
use anyhow::{bail, Context};

pub async fn main(args: SelfTestArgs) -> i32 {
    match self_test(args).await {
        Ok(true) => {
            println!("self-test: caught the planted bug (invalid, as required)");
            0
        }
        Ok(false) => {
            println!("self-test: FAILED: the planted bug was not caught");
            1
        }
        Err(e) => {
            println!("self-test: harness failure: {e:#}");
            2
        }
    }
}

async fn self_test(args: SelfTestArgs) -> anyhow::Result<bool> {
    let root = workspace_root();
    let target = root.join("target/planted-bug");
    println!(
        "self-test: building the planted-bug dispatcher \
         (cargo build -p sluice --features planted-bug --target-dir target/planted-bug)"
    );
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args([
            "build",
            "-p",
            "sluice",
            "--features",
            "planted-bug",
            "--target-dir",
        ])
        .arg(&target)
        .current_dir(&root)
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .context("run cargo build")?;
    let bin = target.join("debug/sluice");
    if !status.success() || !bin.is_file() {
        bail!("building the planted-bug binary failed ({status})");
    }
    let run = RunArgs {
        time: args.time,
        seed: Some(args.seed),
        sluice_bin: Some(bin),
        plain: args.plain,
        ..RunArgs::defaults(args.out)
    };
    let outcome = runner::run(run).await?;
    let at_most_once = outcome
        .results
        .iter()
        .find(|r| r.name == "at-most-once")
        .map(|r| r.verdict);
    Ok(outcome.verdict == Verdict::Invalid && at_most_once == Some(Verdict::Invalid))
}
