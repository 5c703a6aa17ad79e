//! `reader_state`: readers' states (checkpointable iterators) on a three-replica quorum with four
//! workers.
//!
//! - Restore: a reader of a named job takes a state, a new `ServiceDataset` of the same job
//!   loads it, and the time from `load_state` to the restored epoch's first element is measured
//!   (`reader_state_restore_first_ms`, the median of [`RESTORES`] restores).
//! - Size: one reader of `range(10^8)` takes states at random points of its first
//!   [`SIZE_READ`] elements: the state's JSON (`reader_state_json_bytes`, the largest; it is
//!   constant-size by design) and how much the dispatcher's encoded state grew when it was taken
//!   (`reader_state_checkpoint_bytes`, the largest: the replicated checkpoint behind the state,
//!   measured as the growth of the leader's `state_bytes` while the reader is idle).
//! - A reader killed: a `sluice read --state-every` process is SIGKILLed after it wrote a state
//!   and read past it, and a second one resumes from the state: the elements of the epoch missing
//!   and repeated over the first run's output up to the state's step and the second run's
//!   (`reader_state_kill_missing`, `reader_state_kill_repeated`; both must be 0).

use crate::cluster::Cluster;
use crate::epoch::uncompressed;
use crate::report::{median, Report};
use anyhow::{bail, Context};
use rand::Rng;
use sluice_client::{
    DispatcherClient, DispatcherClientExt, DistributeOptions, ReaderState, RetryConfig,
    ServiceDataset,
};
use sluice_pipeline::Dataset;
use sluice_types::ShardingPolicy;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Restores measured; the median is reported.
const RESTORES: usize = 5;
/// Elements each restore's first reader takes before its state.
const BEFORE_RESTORE: u64 = 10_000;
/// The size workload's dataset, and how many of its elements it reads.
const SIZE_RANGE: i64 = 100_000_000;
const SIZE_READ: u64 = 2_000_000;
/// States taken by the size workload, at random points of its read.
const SIZE_POINTS: usize = 6;
/// The killed reader's epoch, how often it takes its state, and its pace (elements per second:
/// slow enough that it is killed mid-epoch).
const KILL_RANGE: u64 = 1_000_000;
const KILL_EVERY: u64 = 20_000;
const KILL_RATE: &str = "100000";
/// Lines the killed reader prints before it is killed (past its third state).
const KILL_AFTER: usize = 3 * KILL_EVERY as usize + KILL_EVERY as usize / 2;

fn options(job: &str) -> DistributeOptions {
    DistributeOptions {
        job_name: Some(job.to_string()),
        ..uncompressed(1024)
    }
}

pub(crate) async fn run(sluice: &Path, report: &mut Report) -> anyhow::Result<()> {
    let cluster = Cluster::start_with(sluice, 3, 4, None, &["--worker-timeout", "2s"])?;
    let client = cluster.client()?;
    crate::epoch::warm_up(&client, ShardingPolicy::Dynamic).await?;

    let mut restores = Vec::new();
    for i in 0..RESTORES {
        restores.push(restore_to_first_element(&client, &format!("bench-restore-{i}")).await?);
    }
    report.put(
        "reader_state_restore_first_ms",
        median(&mut restores),
        "ms (load_state to the first element, median)",
    );

    let (json_bytes, checkpoint_bytes) = state_sizes(&cluster, &client).await?;
    report.put(
        "reader_state_json_bytes",
        json_bytes as f64,
        "bytes (largest of the states taken)",
    );
    report.put(
        "reader_state_checkpoint_bytes",
        checkpoint_bytes as f64,
        "bytes (largest growth of the leader's state per state)",
    );

    let addrs = cluster.target()?.addrs.join(",");
    let sluice = sluice.to_path_buf();
    let (missing, repeated) =
        tokio::task::spawn_blocking(move || reader_killed_and_resumed(&sluice, &addrs)).await??;
    report.put("reader_state_kill_missing", missing as f64, "elements");
    report.put("reader_state_kill_repeated", repeated as f64, "elements");
    Ok(())
}

/// Milliseconds from `load_state` to the first element of the restored epoch of job `job`, as
/// a restarted trainer sees them (a new `ServiceDataset` of the job, then `load_state`).
async fn restore_to_first_element(client: &DispatcherClient, job: &str) -> anyhow::Result<f64> {
    let dataset = Dataset::range(10_000_000);
    let state = {
        let service = client
            .distribute(&dataset, ShardingPolicy::Dynamic, options(job))
            .await?;
        let mut epoch = service.iter().await?;
        for _ in 0..BEFORE_RESTORE {
            epoch.next().await.context("the epoch ended early")??;
        }
        epoch.state().await?
    };
    let service = client
        .distribute(&dataset, ShardingPolicy::Dynamic, options(job))
        .await?;
    let started = Instant::now();
    service.load_state(state)?;
    let mut epoch = service.iter().await?;
    epoch
        .next()
        .await
        .context("the restored epoch had no element")??;
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

/// The encoded state size the leader reports.
async fn leader_state_bytes(cluster: &Cluster) -> anyhow::Result<u64> {
    let leader = cluster.leader().await?;
    let addr = cluster.target()?.addrs[leader].clone();
    let client = DispatcherClient::connect(&addr, RetryConfig::default(), Default::default())?;
    let status: serde_json::Value = serde_json::from_str(&client.get_status().await?)?;
    status["state_bytes"]
        .as_u64()
        .context("no state_bytes in the leader's status")
}

/// The leader's `state_bytes` once it stopped changing (the workers' buffers are full while the
/// reader is idle), or after a few seconds.
async fn settled_state_bytes(cluster: &Cluster) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = leader_state_bytes(cluster).await?;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = leader_state_bytes(cluster).await?;
        if now == last || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

/// Reads `range(10^8)` up to [`SIZE_READ`] elements, taking states at random points: the
/// largest state JSON and the largest growth of the leader's state per state, in bytes.
async fn state_sizes(cluster: &Cluster, client: &DispatcherClient) -> anyhow::Result<(u64, u64)> {
    let service: ServiceDataset = client
        .distribute(
            &Dataset::range(SIZE_RANGE),
            ShardingPolicy::Dynamic,
            options("bench-state-size"),
        )
        .await?;
    let mut points: Vec<u64> = (0..SIZE_POINTS)
        .map(|_| rand::rng().random_range(1..=SIZE_READ))
        .collect();
    points.sort_unstable();
    let mut epoch = service.iter().await?;
    let (mut json_max, mut checkpoint_max) = (0u64, 0u64);
    for point in points {
        while epoch.position() < point {
            epoch.next().await.context("the epoch ended early")??;
        }
        let before = settled_state_bytes(cluster).await?;
        let state: ReaderState = epoch.state().await?;
        let after = leader_state_bytes(cluster).await?;
        let json = serde_json::to_vec(&state)?.len() as u64;
        let grew = after.saturating_sub(before);
        println!(
            "  state at step {point}: {json} bytes of JSON, the leader's state grew {grew} bytes"
        );
        json_max = json_max.max(json);
        checkpoint_max = checkpoint_max.max(grew);
    }
    Ok((json_max, checkpoint_max))
}

/// The integers `sluice read` printed, one a line.
fn integers(lines: &[String]) -> anyhow::Result<Vec<u64>> {
    lines
        .iter()
        .map(|l| {
            l.parse::<u64>()
                .with_context(|| format!("not an element: {l:?}"))
        })
        .collect()
}

/// A `sluice read --state-every` of `range(KILL_RANGE)` SIGKILLed past its third state, and a
/// second one resuming from its state file: (missing, repeated) over the epoch.
fn reader_killed_and_resumed(sluice: &Path, addrs: &str) -> anyhow::Result<(u64, u64)> {
    let dir = tempfile::tempdir()?;
    let state_file = dir.path().join("state.json");
    let state_path = state_file.to_str().context("utf-8 path")?;
    let range = format!("range({KILL_RANGE})");
    let every = KILL_EVERY.to_string();
    let common = [
        "--log",
        "error",
        "read",
        "--dispatcher",
        addrs,
        "--dataset",
        &range,
        "--mode",
        "distributed_epoch",
        "--job-name",
        "bench-reader-killed",
        "--max-outstanding-requests",
        "64",
    ];
    let mut first = Command::new(sluice)
        .args(common)
        .args(["--state-every", &every, "--state-file", state_path])
        .args(["--rate", KILL_RATE])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = first.stdout.take().context("the reader's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut first_lines = Vec::new();
    while first_lines.len() < KILL_AFTER {
        match lines.next() {
            Some(line) => first_lines.push(line?),
            None => bail!(
                "the first reader ended after {} elements, before it was killed",
                first_lines.len()
            ),
        }
    }
    first.kill()?;
    first.wait()?;
    // Whatever it flushed before it died.
    for line in lines {
        first_lines.push(line?);
    }
    let state: ReaderState = serde_json::from_slice(&std::fs::read(&state_file)?)
        .context("the killed reader's state file")?;
    let step = state.step as usize;
    if step == 0 || step > first_lines.len() {
        bail!(
            "the state's step {step} is not within the {} lines the killed reader printed",
            first_lines.len()
        );
    }
    println!(
        "  reader killed after {} elements, its state at step {step}",
        first_lines.len()
    );
    let second = Command::new(sluice)
        .args(common)
        .args(["--resume", state_path])
        .stderr(Stdio::inherit())
        .output()?;
    if !second.status.success() {
        bail!("the resumed reader failed: {}", second.status);
    }
    let second_lines: Vec<String> = String::from_utf8(second.stdout)?
        .lines()
        .map(str::to_string)
        .collect();
    let mut seen = vec![0u32; KILL_RANGE as usize];
    for value in integers(&first_lines[..step])?
        .into_iter()
        .chain(integers(&second_lines)?)
    {
        let slot = seen
            .get_mut(value as usize)
            .with_context(|| format!("{value} is outside {range}"))?;
        *slot += 1;
    }
    let missing = seen.iter().filter(|c| **c == 0).count() as u64;
    let repeated = seen.iter().map(|c| u64::from(c.saturating_sub(1))).sum();
    Ok((missing, repeated))
}
