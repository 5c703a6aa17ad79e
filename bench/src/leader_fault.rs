//! `leader_fault`: the quorum's leader frozen (SIGSTOP) or cut off (its client port and every
//! Raft link to or from it blackholed) for 5 s mid-epoch. Either way its ports still accept
//! connections and nothing is answered (a long GC or swap pause, a stalled VM, a half-open
//! network path), so a caller that waited on it would wait as long as the fault; callers must
//! move to the next leader within an election instead.
//!
//! Figures, with the fault's prefix (`pause_`, `partition_`): `stall_ms`, the longest gap a
//! rate-limited reader sees (its epoch began before the fault), and `first_element_ms`, how
//! long a new job, started by a new client just after the fault began, waits for its first
//! element.

use crate::cluster::Cluster;
use crate::epoch::options;
use crate::report::Report;
use anyhow::Context;
use sluice_client::{DispatcherClient, DispatcherClientExt, ShardingPolicy};
use sluice_pipeline::Dataset;
use std::time::{Duration, Instant};

/// How long the fault lasts.
const FAULT: Duration = Duration::from_secs(5);
/// The reader's rate: the service needs to keep up, not to race it.
const RATE: f64 = 20_000.0;

/// What happens to the leader.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LeaderFault {
    /// SIGSTOP, then SIGCONT.
    Pause,
    /// Its client port and Raft links blackholed, then restored (a proxied cluster).
    Partition,
}

impl LeaderFault {
    fn prefix(self) -> &'static str {
        match self {
            LeaderFault::Pause => "pause",
            LeaderFault::Partition => "partition",
        }
    }

    fn what(self) -> &'static str {
        match self {
            LeaderFault::Pause => "leader SIGSTOPped for 5 s",
            LeaderFault::Partition => "leader's ports blackholed for 5 s",
        }
    }

    fn begin(self, cluster: &Cluster, leader: usize) -> anyhow::Result<()> {
        match self {
            LeaderFault::Pause => cluster.dispatchers[leader].pause(),
            LeaderFault::Partition => cluster.cut_off(leader, true),
        }
    }

    fn end(self, cluster: &Cluster, leader: usize) -> anyhow::Result<()> {
        match self {
            LeaderFault::Pause => cluster.dispatchers[leader].resume(),
            LeaderFault::Partition => cluster.cut_off(leader, false),
        }
    }
}

/// Reads `range(total)` as one distributed_epoch at `RATE` elements a second, calling
/// `on_element` with the time since the epoch began after each element; the elements received
/// and the longest wait between two of them (or before the first).
pub(crate) async fn paced_range_read(
    client: &DispatcherClient,
    total: u64,
    mut on_element: impl FnMut(Duration) -> anyhow::Result<()>,
) -> anyhow::Result<(u64, Duration)> {
    let service = client
        .distribute(
            &Dataset::range(total as i64),
            ShardingPolicy::Dynamic,
            options(64),
        )
        .await?;
    let mut stream = service.iter().await?;
    let started = Instant::now();
    let (mut received, mut longest) = (0u64, Duration::ZERO);
    let mut last = Instant::now();
    while let Some(element) = stream.next().await {
        element?;
        received += 1;
        longest = longest.max(last.elapsed());
        on_element(started.elapsed())?;
        let due = started + Duration::from_secs_f64(received as f64 / RATE);
        if due > Instant::now() + Duration::from_millis(1) {
            tokio::time::sleep_until(due.into()).await;
        }
        last = Instant::now();
    }
    Ok((received, longest))
}

pub(crate) async fn leader_fault(
    cluster: &Cluster,
    client: &DispatcherClient,
    fault: LeaderFault,
    report: &mut Report,
) -> anyhow::Result<()> {
    let leader = cluster.leader().await?;
    // Ten seconds at the rate: the fault begins after one and ends after six.
    let total = (RATE * 10.0) as u64;
    let mut began = None;
    let mut ended = false;
    let mut new_job = None;
    let (received, longest) = paced_range_read(client, total, |since_start| {
        if began.is_none() && since_start > Duration::from_secs(1) {
            fault.begin(cluster, leader)?;
            began = Some(Instant::now());
            new_job = Some(tokio::spawn(first_element(cluster.client()?)));
        }
        if began.is_some_and(|at: Instant| !ended && at.elapsed() >= FAULT) {
            fault.end(cluster, leader)?;
            ended = true;
        }
        Ok(())
    })
    .await?;
    if !ended {
        fault.end(cluster, leader)?;
    }
    let prefix = fault.prefix();
    anyhow::ensure!(
        received == total,
        "{prefix} epoch: {received} of {total} elements"
    );
    let first = new_job
        .context("the fault never began")?
        .await
        .context("the new job's reader")??;
    report.put(
        &format!("{prefix}_stall_ms"),
        longest.as_secs_f64() * 1000.0,
        &format!("ms (longest client stall, {})", fault.what()),
    );
    report.put(
        &format!("{prefix}_first_element_ms"),
        first.as_secs_f64() * 1000.0,
        &format!("ms (a new job's first element, {})", fault.what()),
    );
    Ok(())
}

/// How long a new job of a new client waits for its first element.
async fn first_element(client: DispatcherClient) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let service = client
        .distribute(&Dataset::range(10), ShardingPolicy::Dynamic, options(64))
        .await?;
    let mut stream = service.iter().await?;
    stream
        .next()
        .await
        .context("the new job ended before its first element")??;
    let first = started.elapsed();
    while let Some(element) = stream.next().await {
        element?;
    }
    Ok(first)
}
