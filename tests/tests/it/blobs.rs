//! Large constants outside the Raft log: a `from_slices` array far over the definition limit
//! registers on a three-replica quorum as a blob (no leader change while it uploads), is read
//! exactly once under `distributed_epoch` by two workers, survives a follower that lost it and
//! a leader's death, and is deleted from every replica once its dataset is collected. Forged
//! blobs and definitions naming unknown blobs are refused.

use crate::assert_exactly_once;
use sluice_client::{
    ClientError, DispatcherClientExt, DistributeOptions, RpcError, ShardingPolicy,
};
use sluice_element::blob_tensors::{self, BlobDigest};
use sluice_element::{DType, Tensor};
use sluice_pipeline::Dataset;
use sluice_proto::dispatcher as pb;
use sluice_proto::dispatcher::dispatcher_client::DispatcherClient as Stub;
use sluice_tests::TestCluster;
use sluice_types::NodeId;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tracing::info;

const MIB: usize = 1024 * 1024;
const WAIT: Duration = Duration::from_secs(60);

/// A random offset of the row values, so each run's array is new to the workers' blob cache
/// (shared by the processes of a machine) and they fetch it.
fn salt() -> usize {
    // Below 2^24 with the rows added: float32 holds every integer there exactly.
    rand::random::<u32>() as usize % 16_000 * 1024
}

/// `rows` rows of `row_bytes / 4` float32s each, row `i` all `salt + i`; with the digest of the
/// data.
fn rows_of(rows: usize, row_bytes: usize, salt: usize) -> (Tensor, BlobDigest) {
    let per_row = row_bytes / 4;
    let mut data = Vec::with_capacity(rows * per_row * 4);
    for i in 0..rows {
        let value = ((salt + i) as f32).to_le_bytes();
        for _ in 0..per_row {
            data.extend_from_slice(&value);
        }
    }
    let digest = blob_tensors::digest(&data);
    let tensor =
        Tensor::from_raw(DType::Float32, vec![rows, per_row], data.into()).expect("a valid tensor");
    (tensor, digest)
}

/// Every running replica's (id, current leader, term).
fn views(cluster: &TestCluster) -> Vec<(u64, Option<u64>, u64)> {
    (1..=3)
        .filter_map(|id| cluster.replica(id))
        .map(|replica| {
            let metrics = replica.raft().metrics().borrow().clone();
            (replica.id(), metrics.current_leader, metrics.current_term)
        })
        .collect()
}

/// The file replica `id` keeps blob `digest` in.
fn blob_file(cluster: &TestCluster, id: NodeId, digest: &BlobDigest) -> PathBuf {
    cluster
        .replica_data_dir(id)
        .expect("a replica of the cluster")
        .join("blobs")
        .join(blob_tensors::hex(digest))
}

/// The row index an element of `rows_of(_, _, salt)` stands for (its first value).
fn row_index(element: &sluice_element::Element, salt: usize) -> i64 {
    let data = element
        .as_tensor()
        .and_then(|t| t.raw_data())
        .expect("a float32 row");
    let first = f32::from_le_bytes(data[..4].try_into().expect("four bytes"));
    let last = f32::from_le_bytes(data[data.len() - 4..].try_into().expect("four bytes"));
    assert_eq!(first, last, "a row holds one value");
    first as i64 - salt as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_array_is_a_blob_every_replica_keeps_until_its_dataset_is_collected(
) -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    const ROWS: usize = 1024;
    // 64 MiB: four times the default definition limit.
    let salt = salt();
    let (tensor, digest) = rows_of(ROWS, 64 * MIB / ROWS, salt);
    let mut cluster = TestCluster::start_with(3, 2, |config| {
        config.job_gc_timeout = Some(Duration::from_millis(300));
        config.dataset_gc_timeout = Some(Duration::from_millis(300));
        config.gc_dynamic_jobs = true;
        config.blob_gc_grace = Duration::from_secs(5);
        config.blob_maintenance_interval = Duration::from_millis(200);
        // Elections only after 2 s without a heartbeat: a registration that starved the
        // leader's heartbeats would still change the leader, a loaded machine's scheduling
        // hiccups (the test kit's default is 150-300 ms) would not.
        config.election_timeout = (Duration::from_secs(2), Duration::from_secs(4));
    })
    .await?;
    let leader = cluster.wait_for_leader(WAIT).await?;
    let before = views(&cluster);
    let client = cluster.client();

    info!("--- registering 64 MiB of from_slices");
    let started = Instant::now();
    let options = DistributeOptions {
        max_outstanding_requests: Some(4),
        ..DistributeOptions::default()
    };
    let service = client
        .distribute(
            &Dataset::from_slices(tensor),
            ShardingPolicy::Dynamic,
            options,
        )
        .await?;
    info!(took = ?started.elapsed(), "--- registered");
    // Reading at once: a job with a reading client is never collected.
    let mut epoch = service.iter().await?;
    assert_eq!(
        views(&cluster),
        before,
        "no leader change during the registration"
    );
    // A majority holds the blob when the upload is acknowledged; the last replica soon after.
    sluice_tests::wait_until("every replica holds the blob", WAIT, || {
        (1..=3).all(|id| blob_file(&cluster, id, &digest).exists())
    })
    .await?;
    let state = cluster.state_of(leader).expect("the leader runs");
    assert!(state.live_blobs().contains(&digest));

    let mut got = Vec::new();
    while got.len() < ROWS / 3 {
        let element = tokio::time::timeout(WAIT, epoch.next())
            .await?
            .expect("the epoch has more")?;
        got.push(row_index(&element, salt));
    }

    info!("--- a follower loses the blob and restarts: it fetches it from a peer");
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    cluster.kill(follower).await?;
    std::fs::remove_file(blob_file(&cluster, follower, &digest))?;
    cluster.restart(follower).await?;
    sluice_tests::wait_until("the restarted follower holds the blob again", WAIT, || {
        blob_file(&cluster, follower, &digest).exists()
    })
    .await?;

    info!("--- the leader dies: the others serve the definition and its blob");
    cluster.kill(leader).await?;
    let new_leader = cluster.wait_for_leader(WAIT).await?;
    assert_ne!(new_leader, leader);
    let fetched = client.get_blob(&digest, (64 * MIB) as u64).await?;
    assert_eq!(blob_tensors::digest(&fetched), digest);
    // The restarted follower serves it itself, whoever leads.
    let mut stub = Stub::connect(format!(
        "http://{}",
        cluster.replica_addr(follower).expect("the follower runs")
    ))
    .await?;
    let mut chunks = stub
        .get_blob(pb::GetBlobRequest {
            digest: digest.to_vec(),
            offset: (64 * MIB - 10) as u64,
        })
        .await?
        .into_inner();
    let mut tail = Vec::new();
    while let Some(chunk) = chunks.message().await? {
        tail.extend_from_slice(&chunk.data);
    }
    assert_eq!(tail.len(), 10, "read from an offset");

    while let Some(element) = tokio::time::timeout(WAIT, epoch.next()).await? {
        got.push(row_index(&element?, salt));
    }
    assert_exactly_once(&got, ROWS as i64);

    info!("--- the dataset collected: its blob leaves every replica");
    cluster.restart(leader).await?;
    epoch.close(sluice_tests::HANG).await;
    drop(service);
    let leader = cluster.wait_for_leader(WAIT).await?;
    sluice_tests::wait_until("the dataset collected", WAIT, || {
        cluster
            .state_of(leader)
            .is_some_and(|state| state.datasets().next().is_none() && state.live_blobs().is_empty())
    })
    .await?;
    sluice_tests::wait_until("no replica holds the blob", WAIT, || {
        (1..=3).all(|id| !blob_file(&cluster, id, &digest).exists())
    })
    .await?;
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_blobs_and_unknown_digests_are_refused() -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    let cluster = TestCluster::start(1, 0).await?;
    cluster.wait_for_leader(WAIT).await?;
    let client = cluster.client();

    let data = bytes::Bytes::from(vec![7u8; 3 * MIB + 5]);
    let forged = blob_tensors::digest(b"something else");
    match client.put_blob(&forged, data.clone()).await {
        Err(RpcError::InvalidArgument(message)) => {
            assert!(message.contains("hash to"), "{message}");
            assert!(message.contains(&blob_tensors::hex(&forged)), "{message}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let blobs = cluster.replica_data_dir(1).unwrap().join("blobs");
    assert_eq!(
        std::fs::read_dir(&blobs)?.count(),
        0,
        "nothing kept of a forged blob"
    );
    let digest = blob_tensors::digest(&data);
    client.put_blob(&digest, data.clone()).await?;
    assert!(blobs.join(blob_tensors::hex(&digest)).exists());
    // Again: the dispatcher holds it already.
    client.put_blob(&digest, data.clone()).await?;

    // A definition naming a blob nobody uploaded.
    let unknown = blob_tensors::digest(b"never uploaded");
    let mut def = Dataset::from_slices(rows_of(4, 16, 0).0).into_def();
    blob_tensors::visit_mut(&mut def, &mut |t| {
        t.blob_len = t.data.len() as u64;
        t.data.clear();
        t.blob_digest = unknown.to_vec();
    });
    match client
        .register_dataset_def(&def, None, &pb::DatasetMetadata::default())
        .await
    {
        Err(RpcError::FailedPrecondition(message)) => {
            assert!(message.contains(&blob_tensors::hex(&unknown)), "{message}");
        }
        other => panic!("expected FailedPrecondition, got {other:?}"),
    }
    // The same with a blob that is there but shorter than named.
    blob_tensors::visit_mut(&mut def, &mut |t| {
        t.blob_digest = digest.to_vec();
    });
    match client
        .register_dataset_def(&def, None, &pb::DatasetMetadata::default())
        .await
    {
        Err(RpcError::FailedPrecondition(message)) => {
            assert!(message.contains("not the 64 bytes"), "{message}");
        }
        other => panic!("expected FailedPrecondition, got {other:?}"),
    }
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_blob_store_refuses_an_upload_at_once_and_keeps_nothing_of_it() -> anyhow::Result<()>
{
    sluice_tests::init_tracing();
    let cluster = TestCluster::start_with(1, 0, |config| {
        config.max_blob_store_size = 4 * MIB as u64;
    })
    .await?;
    cluster.wait_for_leader(WAIT).await?;
    let client = cluster.client();
    let (first, first_digest) = rows_of(1024, 3 * MIB / 1024, salt());
    let first = bytes::Bytes::copy_from_slice(first.raw_data().expect("raw data"));
    client.put_blob(&first_digest, first).await?;

    // A store that is full stays full however often the upload is sent: the client must get
    // the refusal itself, not retry it until its deadline and then report the dispatcher as
    // unavailable.
    let (second, second_digest) = rows_of(1024, 3 * MIB / 1024, salt() + 1);
    let blobs = cluster.replica_data_dir(1).unwrap().join("blobs");
    let before = std::fs::read_dir(&blobs)?.count();
    match client
        .put_blob(
            &second_digest,
            bytes::Bytes::copy_from_slice(second.raw_data().expect("raw data")),
        )
        .await
    {
        Err(RpcError::Status { code, message }) => {
            assert_eq!(code, tonic::Code::ResourceExhausted, "{message}");
            assert!(message.contains("--max-blob-store-size"), "{message}");
            assert!(
                message.contains(&blob_tensors::hex(&second_digest)),
                "{message}"
            );
        }
        other => panic!("expected ResourceExhausted, got {other:?}"),
    }
    assert_eq!(std::fs::read_dir(&blobs)?.count(), before, "nothing kept");

    // The same through a registration: the dataset is refused with the store's reason.
    let dataset = Dataset::from_slices(second);
    match client
        .distribute(&dataset, ShardingPolicy::Off, DistributeOptions::default())
        .await
    {
        Err(ClientError::Rpc { code, message }) => {
            assert_eq!(code, tonic::Code::ResourceExhausted, "{message}");
            assert!(message.contains("--max-blob-store-size"), "{message}");
        }
        Err(other) => panic!("expected ResourceExhausted, got {other:?}"),
        Ok(_) => panic!("a dataset whose blob does not fit was registered"),
    }
    cluster.shutdown().await;
    Ok(())
}
