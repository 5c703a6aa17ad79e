//! Workers joining, dying and returning mid-epoch.

use crate::sorted_ints;
use sluice_client::ElementStream;
use sluice_worker::{LeaseEvent, LeaseObserver};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
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

/// Leases a worker got, as its lease observer saw them (for `range(n)`, split `i` is element
/// `i`).
type Leases = Arc<Mutex<Vec<LeaseEvent>>>;

/// Records every lease a worker gets in `leases`.
fn observe(leases: &Leases) -> LeaseObserver {
    let seen = leases.clone();
    LeaseObserver(Arc::new(move |lease| {
        seen.lock().expect("leases lock").push(lease)
    }))
}

/// The elements of `range(n)` whose splits `leases` hold.
fn leased(leases: &[LeaseEvent]) -> HashSet<i64> {
    leases
        .iter()
        .flat_map(|l| l.start as i64..l.end as i64)
        .collect()
}

/// Reads elements into `got` until `condition` holds, failing past a deadline or at the end of
/// the epoch.
async fn read_until(
    epoch: &mut ElementStream,
    got: &mut Vec<i64>,
    what: &str,
    condition: impl Fn() -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        let next = tokio::time::timeout_at(deadline, epoch.next())
            .await
            .map_err(|_| anyhow::anyhow!("timed out waiting for {what}"))?;
        let element = next.ok_or_else(|| anyhow::anyhow!("the epoch ended before {what}"))??;
        got.push(element.as_i64().expect("int"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_mid_epoch_takes_part_and_a_restarted_one_rejoins() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(1, 0).await?;
    // Small buffers and leases: no worker can lease far ahead of the reader, so the epoch is
    // still mid-way when a worker joins and when one restarts.
    let small = |leases: &Leases| {
        let observer = observe(leases);
        move |config: &mut sluice_worker::WorkerConfig| {
            config.task_buffer = 256;
            config.split_lease = (8, 64);
            config.lease_observer = Some(observer);
        }
    };
    let first_leases = Leases::default();
    let first = cluster.add_worker_with(small(&first_leases)).await?;
    let n = 30_000;
    let mut epoch = crate::dynamic_range_epoch(&cluster, n, 8).await?;
    let mut got = crate::read_ints(&mut epoch, 1000).await?;

    info!("--- adding a worker");
    let added_leases = Leases::default();
    let added = cluster.add_worker_with(small(&added_leases)).await?;
    // A task's pipeline starts on its first read: read on until the added worker leases.
    read_until(
        &mut epoch,
        &mut got,
        "the added worker to lease splits",
        || !added_leases.lock().expect("leases lock").is_empty(),
    )
    .await?;

    info!("--- restarting the first worker at its address");
    cluster.kill_worker(first).await?;
    let before_restart = first_leases.lock().expect("leases lock").len();
    cluster.restart_worker(first).await?;
    let rest = tokio::time::timeout(Duration::from_secs(60), epoch.collect()).await??;
    got.extend(sorted_ints(&rest));

    let delivered: HashSet<i64> = got.iter().copied().collect();
    assert_eq!(delivered.len(), got.len(), "an element was delivered twice");
    let delivered_by_added = leased(&added_leases.lock().expect("leases lock"))
        .intersection(&delivered)
        .count();
    assert!(
        delivered_by_added > 0,
        "the added worker's elements were delivered"
    );
    // Leases recorded after the restart are the restarted worker's, or late replies to the
    // killed one, whose elements can no longer reach a reader: a delivered element from them
    // was produced by the restarted worker.
    let first_leases = first_leases.lock().expect("leases lock").clone();
    let delivered_after_restart = leased(&first_leases[before_restart..])
        .intersection(&delivered)
        .count();
    assert!(
        delivered_after_restart > 0,
        "the restarted worker leased splits again and its elements were delivered \
         ({} leases after the restart)",
        first_leases.len() - before_restart
    );
    // What the first worker held when it was killed (leased or buffered, and leases whose
    // replies reached its pipeline thread only after the kill) is lost with it, and nothing
    // else: every element of the added worker arrived.
    let of_first = leased(&first_leases);
    let missing: Vec<i64> = (0..n)
        .filter(|v| !delivered.contains(v) && !of_first.contains(v))
        .take(20)
        .collect();
    assert!(missing.is_empty(), "lost outside the kill: {missing:?}");
    let state = cluster.state_of(1).expect("running");
    for worker in [first, added] {
        assert!(
            state.worker(cluster.worker_addr(worker)).is_some(),
            "worker {worker} is registered"
        );
    }
    info!(
        delivered_by_added,
        delivered_after_restart,
        total = got.len(),
        "--- epoch complete"
    );
    cluster.shutdown().await;
    Ok(())
}
