//! A dispatcher killed and restarted from its data dir keeps every dataset, job and split
//! cursor; workers and clients reconnect by themselves and the epoch continues without
//! duplicates.

use sluice_client::DispatcherClientExt;
use sluice_client::{DistributeOptions, ShardingPolicy};
use sluice_pipeline::Dataset;
use std::collections::HashSet;
use std::time::Duration;
use tracing::info;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_dispatcher_resumes_the_epoch_without_duplicates() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(1, 2).await?;
    let client = cluster.client();
    let n = 3000;
    let options = DistributeOptions {
        max_outstanding_requests: Some(8),
        ..DistributeOptions::default()
    };
    let service = client
        .distribute(&Dataset::range(n), ShardingPolicy::Dynamic, options)
        .await?;
    let mut epoch = service.iter().await?;

    info!("--- read part of the epoch, then kill the dispatcher");
    let mut seen = crate::read_ints(&mut epoch, 500).await?;
    // The state as the replica applied it when it died: everything in it was committed.
    let handle = cluster.replica(1).expect("running").state().clone();
    cluster.kill(1).await?;
    let before = handle.read().expect("lock").state.clone();

    info!("--- the client keeps reading what the workers hold, then waits; restart");
    cluster.restart(1).await?;
    cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let after = cluster.state_of(1).expect("running");
    assert_eq!(after.datasets().count(), before.datasets().count());
    assert_eq!(after.jobs().count(), before.jobs().count());
    assert_eq!(after.iterations().count(), before.iterations().count());
    assert!(before.iterations().count() > 0, "the epoch's iteration");
    for (a, b) in after.iterations().zip(before.iterations()) {
        // Workers may lease more right after the restart; a cursor never moves back.
        assert_eq!(a.id, b.id);
        assert_eq!(a.cursors.len(), b.cursors.len());
        for (ca, cb) in a.cursors.iter().zip(&b.cursors) {
            assert!(
                (ca.repetition, ca.next) >= (cb.repetition, cb.next),
                "cursor went back: {cb:?} -> {ca:?}"
            );
        }
    }

    info!("--- finish the epoch");
    let rest = tokio::time::timeout(Duration::from_secs(60), epoch.collect()).await??;
    seen.extend(rest.iter().map(|e| e.as_i64().expect("int")));
    let unique: HashSet<i64> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "an element was delivered twice");
    // Nothing here dies but the dispatcher, whose leases are committed: nothing is lost either.
    assert_eq!(unique.len() as i64, n, "elements were lost");
    cluster.shutdown().await;
    Ok(())
}
