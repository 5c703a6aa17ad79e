//! The workloads, one function each; each puts its figures in the report. Which cluster each
//! runs on (and which share one) is `run`'s choice, in the crate root.

use crate::cluster::{rss_mib, Cluster};
use crate::epoch::{measured, options, read_epoch, uncompressed, Count};
use crate::leader_fault::paced_range_read;
use crate::leader_probe::Target;
use crate::report::{median, Report};
use crate::scale::{run_scale, ScaleConfig};
use crate::soak::{run_soak, SoakConfig};
use anyhow::Context;
use sluice_client::{DispatcherClient, ShardingPolicy};
use sluice_element::Tensor;
use sluice_executor::ExecOptions;
use sluice_pipeline::{Dataset, Transform};
use std::time::{Duration, Instant};

/// `max_outstanding_requests` of the tiny workloads: 65,536 int64 scalars are 768 KiB on the
/// wire. Credits are counted in elements, and with fewer, a fast stream's messages get smaller
/// (4,096 credits: about 2,500 elements a message), which costs about a fifth of the throughput
/// in per-message work and stalls waiting for credits.
const TINY_OUTSTANDING: u32 = 65_536;

/// Epochs read for each tiny row (the local executor's too); the row is their median, as the
/// tf.data figures it is compared with are medians of 5. An epoch is about half a second, which a busy
/// neighbour on a shared machine moves by a fifth.
const TINY_EPOCHS: usize = 5;

fn tiny_unit() -> String {
    format!("elements/s (median of {TINY_EPOCHS} epochs)")
}

/// `local`: the local executor alone, `range(n)` counted in this process: the ceiling for the
/// service.
pub(crate) fn local(n: u64, report: &mut Report) -> anyhow::Result<()> {
    let mut rates = Vec::new();
    for _ in 0..TINY_EPOCHS {
        let started = Instant::now();
        let mut local = 0u64;
        let dataset = Dataset::range(n as i64);
        for element in sluice_executor::iterate(dataset.def(), &ExecOptions::default())? {
            element?;
            local += 1;
        }
        rates.push(local as f64 / started.elapsed().as_secs_f64());
    }
    report.put("tiny_local_eps", median(&mut rates), &tiny_unit());
    cancel_stop(report)
}

/// Part of `local`: how long a pipeline that yields nothing (a filter dropping every element of
/// a practically endless range, as a removed task's pipeline may be doing) takes to stop once
/// cancelled, the median of five. The tests only check it stops.
fn cancel_stop(report: &mut Report) -> anyhow::Result<()> {
    let def = sluice_pipeline::parse("range(0, 1125899906842624, 2).filter(is_odd)")?.into_def();
    let mut stops = Vec::new();
    for _ in 0..5 {
        let cancel = sluice_element::Cancellation::new();
        let opts = ExecOptions {
            cancel: cancel.clone(),
            ..ExecOptions::default()
        };
        let mut it = sluice_executor::iterate(&def, &opts)?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(it.next().map(|r| r.is_ok()));
        });
        // Running: nothing comes out.
        anyhow::ensure!(
            rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "the filter yielded"
        );
        let cancelled = Instant::now();
        cancel.cancel();
        let ended = rx.recv_timeout(Duration::from_secs(60));
        anyhow::ensure!(
            ended == Ok(Some(false)),
            "a cancelled pipeline ended with {ended:?}"
        );
        stops.push(cancelled.elapsed().as_secs_f64() * 1000.0);
    }
    report.put(
        "cancel_stop_ms",
        median(&mut stops),
        "ms (a cancelled pipeline that yields nothing, until it stops; median of 5)",
    );
    Ok(())
}

/// `tiny2w`, `tiny1w`: the median rate of `TINY_EPOCHS` epochs of `range(n)` (each a new job)
/// read from `workers` workers, each of which produces the whole range (no sharding), put as
/// `key`.
pub(crate) async fn tiny(
    client: &DispatcherClient,
    n: u64,
    workers: u64,
    key: &str,
    report: &mut Report,
) -> anyhow::Result<()> {
    let label = match workers {
        1 => "tiny, 1 worker".to_string(),
        _ => format!("tiny, {workers} workers"),
    };
    let mut rates = Vec::new();
    for epoch in 1..=TINY_EPOCHS {
        let epoch = measured(
            client,
            &Dataset::range(n as i64),
            ShardingPolicy::Off,
            uncompressed(TINY_OUTSTANDING),
            Count::Elements,
            workers * n,
            &format!("{label} ({epoch}/{TINY_EPOCHS})"),
        )
        .await?;
        rates.push(epoch.elements as f64 / epoch.seconds);
    }
    report.put(key, median(&mut rates), &tiny_unit());
    Ok(())
}

/// The memory of the cluster's first worker, after the workloads it served.
pub(crate) fn worker_rss(cluster: &Cluster, report: &mut Report) -> anyhow::Result<()> {
    let pid = cluster.workers[0].pid().context("worker pid")?;
    report.put(
        "worker_rss_mib",
        rss_mib(&pid.to_string())?,
        "MiB (a worker after the tiny epochs)",
    );
    Ok(())
}

/// `batched`: `range(20 n).batch(1024)` from one worker, counted in rows.
pub(crate) async fn batched(
    client: &DispatcherClient,
    n: u64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let batched_n = n * 20;
    let dataset = Dataset::range(batched_n as i64).batch(1024);
    let epoch = measured(
        client,
        &dataset,
        ShardingPolicy::Off,
        uncompressed(64),
        Count::Rows,
        batched_n,
        "batched, 1 worker",
    )
    .await?;
    report.put(
        "batched_service_eps_1w",
        epoch.elements as f64 / epoch.seconds,
        "elements/s",
    );
    Ok(())
}

/// `large`: `mib` elements of 1 MiB (float32) from one worker, in MiB/s.
pub(crate) async fn large(
    client: &DispatcherClient,
    mib: u64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let floats = vec![0.5f32; 262_144];
    let dataset =
        Dataset::from_slices(Tensor::from_f32s(vec![1, floats.len()], &floats)?).repeat(mib);
    let epoch = measured(
        client,
        &dataset,
        ShardingPolicy::Off,
        uncompressed(16),
        Count::Bytes,
        mib,
        "1 MiB float32",
    )
    .await?;
    report.put(
        "large_mib_s",
        epoch.bytes as f64 / (1024.0 * 1024.0) / epoch.seconds,
        "MiB/s",
    );
    Ok(())
}

/// `latency`: latencies of a fresh job, registration to first element and last element to end
/// of input, medians of 5 short dynamic epochs.
pub(crate) async fn latency(client: &DispatcherClient, report: &mut Report) -> anyhow::Result<()> {
    let mut first = Vec::new();
    let mut end = Vec::new();
    for i in 0..5 {
        let epoch = read_epoch(
            client,
            &Dataset::range(100 + i),
            ShardingPolicy::Dynamic,
            options(64),
            Count::Elements,
            |_| {},
        )
        .await?;
        first.push(epoch.first_element.as_secs_f64() * 1000.0);
        end.push(epoch.end_of_epoch.as_secs_f64() * 1000.0);
    }
    report.put("first_element_ms", median(&mut first), "ms (median of 5)");
    report.put("end_of_epoch_ms", median(&mut end), "ms (median of 5)");
    Ok(())
}

/// `dynamic`: `range(n)` split dynamically between the workers by a three-node quorum.
pub(crate) async fn dynamic(
    client: &DispatcherClient,
    n: u64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let epoch = measured(
        client,
        &Dataset::range(n as i64),
        ShardingPolicy::Dynamic,
        uncompressed(4096),
        Count::Elements,
        n,
        "dynamic, 3-node quorum",
    )
    .await?;
    report.put(
        "dynamic_eps_quorum",
        epoch.elements as f64 / epoch.seconds,
        "elements/s",
    );
    Ok(())
}

/// `failover`: read at a limited rate, SIGKILL the leader a second in; the longest stall.
pub(crate) async fn failover(
    cluster: &mut Cluster,
    client: &DispatcherClient,
    report: &mut Report,
) -> anyhow::Result<()> {
    let leader = cluster.leader().await?;
    let total = 60_000u64;
    let mut killed = false;
    let (received, longest) = paced_range_read(client, total, |since_start| {
        if !killed && since_start > Duration::from_secs(1) {
            cluster.dispatchers[leader].kill();
            killed = true;
        }
        Ok(())
    })
    .await?;
    anyhow::ensure!(
        received == total,
        "failover epoch: {received} of {total} elements"
    );
    report.put(
        "failover_stall_ms",
        longest.as_secs_f64() * 1000.0,
        "ms (longest client stall, leader SIGKILLed)",
    );
    Ok(())
}

/// `scale`: the simulated fleet against a three-replica quorum.
pub(crate) async fn scale(
    target: &Target,
    config: &ScaleConfig,
    report: &mut Report,
) -> anyhow::Result<()> {
    println!(
        "scale: {} workers, {} clients, {} jobs, {:?} measured",
        config.workers, config.clients, config.jobs, config.duration
    );
    let f = run_scale(target, config).await?;
    report.put(
        "scale_heartbeat_p50_ms",
        f.heartbeat_p50_ms,
        "ms (every heartbeat)",
    );
    report.put(
        "scale_heartbeat_p99_ms",
        f.heartbeat_p99_ms,
        "ms (every heartbeat)",
    );
    report.put(
        "scale_second_p99_median_ms",
        f.second_p99_median_ms,
        "ms (the heartbeat p99 of each second of the window: median)",
    );
    report.put(
        "scale_second_p99_worst_ms",
        f.second_p99_worst_ms,
        "ms (the heartbeat p99 of each second: worst)",
    );
    report.put(
        "scale_seconds_with_heartbeats",
        f.seconds as f64,
        &format!(
            "of the window's {} seconds had heartbeats",
            config.duration.as_secs()
        ),
    );
    report.put(
        "scale_seconds_p99_over_100ms",
        f.seconds_p99_over_100ms as f64,
        &format!("of {} seconds with a heartbeat p99 over 100 ms", f.seconds),
    );
    report.put(
        "scale_worker_heartbeat_p50_ms",
        f.worker_heartbeat_p50_ms,
        "ms",
    );
    report.put(
        "scale_worker_heartbeat_p99_ms",
        f.worker_heartbeat_p99_ms,
        "ms",
    );
    report.put(
        "scale_client_heartbeat_p50_ms",
        f.client_heartbeat_p50_ms,
        "ms",
    );
    report.put(
        "scale_client_heartbeat_p99_ms",
        f.client_heartbeat_p99_ms,
        "ms",
    );
    report.put(
        "scale_bench_lag_p99_ms",
        f.bench_lag_p99_ms,
        "ms (the bench's own timers late, p99; the callers' share of the latencies)",
    );
    report.put(
        "scale_bench_lag_max_ms",
        f.bench_lag_max_ms,
        "ms (the bench's own timers late, worst)",
    );
    report.put(
        "scale_probe_p50_ms",
        f.probe_p50_ms,
        "ms (a heartbeat that may not wait, on a connection of its own)",
    );
    report.put(
        "scale_probe_p99_ms",
        f.probe_p99_ms,
        "ms (a heartbeat that may not wait, on a connection of its own)",
    );
    report.put("scale_heartbeats", f.heartbeats as f64, "heartbeats timed");
    report.put(
        "scale_news_replies",
        f.news_replies as f64,
        "heartbeats answered early with news (not timed)",
    );
    report.put("scale_leases_per_s", f.leases_per_s, "leases/s");
    report.put(
        "scale_lease_calls_per_s",
        f.lease_calls_per_s,
        "calls/s (LeaseSplits and LeaseSplitsBatch)",
    );
    report.put(
        "scale_leases_per_call",
        f.leases_per_call,
        "leases per lease call",
    );
    report.put(
        "scale_lease_p50_ms",
        f.lease_p50_ms,
        "ms (a lease, asked for ahead until answered)",
    );
    report.put(
        "scale_lease_p99_ms",
        f.lease_p99_ms,
        "ms (a lease, asked for ahead until answered)",
    );
    report.put(
        "scale_task_wait_p99_ms",
        f.task_wait_p99_ms,
        "ms (a task that used up its lease, waiting for the next)",
    );
    report.put(
        "scale_task_wait_max_ms",
        f.task_wait_max_ms,
        "ms (a task that used up its lease, waiting for the next)",
    );
    report.put("scale_splits_per_s", f.splits_per_s, "splits/s");
    report.put(
        "scale_leader_cpu_pct",
        f.leader_cpu_percent,
        "% of one core (leader, measured window)",
    );
    report.put(
        "scale_leader_rss_mib",
        f.leader_rss_mib,
        "MiB (leader, end of window)",
    );
    report.put("scale_state_mib", f.state_mib, "MiB (encoded state)");
    report.put("scale_snapshot_mib", f.snapshot_mib, "MiB (last snapshot)");
    put_outcome(
        report,
        "scale",
        f.tasks_finished,
        f.errors,
        f.leader_changed,
        f.first_error,
    );
    Ok(())
}

/// The soak: many short anonymous jobs, then what the quorum keeps.
pub(crate) async fn soak(
    target: &Target,
    config: &SoakConfig,
    report: &mut Report,
) -> anyhow::Result<()> {
    println!(
        "soak: {} anonymous jobs from {} callers",
        config.jobs, config.callers
    );
    let f = run_soak(target, config).await?;
    report.put("soak_jobs_per_s", f.jobs_per_s, "jobs/s");
    report.put(
        "soak_state_mib",
        f.state_mib,
        "MiB (encoded state after the soak)",
    );
    report.put(
        "soak_snapshot_mib",
        f.snapshot_mib,
        "MiB (last snapshot after the soak)",
    );
    report.put("soak_leader_rss_before_mib", f.leader_rss_before_mib, "MiB");
    report.put("soak_leader_rss_after_mib", f.leader_rss_after_mib, "MiB");
    report.put(
        "soak_leader_rss_ratio",
        f.leader_rss_ratio,
        "leader RSS after / before",
    );
    for (tenth, rss) in f.leader_rss_by_tenth_mib.iter().enumerate() {
        report.put(
            &format!("soak_leader_rss_at_{}pct_mib", (tenth + 1) * 10),
            *rss,
            "MiB (leader, that share of the jobs started)",
        );
    }
    put_outcome(
        report,
        "soak",
        f.tasks_finished,
        f.errors,
        f.leader_changed,
        f.first_error,
    );
    Ok(())
}

/// The figures the scale run and the soak both end with: tasks finished, failed calls and
/// whether the leader changed (under `<workload>_`), and the first error, printed.
fn put_outcome(
    report: &mut Report,
    workload: &str,
    tasks_finished: u64,
    errors: u64,
    leader_changed: bool,
    first_error: Option<String>,
) {
    report.put(
        &format!("{workload}_tasks_finished"),
        tasks_finished as f64,
        "tasks reported finished",
    );
    report.put(&format!("{workload}_errors"), errors as f64, "failed RPCs");
    report.put(
        &format!("{workload}_leader_changes"),
        f64::from(u8::from(leader_changed)),
        "1: another replica led at the end",
    );
    if let Some(error) = first_error {
        println!("{workload}: first error: {error}");
    }
}
