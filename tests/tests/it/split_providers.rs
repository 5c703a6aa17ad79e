//! Definitions with several split providers under distributed_epoch: a worker killed mid-epoch
//! of an exactly-once `zip` of two ranges, whose stream another worker takes over by replaying
//! each range's recorded splits.

use crate::assert_exactly_once;
use sluice_client::{DispatcherClientExt, DistributeOptions, ShardingPolicy};
use sluice_element::Element;
use sluice_pipeline::Dataset;
use std::collections::HashSet;
use std::time::Duration;
use tracing::info;

/// `(a, b)` of a pair element.
fn pair(element: &Element) -> (i64, i64) {
    match element {
        Element::Tuple(items) if items.len() == 2 => (
            items[0].as_i64().expect("an int"),
            items[1].as_i64().expect("an int"),
        ),
        other => panic!("not a pair: {}", other.to_json()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_epoch_of_a_zip_of_two_ranges_loses_and_repeats_no_pair(
) -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(1, 0).await?;
    // Small buffers and leases, so the epoch is mid-way when the worker dies and its stream
    // has leases of both ranges to replay.
    for _ in 0..2 {
        cluster
            .add_worker_with(|config| {
                config.task_buffer = 256;
                config.split_lease = (8, 64);
            })
            .await?;
    }
    // The second range is longer than what the workers can lease ahead of it, so every split
    // of the first is paired (a zip ends on its first input).
    let n = 10_000;
    let dataset = Dataset::zip(vec![Dataset::range(n), Dataset::range_with(n, 6 * n, 1)]);
    let options = DistributeOptions {
        max_outstanding_requests: Some(8),
        ..DistributeOptions::default()
    };
    let service = cluster
        .client()
        .distribute(&dataset, ShardingPolicy::Dynamic, options)
        .await?;
    let mut epoch = service.iter().await?;
    let mut got = Vec::new();
    while got.len() < 1500 {
        let element = epoch
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("the epoch ended after {} pairs", got.len()))??;
        got.push(pair(&element));
    }
    info!("--- killing worker 1 for good");
    cluster.kill_worker(1).await?;
    let rest = tokio::time::timeout(Duration::from_secs(60), epoch.collect()).await??;
    got.extend(rest.iter().map(pair));
    let firsts: Vec<i64> = got.iter().map(|(a, _)| *a).collect();
    assert_exactly_once(&firsts, n);
    let seconds: HashSet<i64> = got.iter().map(|(_, b)| *b).collect();
    assert_eq!(
        seconds.len(),
        got.len(),
        "a split of the second range was paired twice"
    );
    assert!(
        seconds.iter().all(|b| (n..6 * n).contains(b)),
        "a pair's second element is not of the second range"
    );
    cluster.shutdown().await;
    Ok(())
}
