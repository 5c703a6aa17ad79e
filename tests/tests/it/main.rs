//! Cross-crate tests of Sluice: a dispatcher quorum and workers in
//! this process over real gRPC, read through the client library. One test binary, modules by
//! topic.

mod bad_input;
mod blobs;
mod coordinated_reads;
mod cross_trainer_cache;
mod data_dir_identity;
mod data_roots;
mod distribute;
mod dropped_connections;
mod failover;
mod fetch_admission;
mod heartbeats;
mod hostile_input;
mod jobs_and_datasets;
mod limits;
mod metrics;
mod object_store;
mod object_store_settings;
mod processing_modes;
mod quorum;
mod reader_state;
mod restart;
mod secure_workers;
mod security;
mod simulated_worker;
mod split_providers;
mod static_sharding;
mod target_workers;
mod workers;

use sluice_client::DispatcherClientExt;
use sluice_client::{
    ClientError, DistributeOptions, ElementStream, ServiceDataset, ShardingPolicy,
};
use sluice_element::Element;
use sluice_tests::TestCluster;
use std::time::Duration;

/// Reads one epoch to its end, failing the test past `timeout`.
pub async fn read_epoch(
    service: &ServiceDataset,
    timeout: Duration,
) -> anyhow::Result<Vec<Element>> {
    let epoch = service.iter().await?;
    Ok(tokio::time::timeout(timeout, epoch.collect()).await??)
}

/// Scalar integer elements as numbers, sorted.
pub fn sorted_ints(elements: &[Element]) -> Vec<i64> {
    let mut out: Vec<i64> = elements
        .iter()
        .map(|e| e.as_i64().expect("a scalar integer element"))
        .collect();
    out.sort_unstable();
    out
}

/// Asserts `got` holds each of `0..n` exactly once, naming duplicates and missing ones.
pub fn assert_exactly_once(got: &[i64], n: i64) {
    let mut counts = std::collections::BTreeMap::new();
    for v in got {
        *counts.entry(*v).or_insert(0u32) += 1;
    }
    let duplicates: Vec<_> = counts
        .iter()
        .filter(|(_, c)| **c > 1)
        .map(|(v, c)| (*v, *c))
        .take(20)
        .collect();
    let missing: Vec<i64> = (0..n)
        .filter(|v| !counts.contains_key(v))
        .take(20)
        .collect();
    assert!(
        duplicates.is_empty() && missing.is_empty() && got.len() as i64 == n,
        "{} elements for 0..{n}; duplicates (value, count): {duplicates:?}; missing: {missing:?}",
        got.len()
    );
}

/// Starts a distributed epoch of `range(n)` with at most `outstanding` elements requested.
pub async fn dynamic_range_epoch(
    cluster: &TestCluster,
    n: i64,
    outstanding: u32,
) -> anyhow::Result<ElementStream> {
    range_epoch(cluster, ShardingPolicy::Dynamic, n, outstanding).await
}

/// Starts an epoch of `range(n)` in `mode` with at most `outstanding` elements requested.
pub async fn range_epoch(
    cluster: &TestCluster,
    mode: ShardingPolicy,
    n: i64,
    outstanding: u32,
) -> anyhow::Result<ElementStream> {
    let options = DistributeOptions {
        max_outstanding_requests: Some(outstanding),
        ..DistributeOptions::default()
    };
    let dataset = sluice_pipeline::Dataset::range(n);
    let service = cluster.client().distribute(&dataset, mode, options).await?;
    Ok(service.iter().await?)
}

/// Reads the next `k` elements, scalar integers, of an epoch that has at least that many left.
pub async fn read_ints(epoch: &mut ElementStream, k: usize) -> anyhow::Result<Vec<i64>> {
    let mut got = Vec::with_capacity(k);
    while got.len() < k {
        let element = epoch
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("the epoch ended after {} elements", got.len()))??;
        got.push(
            element
                .as_i64()
                .ok_or_else(|| anyhow::anyhow!("not an integer: {}", element.to_json()))?,
        );
    }
    Ok(got)
}

/// The message of an `InvalidArgument` error, failing the test on anything else.
pub fn invalid_argument<T>(result: Result<T, ClientError>) -> String {
    match result {
        Err(ClientError::InvalidArgument(message)) => message,
        Err(other) => panic!("expected InvalidArgument, got {other:?}"),
        Ok(_) => panic!("expected InvalidArgument, got success"),
    }
}
