//! Target workers, worker tags and local workers (tf.data's
//! `local_workers_test.py`). Every worker of a test runs in the test process; the ones started
//! with `local: false` are not in the process's local-worker registry, so the client treats
//! them exactly as workers on another host.

use sluice_client::DispatcherClientExt;
use sluice_client::{ClientError, DistributeOptions, ShardingPolicy, TargetWorkers};
use sluice_pipeline::{Dataset, Transform};
use sluice_tests::TestCluster;
use sluice_types::TaskId;
use sluice_worker::{LeaseEvent, LeaseObserver};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::info;

fn targeting(target_workers: TargetWorkers) -> DistributeOptions {
    DistributeOptions {
        target_workers,
        ..DistributeOptions::default()
    }
}

/// One epoch of `range(10)` in parallel_epochs mode, sorted.
async fn read_range(cluster: &TestCluster, options: DistributeOptions) -> anyhow::Result<Vec<i64>> {
    let service = cluster
        .client()
        .distribute(&Dataset::range(10), ShardingPolicy::Off, options)
        .await?;
    let elements = crate::read_epoch(&service, Duration::from_secs(60)).await?;
    Ok(crate::sorted_ints(&elements))
}

/// `copies` copies of `0..10`, sorted.
fn copies_of_range(copies: usize) -> Vec<i64> {
    let mut out: Vec<i64> = (0..10).flat_map(|v| vec![v; copies]).collect();
    out.sort_unstable();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_skips_other_hosts_colocated_workers_and_any_reads_every_worker() -> anyhow::Result<()>
{
    let mut cluster = sluice_tests::start_cluster(3, 0).await?;
    // Splits each worker leased: a task's pipeline leases only once a reader reads it.
    let leases: [Arc<Mutex<Vec<LeaseEvent>>>; 2] = Default::default();
    let observer = |i: usize| {
        let seen = leases[i].clone();
        LeaseObserver(Arc::new(move |lease| {
            seen.lock().expect("leases lock").push(lease)
        }))
    };
    let local_observer = observer(0);
    cluster
        .add_worker_with(|config| config.lease_observer = Some(local_observer))
        .await?;
    let colocated_observer = observer(1);
    cluster
        .add_worker_with(|config| {
            config.local = false;
            config.tags = vec!["COLOCATED".into()];
            config.lease_observer = Some(colocated_observer);
        })
        .await?;

    info!("--- AUTO reads the local worker only, and ends without the other task");
    assert_eq!(
        read_range(&cluster, targeting(TargetWorkers::Auto)).await?,
        copies_of_range(1)
    );
    // Which worker served shows in distributed_epoch mode, where reading a task leases splits.
    let service = cluster
        .client()
        .distribute(
            &Dataset::range(10),
            ShardingPolicy::Dynamic,
            targeting(TargetWorkers::Auto),
        )
        .await?;
    let elements = crate::read_epoch(&service, Duration::from_secs(60)).await?;
    assert_eq!(crate::sorted_ints(&elements), copies_of_range(1));
    let leased = |i: usize| leases[i].lock().expect("leases lock").len();
    assert!(leased(0) > 0, "the local worker served the epoch");
    assert_eq!(
        leased(1),
        0,
        "the other host's colocated worker was not read"
    );
    info!("--- ANY reads both workers");
    assert_eq!(
        read_range(&cluster, targeting(TargetWorkers::Any)).await?,
        copies_of_range(2)
    );
    info!("--- LOCAL reads the worker in this process");
    assert_eq!(
        read_range(&cluster, targeting(TargetWorkers::Local)).await?,
        copies_of_range(1)
    );

    info!("--- target workers are part of a job's identity (testInconsistentTargetWorkers)");
    let named = |target_workers| DistributeOptions {
        job_name: Some("test_job".into()),
        ..targeting(target_workers)
    };
    assert_eq!(
        read_range(&cluster, named(TargetWorkers::Auto)).await?,
        copies_of_range(1)
    );
    let service = cluster
        .client()
        .distribute(
            &Dataset::range(10),
            ShardingPolicy::Off,
            named(TargetWorkers::Local),
        )
        .await?;
    let message = crate::invalid_argument(service.iter().await);
    assert!(
        message.contains(
            "but found an existing job with different parameters: Existing target workers: \
             <AUTO>; got <LOCAL>"
        ),
        "{message}"
    );

    info!("--- local reads cannot be coordinated (testCoordinatedRead)");
    let coordinated = DistributeOptions {
        job_name: Some("coordinated".into()),
        consumer_index: Some(0),
        num_consumers: Some(3),
        ..targeting(TargetWorkers::Local)
    };
    let service = cluster
        .client()
        .distribute(
            &Dataset::range(10).repeat_forever(),
            ShardingPolicy::Off,
            coordinated,
        )
        .await?;
    assert_eq!(
        crate::invalid_argument(service.iter().await),
        "Coordinated reads require non-local workers, but `target_workers` is \"LOCAL\"."
    );

    assert_eq!(
        "remote".parse::<TargetWorkers>().unwrap_err().to_string(),
        "Unrecognized target workers: remote"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_reads_need_a_worker_in_this_process() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 0).await?;
    cluster
        .add_worker_with(|config| config.local = false)
        .await?;
    let client = cluster.client();

    let local = client
        .distribute(
            &Dataset::range(10),
            ShardingPolicy::Off,
            targeting(TargetWorkers::Local),
        )
        .await?;
    assert_eq!(
        crate::invalid_argument(local.iter().await),
        "Local reads require local tf.data workers, but no local worker is found. You need to \
         run local tf.data service workers in your training workers."
    );
    let file = client
        .distribute(
            &Dataset::range(10),
            ShardingPolicy::File,
            targeting(TargetWorkers::Local),
        )
        .await?;
    assert_eq!(
        crate::invalid_argument(file.iter().await),
        "Static sharding policy <FILE> requires local tf.data workers, but no local worker is \
         found. You need to run local tf.data service workers in your training workers. Static \
         sharding also requires a fixed worker pool and a list of worker addresses in the \
         DispatcherConfig. See the \"Processing Modes\" section in the module doc for details."
    );

    info!("--- the remote worker does serve other targets (testNonLocalRead)");
    assert_eq!(
        read_range(&cluster, targeting(TargetWorkers::Auto)).await?,
        copies_of_range(1)
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_readers_task_is_deleted_when_it_goes_away() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 0).await?;
    let local = cluster.add_worker().await?;
    // A remote worker's task is never read with LOCAL, so the iteration never finishes, as in tf.data:
    // a later reader of it reaches the deleted local task instead of an ended iteration.
    cluster
        .add_worker_with(|config| config.local = false)
        .await?;
    let shared = || DistributeOptions {
        job_name: Some("shared_job_name".into()),
        ..targeting(TargetWorkers::Local)
    };
    let infinite = Dataset::range(1_000_000).repeat_forever();
    let client = cluster.client();
    let service = client
        .distribute(&infinite, ShardingPolicy::Off, shared())
        .await?;
    let mut epoch = service.iter().await?;
    assert_eq!(
        crate::read_ints(&mut epoch, 10).await?,
        (0..10).collect::<Vec<_>>()
    );
    let task_id = cluster.worker(local).expect("running").task_ids()[0];

    info!("--- the reader goes away: its local task is deleted and reported finished");
    drop(epoch);
    sluice_tests::wait_until("the local task's deletion", Duration::from_secs(20), || {
        let held = cluster.worker(local).expect("running").task_ids();
        // A replica applies only committed entries: one is enough.
        let finished = (1..=3).any(|id| {
            cluster
                .state_of(id)
                .and_then(|s| s.task(TaskId(task_id)).map(|t| t.finished))
                .unwrap_or(false)
        });
        async move { !held.contains(&task_id) && finished }
    })
    .await?;

    info!("--- a new dataset object reads the same iteration (testReadFromDeletedTask)");
    let again = client
        .distribute(&infinite, ShardingPolicy::Off, shared())
        .await?;
    let mut epoch = again.iter().await?;
    let error = tokio::time::timeout(Duration::from_secs(30), epoch.next())
        .await?
        .expect("an error, not the end of the epoch")
        .unwrap_err();
    let address = cluster.worker_addr(local).to_string();
    match &error {
        ClientError::Worker {
            address: a,
            message,
            code,
        } => {
            assert_eq!(*code, tonic::Code::FailedPrecondition);
            assert_eq!(a, &address);
            assert_eq!(
                message,
                &format!(
                    "Got request for local task {task_id} of worker {address}, which has been \
                     deleted. You may be creating a duplicate iteration which has already \
                     finished. To fix this, make sure to create your dataset only once, as \
                     opposed to re-creating it repeatedly inside a loop."
                )
            );
        }
        other => panic!("expected a worker error, got {other:?}"),
    }

    info!("--- the first dataset object's next epoch is a new iteration (testMultipleEpochs)");
    let mut epoch = service.iter().await?;
    assert_eq!(
        crate::read_ints(&mut epoch, 10).await?,
        (0..10).collect::<Vec<_>>()
    );
    drop(epoch);
    cluster.shutdown().await;
    Ok(())
}
