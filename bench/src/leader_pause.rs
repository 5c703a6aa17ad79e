//! `leader_pause`: the quorum's leader SIGSTOPped for 5 s mid-epoch. Its ports still accept
//! connections and nothing is answered (a long GC or swap pause, a stalled VM), so a caller
//! that waited on it would wait as long as the pause; callers must move to the next leader
//! within an election instead.
//!
//! Figures: `pause_stall_ms`, the longest gap a rate-limited reader sees (its epoch began before
//! the pause), and `pause_first_element_ms`, how long a new job, started by a new client just
//! after the leader stopped, waits for its first element.

use crate::cluster::Cluster;
use crate::epoch::options;
use crate::report::Report;
use anyhow::Context;
use sluice_client::{DispatcherClient, DispatcherClientExt, ShardingPolicy};
use sluice_dataset::Dataset;
use std::time::{Duration, Instant};

/// How long the leader stays stopped.
const PAUSE: Duration = Duration::from_secs(5);
/// The reader's rate: the service needs to keep up, not to race it.
const RATE: f64 = 20_000.0;

pub(crate) async fn leader_pause(
    cluster: &mut Cluster,
    client: &DispatcherClient,
    report: &mut Report,
) -> anyhow::Result<()> {
    let leader = cluster.leader().await?;
    // Ten seconds at the rate: the pause begins after one and ends after six.
    let total = (RATE * 10.0) as u64;
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
    let mut paused_at = None;
    let mut resumed = false;
    let mut new_job = None;
    while let Some(element) = stream.next().await {
        element?;
        received += 1;
        longest = longest.max(last.elapsed());
        if paused_at.is_none() && started.elapsed() > Duration::from_secs(1) {
            cluster.dispatchers[leader].pause()?;
            paused_at = Some(Instant::now());
            new_job = Some(tokio::spawn(first_element(cluster.client()?)));
        }
        if paused_at.is_some_and(|at| !resumed && at.elapsed() >= PAUSE) {
            cluster.dispatchers[leader].resume()?;
            resumed = true;
        }
        let due = started + Duration::from_secs_f64(received as f64 / RATE);
        if due > Instant::now() + Duration::from_millis(1) {
            tokio::time::sleep_until(due.into()).await;
        }
        last = Instant::now();
    }
    if !resumed {
        cluster.dispatchers[leader].resume()?;
    }
    anyhow::ensure!(
        received == total,
        "pause epoch: {received} of {total} elements"
    );
    let first = new_job
        .context("the leader was never paused")?
        .await
        .context("the new job's reader")??;
    report.put(
        "pause_stall_ms",
        longest.as_secs_f64() * 1000.0,
        "ms (longest client stall, leader SIGSTOPped for 5 s)",
    );
    report.put(
        "pause_first_element_ms",
        first.as_secs_f64() * 1000.0,
        "ms (a new job's first element, leader SIGSTOPped)",
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
