//! Workers joining, dying and returning mid-epoch.

use crate::sorted_ints;
use sluice_client::{DistributeOptions, ProcessingMode};
use sluice_dataset::Dataset;
use std::collections::HashSet;
use std::time::Duration;
use tracing::info;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_is_removed_and_the_epoch_still_ends() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(1, 2).await?;
    let n = 20_000;
    let options = DistributeOptions {
        max_outstanding_requests: Some(8),
        ..DistributeOptions::default()
    };
    let service = cluster
        .client()
        .distribute(&Dataset::range(n), ProcessingMode::Dynamic, options)
        .await?;
    let mut epoch = service.iter().await?;
    let mut got = Vec::new();
    while got.len() < 2000 {
        got.push(
            epoch
                .next()
                .await
                .expect("not over")?
                .as_i64()
                .expect("int"),
        );
    }
    info!("--- killing worker 1 for good");
    cluster.kill_worker(1).await?;
    // tf.data would wait forever for the dead worker's task; here the leader removes the worker
    // after its timeout (2 s in local clusters) and the epoch ends without it.
    let rest = tokio::time::timeout(Duration::from_secs(30), epoch.collect()).await??;
    got.extend(sorted_ints(&rest));
    let unique: HashSet<i64> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "an element was delivered twice");
    assert!(
        got.len() as i64 > n / 2,
        "the surviving worker finished the epoch ({} elements)",
        got.len()
    );
    let state = cluster
        .replica(1)
        .expect("running")
        .state()
        .read()
        .expect("lock")
        .state
        .clone();
    assert!(
        state.worker(cluster.worker_addr(1)).is_none(),
        "the dead worker was removed"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_mid_epoch_takes_part_and_a_restarted_one_rejoins() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(1, 1).await?;
    let n = 30_000;
    let options = DistributeOptions {
        max_outstanding_requests: Some(8),
        ..DistributeOptions::default()
    };
    let service = cluster
        .client()
        .distribute(&Dataset::range(n), ProcessingMode::Dynamic, options)
        .await?;
    let mut epoch = service.iter().await?;
    let mut got = Vec::new();
    while got.len() < 1000 {
        got.push(
            epoch
                .next()
                .await
                .expect("not over")?
                .as_i64()
                .expect("int"),
        );
    }
    info!("--- adding a worker");
    let added = cluster.add_worker().await?;
    sluice_tests::wait_until(
        "the new worker to get a task",
        Duration::from_secs(20),
        || {
            let tasks = cluster
                .worker(added)
                .map(|w| w.task_ids().len())
                .unwrap_or(0);
            async move { tasks > 0 }
        },
    )
    .await?;
    let rest = tokio::time::timeout(Duration::from_secs(60), epoch.collect()).await??;
    got.extend(sorted_ints(&rest));
    crate::assert_exactly_once(&sorted_ints_of(&got), n);
    cluster.shutdown().await;
    Ok(())
}

fn sorted_ints_of(values: &[i64]) -> Vec<i64> {
    let mut v = values.to_vec();
    v.sort_unstable();
    v
}
