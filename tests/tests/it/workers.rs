//! Workers joining, dying and returning mid-epoch.

use crate::sorted_ints;
use std::collections::HashSet;
use std::time::Duration;
use tracing::info;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_is_removed_and_the_epoch_still_ends() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(1, 0).await?;
    // A dead worker's buffered elements and leased splits are lost with it. Small buffers and
    // leases keep that loss small, so the epoch is still mid-way when the worker dies: with the
    // defaults both pipelines may have leased and buffered the whole range by then, and what the
    // survivor delivers depends on the race between them.
    for _ in 0..2 {
        cluster
            .add_worker_with(|config| {
                config.task_buffer = 256;
                config.split_lease = (8, 64);
            })
            .await?;
    }
    let n = 20_000;
    let mut epoch = crate::dynamic_range_epoch(&cluster, n, 8).await?;
    let mut got = crate::read_ints(&mut epoch, 2000).await?;
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
    let state = cluster.state_of(1).expect("running");
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
    let mut epoch = crate::dynamic_range_epoch(&cluster, n, 8).await?;
    let mut got = crate::read_ints(&mut epoch, 1000).await?;
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
    crate::assert_exactly_once(&got, n);
    cluster.shutdown().await;
    Ok(())
}
