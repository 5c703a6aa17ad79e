//! parallel_epochs and distributed_epoch with one dispatcher and two workers.

use crate::{read_epoch, sorted_ints};
use sluice_client::DispatcherClientExt;
use sluice_client::{DistributeOptions, ShardingPolicy};
use sluice_formats::tfrecord::TfRecordWriter;
use sluice_pipeline::{Dataset, Transform};
use std::time::Duration;

const EPOCH: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_epochs_yields_every_element_once_per_worker() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 2).await?;
    let service = cluster
        .client()
        .distribute(
            &Dataset::range(10),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await?;
    let got = sorted_ints(&read_epoch(&service, EPOCH).await?);
    let want: Vec<i64> = (0..10).flat_map(|i| [i, i]).collect();
    assert_eq!(got, want);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_epoch_over_a_range_yields_every_element_exactly_once() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 2).await?;
    let n = 20_000;
    let service = cluster
        .client()
        .distribute(
            &Dataset::range(n),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    let got = sorted_ints(&read_epoch(&service, EPOCH).await?);
    crate::assert_exactly_once(&got, n);
    // Each worker got a task (splits are leased first-come-first-served, in growing ranges, so
    // how much each one produced is up to the race).
    let status = cluster.state_of(1).expect("running");
    let tasks: Vec<_> = status
        .iterations()
        .flat_map(|it| it.tasks.clone())
        .collect();
    assert_eq!(tasks.len(), 2);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_epoch_over_a_directory_of_files_yields_every_record_exactly_once(
) -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 2).await?;
    // Below the cluster's data root: the only place its servers read files from.
    let dir = cluster.data_root();
    let mut want = Vec::new();
    for f in 0..12 {
        let mut writer = TfRecordWriter::create(dir.join(format!("part-{f:02}.tfrecord")))?;
        for r in 0..50 {
            let record = format!("file{f}-record{r}");
            writer.write_record(record.as_bytes())?;
            want.push(record);
        }
        writer.flush()?;
    }
    std::fs::write(dir.join("ignored.txt"), "not a record file")?;
    let pattern = format!("{}/*.tfrecord", dir.display());
    let service = cluster
        .client()
        .distribute(
            &Dataset::files(&pattern).tfrecord(),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    let got = sluice_tests::sorted_strings(&read_epoch(&service, EPOCH).await?);
    want.sort();
    assert_eq!(got, want);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maps_before_distribute_run_on_workers_and_after_it_on_the_client() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 1).await?;
    let client = cluster.client();
    let service = client
        .distribute(
            &Dataset::range(5).map("square"),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await?;
    let registered = client
        .register_dataset(&Dataset::range(5).map("square"), &Default::default())
        .await?;
    assert_ne!(registered, service.dataset_id());
    let local = service.clone().map("square");
    let got = sorted_ints(&read_epoch(&local, EPOCH).await?);
    assert_eq!(got, vec![0, 1, 16, 81, 256]);
    // The definition workers run is the one registered by `distribute`: the same as
    // `range(5).map(square)`'s, so it holds the first map only, and the map after
    // `distribute` registered nothing.
    let state = cluster.state_of(1).expect("running");
    let def = |id: &str| {
        let id = sluice_types::DatasetId(id.into());
        state
            .dataset(&id)
            .and_then(|d| state.dataset_def(d).map(<[u8]>::to_vec))
    };
    assert_eq!(def(service.dataset_id()), def(&registered));
    assert!(def(&registered).is_some());
    assert_eq!(state.datasets().count(), 2);
    assert_eq!(state.sizes().definitions, 1, "one definition, stored once");
    // The same dataset object without the local op: a new epoch, squares only.
    let got = sorted_ints(&read_epoch(&service, EPOCH).await?);
    assert_eq!(got, vec![0, 1, 4, 9, 16]);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_job_is_shared_and_each_iter_is_a_new_epoch() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 2).await?;
    let client = cluster.client();
    let options = DistributeOptions {
        job_name: Some("shared".into()),
        ..DistributeOptions::default()
    };
    let a = client
        .distribute(
            &Dataset::range(100),
            ShardingPolicy::Dynamic,
            options.clone(),
        )
        .await?;
    let b = client
        .distribute(&Dataset::range(100), ShardingPolicy::Dynamic, options)
        .await?;
    // Two consumers of one job split the epoch between them.
    let (ea, eb) = (a.iter().await?, b.iter().await?);
    let (ra, rb) = tokio::join!(ea.collect(), eb.collect());
    let mut both = [ra?, rb?].concat();
    both.sort_by_key(|e| e.as_i64());
    assert_eq!(sorted_ints(&both), (0..100).collect::<Vec<_>>());
    // The next epoch of `a` is a new iteration with every element again.
    assert_eq!(
        sorted_ints(&read_epoch(&a, EPOCH).await?),
        (0..100).collect::<Vec<_>>()
    );
    cluster.shutdown().await;
    Ok(())
}

/// Leases a worker got, as its lease observer saw them.
type Leases = std::sync::Arc<std::sync::Mutex<Vec<sluice_worker::LeaseEvent>>>;

async fn observed_worker(
    cluster: &sluice_tests::TestCluster,
    leases: &Leases,
    config: sluice_worker::WorkerConfig,
) -> anyhow::Result<sluice_worker::WorkerHandle> {
    let seen = leases.clone();
    let observer = sluice_worker::LeaseObserver(std::sync::Arc::new(move |lease| {
        seen.lock().unwrap().push(lease)
    }));
    Ok(
        sluice_worker::WorkerHandle::start(sluice_worker::WorkerConfig {
            dispatcher: cluster.dispatcher_addrs(),
            lease_observer: Some(observer),
            ..config
        })
        .await?,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_leases_the_next_splits_before_its_pipeline_used_up_the_current_ones(
) -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 0).await?;
    let leases: Leases = Default::default();
    // Leases of 16 splits, and a pipeline held back by a one-element buffer and a reader that
    // takes one element: it cannot use up the first lease, so a second lease is a prefetch.
    let worker = observed_worker(
        &cluster,
        &leases,
        sluice_worker::WorkerConfig {
            split_lease: (16, 16),
            task_buffer: 1,
            ..Default::default()
        },
    )
    .await?;
    let mut epoch = crate::dynamic_range_epoch(&cluster, 1000, 1).await?;
    assert_eq!(crate::read_ints(&mut epoch, 1).await?, vec![0]);
    sluice_tests::wait_until("a second lease", Duration::from_secs(20), || async {
        leases.lock().unwrap().len() >= 2
    })
    .await?;
    let got: Vec<(u64, u64)> = leases
        .lock()
        .unwrap()
        .iter()
        .map(|l| (l.start, l.end))
        .collect();
    assert_eq!(got[..2], [(0, 16), (16, 32)]);
    drop(epoch);
    worker.shutdown().await;
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetched_leases_hand_out_every_split_once_across_workers() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 0).await?;
    let leases: Leases = Default::default();
    let config = || sluice_worker::WorkerConfig {
        split_lease: (4, 256),
        ..Default::default()
    };
    let a = observed_worker(&cluster, &leases, config()).await?;
    let b = observed_worker(&cluster, &leases, config()).await?;
    let n = 30_000;
    let epoch = crate::dynamic_range_epoch(&cluster, n, 64).await?;
    let got = tokio::time::timeout(EPOCH, epoch.collect()).await??;
    crate::assert_exactly_once(&sorted_ints(&got), n);
    // The leases (prefetched ones included) are disjoint and cover the range: none was handed
    // out twice, and none was lost in a run without failures.
    let mut ranges: Vec<(u64, u64)> = leases
        .lock()
        .unwrap()
        .iter()
        .filter(|l| !l.end_of_splits)
        .map(|l| (l.start, l.end))
        .collect();
    ranges.sort_unstable();
    let mut next = 0;
    for (start, end) in &ranges {
        assert_eq!(*start, next, "leases {ranges:?}");
        next = *end;
    }
    assert_eq!(next, n as u64);
    a.shutdown().await;
    b.shutdown().await;
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_tensors_arrive_intact_next_to_small_ones() -> anyhow::Result<()> {
    use sluice_element::{Element, Tensor};
    let cluster = sluice_tests::start_cluster(1, 1).await?;
    // Rows of 100,000 float32s in (index, row) tuples: tuples are sent whole.
    let rows: Vec<f32> = (0..3 * 100_000).map(|i| i as f32).collect();
    let dataset = Dataset::from_slices(Tensor::from_f32s(vec![3, 100_000], &rows)?).enumerate();
    let options = DistributeOptions {
        compression: sluice_client::Compression::None,
        ..DistributeOptions::default()
    };
    let service = cluster
        .client()
        .distribute(&dataset, ShardingPolicy::Off, options)
        .await?;
    let got = read_epoch(&service, EPOCH).await?;
    assert_eq!(got.len(), 3);
    for (i, element) in got.iter().enumerate() {
        let Element::Tuple(parts) = element else {
            panic!("a tuple: {}", element.to_json())
        };
        assert_eq!(parts[0].as_i64(), Some(i as i64));
        let Element::Tensor(row) = &parts[1] else {
            panic!("a tensor")
        };
        assert_eq!(row.shape(), [100_000]);
        let want: Vec<f32> = rows[i * 100_000..(i + 1) * 100_000].to_vec();
        assert_eq!(row.to_values::<f32>(), Some(want));
    }
    // A large tensor alone travels as a header and its data.
    let alone = Dataset::from_slices(Tensor::from_f32s(vec![3, 100_000], &rows)?);
    let options = DistributeOptions {
        compression: sluice_client::Compression::None,
        ..DistributeOptions::default()
    };
    let service = cluster
        .client()
        .distribute(&alone, ShardingPolicy::Off, options)
        .await?;
    let got = read_epoch(&service, EPOCH).await?;
    let values: Vec<f32> = got
        .iter()
        .flat_map(|e| match e {
            Element::Tensor(t) => t.to_values::<f32>().expect("float32"),
            other => panic!("a tensor: {}", other.to_json()),
        })
        .collect();
    assert_eq!(values, rows);
    cluster.shutdown().await;
    Ok(())
}
