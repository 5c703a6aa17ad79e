//! A three-replica dispatcher quorum keeps serving when a replica dies: the leader is killed
//! mid-epoch and the epoch completes with every element exactly once.

use crate::assert_exactly_once;
use std::time::Duration;
use tokio::time::Instant;
use tracing::info;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_mid_epoch_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 2).await?;
    let n = 20_000;
    let mut epoch = crate::dynamic_range_epoch(&cluster, n, 16).await?;
    let mut got = Vec::new();
    let mut longest_stall = Duration::ZERO;
    let mut last = Instant::now();
    let mut killed = Vec::new();
    while let Some(element) = tokio::time::timeout(Duration::from_secs(60), epoch.next()).await? {
        got.push(element?.as_i64().expect("int"));
        longest_stall = longest_stall.max(last.elapsed());
        last = Instant::now();
        // Kill the leader at a third of the epoch, then the new leader at two thirds (after
        // restarting the first one, so a quorum remains).
        if got.len() as i64 == n / 3 || got.len() as i64 == 2 * n / 3 {
            if let Some(previous) = killed.last() {
                cluster.restart(*previous).await?;
            }
            let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
            info!(leader, at = got.len(), "--- killing the leader");
            cluster.kill(leader).await?;
            killed.push(leader);
            last = Instant::now();
        }
    }
    assert_exactly_once(&got, n);
    assert_eq!(killed.len(), 2);
    info!(?longest_stall, "--- epoch complete");
    assert!(
        longest_stall < Duration::from_secs(5),
        "stalled {longest_stall:?}"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_is_replaced_and_rejoins_after_the_heal() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 2).await?;
    let n = 20_000;
    let mut epoch = crate::dynamic_range_epoch(&cluster, n, 16).await?;
    let mut got = Vec::new();
    let old_leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    while let Some(element) = tokio::time::timeout(Duration::from_secs(60), epoch.next()).await? {
        got.push(element?.as_i64().expect("int"));
        if got.len() as i64 == n / 3 {
            // Clients and workers can still reach the old leader; it must not serve them.
            cluster.isolate(old_leader);
        }
    }
    assert_exactly_once(&got, n);
    cluster.heal();
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    cluster
        .wait_caught_up(old_leader, Duration::from_secs(20))
        .await?;
    info!(old_leader, leader, "--- healed");
    cluster.shutdown().await;
    Ok(())
}
