//! Static sharding (FILE, DATA, FILE_OR_DATA, HINT) on a three-replica quorum whose replicas run
//! with a fixed worker list (`127.0.0.1:%port%` entries): each worker's index, what each worker
//! produces, and tf.data's error texts as the client sees them.
//!
//! What a worker produced is read straight from its fetch stream, task by task (the client
//! library merges workers, and these tests must know who produced what); the client library's
//! own epochs check the union and the errors.

use crate::{assert_exactly_once, sorted_ints};
use sluice_client::DispatcherClientExt;
use sluice_client::{
    ClientError, DatasetId, DispatcherClient, DistributeOptions, RegisterOptions, ShardingPolicy,
    TargetWorkers,
};
use sluice_element::Element;
use sluice_formats::tfrecord::TfRecordWriter;
use sluice_pipeline::{Dataset, Transform};
use sluice_proto::worker::worker_client::WorkerClient;
use sluice_proto::worker::FetchRequest;
use sluice_rpc::{ClientHeartbeat, IterationClient, JobRequest, KnownTasks};
use sluice_tests::TestCluster;
use sluice_worker::{WorkerError, WorkerHandle};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;
use tracing::info;

const EPOCH: Duration = Duration::from_secs(60);
const PORT_ANY: &str = "127.0.0.1:%port%";

async fn static_cluster(workers: usize, entries: usize) -> anyhow::Result<TestCluster> {
    sluice_tests::init_tracing();
    TestCluster::start_static(3, workers, &vec![PORT_ANY; entries]).await
}

/// Each worker's index as the leader's applied state has it, by worker position in the
/// cluster.
async fn indices(cluster: &TestCluster) -> anyhow::Result<Vec<Option<u64>>> {
    let leader = cluster.wait_for_leader(EPOCH).await?;
    cluster.wait_caught_up(leader, EPOCH).await?;
    let state = cluster.state_of(leader).expect("the leader runs");
    Ok((0..cluster.num_workers())
        .map(|w| state.worker_index(cluster.worker_addr(w)))
        .collect())
}

/// One epoch through the client library, or its error.
async fn epoch(
    client: &DispatcherClient,
    dataset: &Dataset,
    mode: ShardingPolicy,
) -> Result<Vec<Element>, ClientError> {
    let service = client
        .distribute(dataset, mode, DistributeOptions::default())
        .await?;
    let stream = service.iter().await?;
    tokio::time::timeout(EPOCH, stream.collect())
        .await
        .expect("the epoch ends in time")
}

/// The worker error an epoch must end with: (worker address, message).
async fn worker_error(
    client: &DispatcherClient,
    dataset: &Dataset,
    mode: ShardingPolicy,
) -> (String, String) {
    match epoch(client, dataset, mode).await {
        Err(ClientError::Worker {
            address, message, ..
        }) => (address, message),
        other => panic!("{dataset} under {mode}: expected a worker error, got {other:?}"),
    }
}

/// One epoch of `dataset` under `mode`, read task by task from each worker's fetch stream:
/// each worker's elements in order (or its pipeline error), by worker address.
async fn read_by_worker(
    cluster: &TestCluster,
    dataset: &Dataset,
    mode: ShardingPolicy,
    num_workers: usize,
) -> anyhow::Result<BTreeMap<String, Result<Vec<Element>, String>>> {
    let client = cluster.client();
    let dataset_id = client
        .register_dataset(dataset, &RegisterOptions::default())
        .await?;
    let job_id = client
        .get_or_create_job(&JobRequest {
            dataset_id: DatasetId(dataset_id),
            sharding: mode,
            job_name: None,
            num_consumers: None,
            use_cross_trainer_cache: false,
            target_workers: TargetWorkers::Auto,
            // Simulated workers number no elements: tf.data's delivery.
            delivery: sluice_types::Delivery::AtMostOnce,
        })
        .await?;
    let iteration = client.get_or_create_iteration(job_id, 0).await?;
    let deadline = tokio::time::Instant::now() + EPOCH;
    let tasks = loop {
        let poll = Duration::from_millis(500);
        let heartbeat = ClientHeartbeat {
            client_id: iteration.client_id,
            known_tasks: KnownTasks::default(),
            current_round: None,
            blocked_round: None,
        };
        // Knowing no task, a reply without a list means there is none yet.
        let tasks = client
            .client_heartbeat(&heartbeat, poll)
            .await?
            .tasks
            .unwrap_or_default();
        if tasks.len() >= num_workers {
            break tasks;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the iteration has {} tasks, expected {num_workers}",
            tasks.len()
        );
    };
    let mut out = BTreeMap::new();
    for task in tasks {
        let produced = fetch_task(&task.worker_address, task.task_id, &iteration).await?;
        out.insert(task.worker_address, produced);
    }
    Ok(out)
}

/// Every element of one task, from its worker's fetch stream (read as the admitted client
/// `reader`), or the pipeline's error.
async fn fetch_task(
    address: &str,
    task_id: u64,
    reader: &IterationClient,
) -> anyhow::Result<Result<Vec<Element>, String>> {
    let deadline = tokio::time::Instant::now() + EPOCH;
    let mut worker = WorkerClient::connect(format!("http://{address}")).await?;
    // The worker may hear of its task a moment after the client does: retry while it says so.
    let (tx, mut stream) = loop {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(FetchRequest {
            task_id,
            credits: 1_000_000,
            client_id: reader.client_id.0,
            admission: reader.admission.to_bytes(),
            ..Default::default()
        })
        .await?;
        match worker.fetch(ReceiverStream::new(rx)).await {
            Ok(response) => break (tx, response.into_inner()),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "task {task_id} never reached {address}: {}",
                    status.message()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => anyhow::bail!("fetch task {task_id} from {address}: {status}"),
        }
    };
    let mut elements = Vec::new();
    loop {
        let batch = tokio::time::timeout_at(deadline, stream.message())
            .await??
            .ok_or_else(|| anyhow::anyhow!("{address} closed task {task_id} before its end"))?;
        if !batch.error.is_empty() {
            return Ok(Err(batch.error));
        }
        let packed = sluice_element::Packed::from_wire(
            batch.packed,
            batch.lengths,
            batch.each_length,
            batch.payloads,
        )?;
        for element in packed.into_decoder() {
            elements.push(element?);
        }
        if batch.end_of_sequence {
            drop(tx); // the request stream stays open until the end, as a reader's does
            return Ok(Ok(elements));
        }
    }
}

fn ints(elements: &[Element]) -> Vec<i64> {
    elements
        .iter()
        .map(|e| e.as_i64().expect("a scalar integer"))
        .collect()
}

fn strings(elements: &[Element]) -> Vec<String> {
    elements
        .iter()
        .map(|e| e.to_json().as_str().expect("a string").to_string())
        .collect()
}

/// `files` TFRecord files `part-NN.tfrecord` of `records` records `file F record R`.
fn write_tfrecords(dir: &Path, files: usize, records: usize) -> anyhow::Result<()> {
    for f in 0..files {
        let mut w = TfRecordWriter::create(dir.join(format!("part-{f:02}.tfrecord")))?;
        for r in 0..records {
            w.write_record(format!("file {f} record {r}").as_bytes())?;
        }
        w.flush()?;
    }
    Ok(())
}

/// What worker `index` of `n` reads under FILE: files `index, index + n, ...`, each in order.
fn file_shard(index: usize, n: usize, files: usize, records: usize) -> Vec<String> {
    (index..files)
        .step_by(n)
        .flat_map(|f| (0..records).map(move |r| format!("file {f} record {r}")))
        .collect()
}

fn pattern(dir: &Path, glob: &str) -> String {
    format!("{}/{glob}", dir.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_sharding_gives_each_worker_its_files() -> anyhow::Result<()> {
    let cluster = static_cluster(3, 3).await?;
    let index = indices(&cluster).await?;
    assert_eq!(
        index
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [Some(0), Some(1), Some(2)].into(),
        "each worker has its own index"
    );
    // Below the cluster's data root: the only place its servers read files from.
    let dir = cluster.data_root();
    let (files, records) = (7, 3);
    write_tfrecords(dir, files, records)?;
    let dataset = Dataset::files(&pattern(dir, "*.tfrecord")).tfrecord();

    info!("--- FILE: worker i reads files i, i + 3, ...");
    let by_worker = read_by_worker(&cluster, &dataset, ShardingPolicy::File, 3).await?;
    let mut union = Vec::new();
    for (w, i) in index.iter().enumerate() {
        let i = i.expect("indexed") as usize;
        let got = strings(
            by_worker[cluster.worker_addr(w)]
                .as_ref()
                .expect("no error"),
        );
        assert_eq!(got, file_shard(i, 3, files, records), "worker index {i}");
        union.extend(got);
    }
    union.sort();
    let mut all = file_shard(0, 1, files, records);
    all.sort();
    assert_eq!(union, all, "the shards cover every record exactly once");

    info!("--- FILE through the client library: every record exactly once");
    let mut got = strings(&epoch(&cluster.client(), &dataset, ShardingPolicy::File).await?);
    got.sort();
    assert_eq!(got, all);

    info!("--- FILE_OR_DATA over text files is FILE");
    for f in 0..5 {
        let text: String = (0..2).map(|l| format!("file {f} record {l}\n")).collect();
        std::fs::write(dir.join(format!("lines-{f}.txt")), text)?;
    }
    let lines = Dataset::files(&pattern(dir, "lines-*.txt")).lines();
    let by_worker = read_by_worker(&cluster, &lines, ShardingPolicy::FileOrData, 3).await?;
    for (w, i) in index.iter().enumerate() {
        let i = i.expect("indexed") as usize;
        let got = strings(
            by_worker[cluster.worker_addr(w)]
                .as_ref()
                .expect("no error"),
        );
        assert_eq!(got, file_shard(i, 3, 5, 2), "worker index {i}");
    }
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_file_or_data_and_hint_shard_elements_by_worker_index() -> anyhow::Result<()> {
    let cluster = static_cluster(3, 3).await?;
    let index = indices(&cluster).await?;
    let cases = [
        (Dataset::range(20), ShardingPolicy::Data),
        (Dataset::range(20), ShardingPolicy::FileOrData), // a range: falls back to DATA
        (Dataset::range(20).shard_hint(), ShardingPolicy::Hint),
        (Dataset::range(20).map("square"), ShardingPolicy::Data),
    ];
    for (dataset, mode) in cases {
        info!(%dataset, %mode, "--- worker i produces the elements k with k ≡ i (mod 3)");
        let squared = dataset.to_string().contains("square");
        let by_worker = read_by_worker(&cluster, &dataset, mode, 3).await?;
        for (w, i) in index.iter().enumerate() {
            let i = i.expect("indexed") as i64;
            let want: Vec<i64> = (0..20)
                .filter(|k| k % 3 == i)
                .map(|k| if squared { k * k } else { k })
                .collect();
            let got = ints(
                by_worker[cluster.worker_addr(w)]
                    .as_ref()
                    .expect("no error"),
            );
            assert_eq!(got, want, "{dataset} under {mode}, worker index {i}");
        }
    }

    info!("--- batches are sharded whole, as tf.data's DATA policy does");
    let batched = Dataset::range(20).batch(3);
    let by_worker = read_by_worker(&cluster, &batched, ShardingPolicy::Data, 3).await?;
    for (w, i) in index.iter().enumerate() {
        let i = i.expect("indexed") as usize;
        let got: Vec<String> = by_worker[cluster.worker_addr(w)]
            .as_ref()
            .expect("no error")
            .iter()
            .map(|e| e.to_json().to_string())
            .collect();
        let batches = [
            "[0,1,2]",
            "[3,4,5]",
            "[6,7,8]",
            "[9,10,11]",
            "[12,13,14]",
            "[15,16,17]",
            "[18,19]",
        ];
        let want: Vec<String> = batches
            .iter()
            .skip(i)
            .step_by(3)
            .map(|b| b.to_string())
            .collect();
        assert_eq!(got, want, "worker index {i}");
    }

    info!("--- through the client library: the shards make the dataset, once");
    for mode in [ShardingPolicy::Data, ShardingPolicy::FileOrData] {
        let got = sorted_ints(&epoch(&cluster.client(), &Dataset::range(20), mode).await?);
        assert_exactly_once(&got, 20);
    }
    let got = epoch(
        &cluster.client(),
        &Dataset::range(20).shard_hint(),
        ShardingPolicy::Hint,
    )
    .await?;
    assert_exactly_once(&sorted_ints(&got), 20);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_sharding_errors_reach_the_client_with_tf_data_texts() -> anyhow::Result<()> {
    let cluster = static_cluster(3, 3).await?;
    let client = cluster.client();
    let workers: Vec<String> = (0..3).map(|w| cluster.worker_addr(w).to_string()).collect();

    info!("--- fewer files than workers, under FILE and FILE_OR_DATA");
    // Below the cluster's data root: the only place its servers read files from.
    let dir = cluster.data_root();
    write_tfrecords(dir, 2, 3)?;
    let two_files = Dataset::files(&pattern(dir, "*.tfrecord")).tfrecord();
    for mode in [ShardingPolicy::File, ShardingPolicy::FileOrData] {
        let (address, message) = worker_error(&client, &two_files, mode).await;
        assert!(workers.contains(&address), "{address}");
        assert_eq!(
            message,
            "Could not apply FILE based sharding: the dataset only has 2 file(s), which is not \
             enough for the required 3 shards/workers. Consider setting the sharding policy to \
             either DATA or OFF, or split your input files into a larger number of small files \
             such that number of files is greater than number of shards/workers.",
            "{mode}"
        );
    }
    info!("--- ... while DATA shards their records");
    let got = epoch(&client, &two_files, ShardingPolicy::Data).await?;
    assert_eq!(got.len(), 6);

    info!("--- FILE on a source that is not files");
    let (_, message) = worker_error(&client, &Dataset::range(20), ShardingPolicy::File).await;
    assert_eq!(message, "Found an unshardable source dataset: range(20)");

    info!("--- a SHARD_HINT placeholder under another policy");
    let hinted = Dataset::range(20).shard_hint();
    for mode in [
        ShardingPolicy::Off,
        ShardingPolicy::FileOrData,
        ShardingPolicy::Data,
    ] {
        let (_, message) = worker_error(&client, &hinted, mode).await;
        assert_eq!(
            message,
            "`tf.data.Dataset.shard(SHARD_HINT, ...)` can only be used in \
             `tf.distribute.Strategy.experimental_distribute_dataset()` with \
             `tf.data.experimental.AutoShardPolicy.HINT` policy, or tf.data service with \
             `tf.data.experimental.service.ShardingPolicy.HINT` processing mode.",
            "{mode}"
        );
    }
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_workers_than_configured_entries_are_refused() -> anyhow::Result<()> {
    let cluster = static_cluster(2, 2).await?;
    let index = indices(&cluster).await?;
    let mut list = vec![String::new(); 2];
    for (w, i) in index.iter().enumerate() {
        list[i.expect("indexed") as usize] = cluster.worker_addr(w).to_string();
    }

    info!("--- a third worker on the same host finds no free entry");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let refused = WorkerHandle::start_on(listener, cluster.worker_config(addr.clone())).await;
    match refused {
        Err(WorkerError::Registration(message)) => assert_eq!(
            message,
            format!(
                "Failed to assign an index for worker {addr}. Configured workers list: [{}]. The \
                 worker's address is not configured, or other workers are already running at the \
                 configured host. If your worker has restarted, make sure it runs at the same \
                 address and port.",
                list.join(", ")
            )
        ),
        Err(other) => panic!("expected a refused registration, got {other}"),
        Ok(_) => panic!("a third worker registered with two entries"),
    }
    let leader = cluster.wait_for_leader(EPOCH).await?;
    let state = cluster.state_of(leader).expect("the leader runs");
    assert!(
        state.worker(&addr).is_none(),
        "the refused worker is not registered"
    );
    assert_eq!(state.static_workers(), list.as_slice());

    info!("--- the two registered workers still serve their shards");
    let got =
        sorted_ints(&epoch(&cluster.client(), &Dataset::range(10), ShardingPolicy::Data).await?);
    assert_exactly_once(&got, 10);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_worker_list_fails_static_tasks_with_not_found() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 2).await?;
    let client = cluster.client();
    let workers: Vec<String> = (0..2).map(|w| cluster.worker_addr(w).to_string()).collect();
    for mode in [
        ShardingPolicy::Data,
        ShardingPolicy::FileOrData,
        ShardingPolicy::Hint,
    ] {
        let (address, message) = worker_error(&client, &Dataset::range(20), mode).await;
        assert!(workers.contains(&address), "{address}");
        assert_eq!(
            message,
            format!(
                "Failed to shard dataset in tf.data service: Worker {address} is not in the \
                 workers list. Got workers list ."
            ),
            "{mode}"
        );
    }
    info!("--- non-static modes are unaffected");
    let got = sorted_ints(&epoch(&client, &Dataset::range(20), ShardingPolicy::Dynamic).await?);
    assert_exactly_once(&got, 20);
    cluster.shutdown().await;
    Ok(())
}

/// Asserts every running replica gives worker `w` the index `want`.
async fn assert_index_everywhere(cluster: &TestCluster, w: usize, want: u64) -> anyhow::Result<()> {
    for id in 1..=3 {
        if cluster.replica(id).is_none() {
            continue;
        }
        cluster.wait_caught_up(id, EPOCH).await?;
        let state = cluster.state_of(id).expect("running");
        assert_eq!(
            state.worker_index(cluster.worker_addr(w)),
            Some(want),
            "replica {id}, worker {w}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_keeps_its_index() -> anyhow::Result<()> {
    let mut cluster = static_cluster(2, 2).await?;
    let index = indices(&cluster).await?;
    let first = index[0].expect("indexed");

    info!("--- worker 0 dies and is expired by the leader");
    cluster.kill_worker(0).await?;
    let addr = cluster.worker_addr(0).to_string();
    sluice_tests::wait_until("the dead worker's removal", EPOCH, || {
        let cluster = &cluster;
        let addr = addr.clone();
        async move {
            let Ok(leader) = cluster.wait_for_leader(EPOCH).await else {
                return false;
            };
            cluster
                .state_of(leader)
                .is_some_and(|s| s.worker(&addr).is_none())
        }
    })
    .await?;

    info!("--- back at the same address: the same entry, the same shard");
    cluster.restart_worker(0).await?;
    assert_index_everywhere(&cluster, 0, first).await?;
    assert_index_everywhere(&cluster, 1, index[1].expect("indexed")).await?;
    let by_worker = read_by_worker(&cluster, &Dataset::range(10), ShardingPolicy::Data, 2).await?;
    let got = ints(by_worker[&addr].as_ref().expect("no error"));
    let want: Vec<i64> = (0..10).filter(|k| *k as u64 % 2 == first).collect();
    assert_eq!(got, want);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_does_not_change_indices() -> anyhow::Result<()> {
    let mut cluster = static_cluster(2, 3).await?;
    let before = indices(&cluster).await?;

    info!("--- the leader dies");
    let old = cluster.wait_for_leader(EPOCH).await?;
    cluster.kill(old).await?;
    let new = cluster.wait_for_leader(EPOCH).await?;
    assert_ne!(old, new);
    assert_eq!(indices(&cluster).await?, before);

    info!("--- a worker registered by the new leader takes the free entry");
    let w = cluster.add_worker().await?;
    let mut taken: Vec<u64> = before.iter().map(|i| i.expect("indexed")).collect();
    taken.sort();
    let free = (0..3)
        .find(|i| !taken.contains(i))
        .expect("one entry is free");
    assert_index_everywhere(&cluster, w, free).await?;

    info!("--- the old leader comes back and agrees");
    cluster.restart(old).await?;
    for (w, i) in before.iter().enumerate() {
        assert_index_everywhere(&cluster, w, i.expect("indexed")).await?;
    }
    assert_index_everywhere(&cluster, w, free).await?;

    let by_worker = read_by_worker(&cluster, &Dataset::range(30), ShardingPolicy::Data, 3).await?;
    for (w, i) in indices(&cluster).await?.iter().enumerate() {
        let i = i.expect("indexed") as i64;
        let want: Vec<i64> = (0..30).filter(|k| k % 3 == i).collect();
        assert_eq!(
            ints(
                by_worker[cluster.worker_addr(w)]
                    .as_ref()
                    .expect("no error")
            ),
            want
        );
    }
    cluster.shutdown().await;
    Ok(())
}
