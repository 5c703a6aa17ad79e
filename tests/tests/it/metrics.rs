//! The metrics listener of replicas and workers (`metrics_listen`): after an epoch, every node's
//! `/metrics` parses and has the expected series, `/ready` tells serving nodes from the others,
//! and the status data shows the cluster.

use sluice_ops::exposition::{parse, Sample};
use sluice_tests::http::get_async;
use std::time::Duration;
use tracing::info;

const LISTEN: &str = "127.0.0.1:0";

/// The samples a node serves on `/metrics`, checked to parse.
async fn scrape(addr: &str) -> anyhow::Result<Vec<Sample>> {
    let (status, body) = get_async(addr, "/metrics").await?;
    anyhow::ensure!(status == 200, "GET /metrics from {addr}: {status} {body}");
    Ok(parse(&body)?)
}

/// The metrics listener's address of worker `index` of `cluster`.
fn worker_metrics_addr(cluster: &sluice_tests::LocalCluster, index: usize) -> String {
    cluster
        .worker(index)
        .and_then(|w| w.metrics_addr())
        .expect("a worker with a metrics listener")
        .to_string()
}

/// The sum of the samples named `name` (over their labels); `None` when there are none.
fn total(samples: &[Sample], name: &str) -> Option<f64> {
    let values: Vec<f64> = samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_serves_parsable_metrics_with_the_expected_series_after_an_epoch(
) -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    let mut cluster = sluice_tests::LocalCluster::start_with(3, 0, |config| {
        config.metrics_listen = Some(LISTEN.into());
    })
    .await?;
    for _ in 0..2 {
        // Not local: the client reads over the network, through the fetch streams measured.
        cluster
            .add_worker_with(|config| {
                config.metrics_listen = Some(LISTEN.into());
                config.local = false;
            })
            .await?;
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await?;
    let n = 2000;
    info!("--- one distributed_epoch epoch of range({n}) to its end");
    let epoch = crate::dynamic_range_epoch(&cluster, n, 8).await?;
    let got = tokio::time::timeout(Duration::from_secs(60), epoch.collect()).await??;
    crate::assert_exactly_once(&crate::sorted_ints(&got), n);

    info!("--- every replica: Raft, state sizes and RPC series");
    for id in 1..=3 {
        let addr = cluster
            .replica(id)
            .and_then(|r| r.metrics_addr())
            .expect("a replica with a metrics listener")
            .to_string();
        let samples = scrape(&addr).await?;
        for name in [
            "sluice_raft_term",
            "sluice_raft_is_leader",
            "sluice_raft_leader_id",
            "sluice_raft_commit_index",
            "sluice_raft_applied_index",
            "sluice_raft_last_log_index",
            "sluice_jobs",
            "sluice_iterations",
            "sluice_clients",
            "sluice_rpc_requests_total",
            "sluice_rpc_duration_seconds_bucket",
        ] {
            assert!(total(&samples, name).is_some(), "replica {id}: no {name}");
        }
        assert_eq!(total(&samples, "sluice_workers"), Some(2.0), "replica {id}");
        assert_eq!(
            total(&samples, "sluice_raft_leader_id"),
            Some(leader as f64),
            "replica {id}"
        );
        let is_leader = total(&samples, "sluice_raft_is_leader");
        assert_eq!(is_leader, Some(f64::from(u8::from(id == leader))), "{id}");
        assert!(total(&samples, "sluice_raft_term") >= Some(1.0));
        assert_eq!(get_async(&addr, "/ready").await?, (200, "serving\n".into()));
        assert_eq!(get_async(&addr, "/live").await?.0, 200);
        if id == leader {
            let splits = total(&samples, "sluice_splits_leased_total");
            assert_eq!(splits, Some(n as f64), "the leader counted every split");
            assert!(total(&samples, "sluice_split_leases_total") >= Some(1.0));
            assert!(total(&samples, "sluice_raft_commit_latency_seconds_count") >= Some(1.0));
            assert!(total(&samples, "sluice_raft_requests_per_entry_count") >= Some(1.0));
            let calls = samples.iter().any(|s| {
                s.name == "sluice_rpc_requests_total"
                    && s.labels.get("method").map(String::as_str) == Some("WorkerHeartbeat")
            });
            assert!(calls, "the leader counted worker heartbeats");
        }
    }

    info!("--- every worker: tasks, elements and bytes served, pipeline time");
    let mut served = 0.0;
    for index in 0..2 {
        let addr = worker_metrics_addr(&cluster, index);
        let samples = scrape(&addr).await?;
        for name in [
            "sluice_worker_tasks",
            "sluice_worker_buffered_elements",
            "sluice_worker_buffered_bytes",
            "sluice_worker_bytes_served_total",
            "sluice_worker_pipeline_seconds_total",
        ] {
            assert!(total(&samples, name).is_some(), "worker {index}: no {name}");
        }
        served += total(&samples, "sluice_worker_elements_served_total").unwrap_or(0.0);
        assert_eq!(get_async(&addr, "/ready").await?, (200, "serving\n".into()));
        assert_eq!(
            get_async(&addr, "/").await?.0,
            404,
            "workers have no status page"
        );
    }
    assert_eq!(served, n as f64, "the workers served the epoch");

    info!("--- the leader's status data: three members, the job and its iteration");
    let leader_addr = cluster
        .replica(leader)
        .and_then(|r| r.metrics_addr())
        .expect("metrics")
        .to_string();
    let (status, body) = get_async(&leader_addr, "/status.json").await?;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(json["role"], "leader");
    assert_eq!(json["members"].as_array().map(Vec::len), Some(3));
    assert_eq!(json["jobs"].as_array().map(Vec::len), Some(1));
    assert_eq!(json["workers"].as_array().map(Vec::len), Some(2));
    let (status, page) = get_async(&leader_addr, "/").await?;
    assert!(status == 200 && page.contains("status.json"), "{status}");

    info!("--- an isolated follower stops serving, and says why");
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let follower_addr = cluster
        .replica(follower)
        .and_then(|r| r.metrics_addr())
        .expect("metrics")
        .to_string();
    cluster.isolate(follower);
    // Not ready once its election timeout passes.
    let unready = std::sync::Mutex::new(None);
    let (addr, unready_ref) = (follower_addr.as_str(), &unready);
    sluice_tests::wait_until(
        "the isolated follower to stop serving",
        Duration::from_secs(20),
        || async move {
            let answer = get_async(addr, "/ready").await;
            let refused = matches!(answer, Ok((503, _)));
            *unready_ref.lock().unwrap() = Some(answer);
            refused
        },
    )
    .await?;
    let Some(Ok((_, reason))) = unready.into_inner().unwrap() else {
        unreachable!("waited for a 503")
    };
    assert!(reason.contains("no known leader"), "{reason}");
    cluster.heal();

    info!("--- an isolated leader stops serving too");
    cluster
        .wait_caught_up(follower, Duration::from_secs(20))
        .await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let leader_ops = cluster
        .replica(leader)
        .and_then(|r| r.metrics_addr())
        .expect("metrics")
        .to_string();
    cluster.isolate(leader);
    let addr = leader_ops.as_str();
    sluice_tests::wait_until(
        "the isolated leader to stop serving",
        Duration::from_secs(20),
        || async move { matches!(get_async(addr, "/ready").await, Ok((503, _))) },
    )
    .await?;
    cluster.heal();
    cluster.shutdown().await;
    Ok(())
}

/// One dispatcher and two workers with metrics listeners, each configured by `configure`
/// (`second` for the second worker).
async fn two_metered_workers(
    configure: impl Fn(&mut sluice_worker::config::WorkerConfig, bool),
) -> anyhow::Result<sluice_tests::LocalCluster> {
    sluice_tests::init_tracing();
    let mut cluster = sluice_tests::LocalCluster::start(1, 0).await?;
    for second in [false, true] {
        cluster
            .add_worker_with(|config| {
                config.metrics_listen = Some(LISTEN.into());
                config.local = false;
                configure(config, second);
            })
            .await?;
    }
    cluster.wait_for_leader(Duration::from_secs(10)).await?;
    Ok(cluster)
}

/// Metric `name` summed over its samples, on each of the cluster's two workers (0 when absent).
async fn worker_totals(
    cluster: &sluice_tests::LocalCluster,
    name: &str,
) -> anyhow::Result<Vec<f64>> {
    let mut totals = Vec::new();
    for index in 0..2 {
        let samples = scrape(&worker_metrics_addr(cluster, index)).await?;
        totals.push(total(&samples, name).unwrap_or(0.0));
    }
    Ok(totals)
}

/// The rows of one epoch of `rows`' slices, read unsharded (`Off`) from the cluster's workers:
/// each worker serves them all. Each row's bytes.
async fn rows_of_an_epoch(
    cluster: &sluice_tests::LocalCluster,
    rows: sluice_element::Tensor,
) -> anyhow::Result<Vec<bytes::Bytes>> {
    use sluice_client::{DispatcherClientExt, DistributeOptions, ShardingPolicy};
    let service = cluster
        .client()
        .distribute(
            &sluice_pipeline::Dataset::from_slices(rows),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await?;
    let got =
        tokio::time::timeout(Duration::from_secs(60), service.iter().await?.collect()).await??;
    Ok(got
        .iter()
        .map(|element| {
            element
                .as_tensor()
                .and_then(|t| t.raw_data())
                .expect("a row")
                .clone()
        })
        .collect())
}

/// `Auto` compression is for the network: a worker's readers on its machine get elements as
/// they are, unless the worker compresses for them too (`compress_local_readers`, for readers
/// behind a local proxy). Told apart by the bytes each worker served for the same epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_compression_is_for_readers_elsewhere_or_when_the_worker_is_told_so(
) -> anyhow::Result<()> {
    use sluice_element::{DType, Tensor};
    let cluster =
        two_metered_workers(|config, second| config.compress_local_readers = second).await?;
    // 64 rows of 64 KiB of zeros: 4 MiB that snappy makes about twenty times smaller.
    const ROWS: usize = 64;
    const ROW: usize = 64 << 10;
    let zeros = Tensor::from_raw(
        DType::Float32,
        vec![ROWS, ROW / 4],
        vec![0u8; ROWS * ROW].into(),
    )?;
    let got = rows_of_an_epoch(&cluster, zeros).await?;
    // Each of the two workers serves the whole epoch.
    assert_eq!(got.len(), 2 * ROWS);
    for data in &got {
        assert!(data.len() == ROW && data.iter().all(|&b| b == 0));
    }
    let served = worker_totals(&cluster, "sluice_worker_bytes_served_total").await?;
    let whole = (ROWS * ROW) as f64;
    assert!(
        served[0] >= whole,
        "uncompressed on this machine: {served:?}"
    );
    assert!(
        served[1] < whole / 4.0,
        "compressed when told so: {served:?}"
    );
    cluster.shutdown().await;
    Ok(())
}

/// A reader on the worker's machine reads large parts through a shared memory region of its
/// stream, which the worker counts, unless the worker was told to keep every element on the
/// socket (`share_memory_with_local_readers`, `--no-shared-memory`). Both give the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_readers_read_through_shared_memory_unless_the_worker_is_told_not_to(
) -> anyhow::Result<()> {
    use sluice_element::{DType, Tensor};
    let cluster =
        two_metered_workers(|config, second| config.share_memory_with_local_readers = !second)
            .await?;
    // 64 rows of 64 KiB, each row's bytes its index.
    const ROWS: usize = 64;
    const ROW: usize = 64 << 10;
    let data: Vec<u8> = (0..ROWS * ROW).map(|i| (i / ROW) as u8).collect();
    let rows = Tensor::from_raw(DType::UInt8, vec![ROWS, ROW], data.into())?;
    let got = rows_of_an_epoch(&cluster, rows).await?;
    // Each of the two workers serves the whole epoch.
    assert_eq!(got.len(), 2 * ROWS);
    let mut seen = vec![0; ROWS];
    for row in &got {
        assert!(row.len() == ROW && row.iter().all(|&b| b == row[0]));
        seen[row[0] as usize] += 1;
    }
    assert!(
        seen.iter().all(|&n| n == 2),
        "every row from each worker: {seen:?}"
    );
    let shared = worker_totals(&cluster, "sluice_worker_shared_memory_bytes_total").await?;
    // The first batch may leave before the reader mapped the region; most rows go through it.
    let whole = (ROWS * ROW) as f64;
    assert!(shared[0] >= whole / 2.0, "through the region: {shared:?}");
    assert_eq!(shared[1], 0.0, "on the socket when told so: {shared:?}");
    cluster.shutdown().await;
    Ok(())
}
