//! The cross-trainer cache (tf.data's `cross_trainer_cache_test.py` and
//! `cross_trainer_cache_ft_test.py`): trainers reading one named job share its elements, each
//! trainer id with its own cursor into a sliding window per task. Every test runs on a
//! three-replica quorum and reads `range(N).repeat()`.

use sluice_client::DispatcherClientExt;
use sluice_client::{CrossTrainerCache, DistributeOptions, ShardingPolicy};
use sluice_pipeline::{Dataset, Transform};
use sluice_tests::TestCluster;
use std::collections::HashSet;
use std::time::Duration;
use tracing::info;

/// An infinite dataset whose values do not wrap around within a test.
fn infinite() -> Dataset {
    Dataset::range(10_000_000).repeat_forever()
}

fn trainer(job: &str, trainer_id: &str) -> DistributeOptions {
    DistributeOptions {
        job_name: Some(job.into()),
        cross_trainer_cache: Some(CrossTrainerCache::new(trainer_id)),
        ..DistributeOptions::default()
    }
}

/// Reads the first `k` elements of a new epoch of `infinite()` as trainer `trainer_id`.
async fn first_elements(
    cluster: &TestCluster,
    mode: ShardingPolicy,
    options: DistributeOptions,
    k: usize,
) -> anyhow::Result<Vec<i64>> {
    let service = cluster
        .client()
        .distribute(&infinite(), mode, options)
        .await?;
    let mut epoch = service.iter().await?;
    let got = tokio::time::timeout(Duration::from_secs(60), crate::read_ints(&mut epoch, k));
    got.await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trainers_share_one_sequence_and_a_trainer_id_shares_one_cursor() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 1).await?;

    info!("--- two trainers read the same elements (tf.data's testEnableCrossTrainerCache)");
    let first = first_elements(
        &cluster,
        ShardingPolicy::Off,
        trainer("job", "Trainer 1"),
        50,
    );
    assert_eq!(first.await?, (0..50).collect::<Vec<_>>());
    let second = first_elements(
        &cluster,
        ShardingPolicy::Off,
        trainer("job", "Trainer 2"),
        50,
    );
    assert_eq!(second.await?, (0..50).collect::<Vec<_>>());

    info!("--- two readers with one trainer id split its sequence (testSameTrainerID)");
    let reader = |max_outstanding| DistributeOptions {
        max_outstanding_requests: Some(max_outstanding),
        ..trainer("shared-cursor", "Trainer 3")
    };
    let client = cluster.client();
    let a = client
        .distribute(&infinite(), ShardingPolicy::Off, reader(2))
        .await?;
    let b = client
        .distribute(&infinite(), ShardingPolicy::Off, reader(3))
        .await?;
    let (mut a, mut b) = (a.iter().await?, b.iter().await?);
    let mut got = Vec::new();
    for _ in 0..10 {
        got.extend(crate::read_ints(&mut a, 20).await?);
        got.extend(crate::read_ints(&mut b, 20).await?);
    }
    let distinct: HashSet<i64> = got.iter().copied().collect();
    assert_eq!(distinct.len(), got.len(), "an element reached both readers");
    // Only the few elements the readers requested ahead and never took are skipped.
    assert!(got.iter().all(|v| *v < 420), "{got:?}");

    info!("--- another job name is another cache (testDifferentJobNames)");
    let other = first_elements(
        &cluster,
        ShardingPolicy::Off,
        trainer("job2", "Trainer 1"),
        10,
    );
    assert_eq!(other.await?, (0..10).collect::<Vec<_>>());
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trainers_of_a_distributed_epoch_share_each_workers_window() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 2).await?;
    let options = |id| DistributeOptions {
        max_outstanding_requests: Some(8),
        ..trainer("dynamic", id)
    };
    let first = first_elements(&cluster, ShardingPolicy::Dynamic, options("Trainer 1"), 100);
    let first = first.await?;
    let second = first_elements(&cluster, ShardingPolicy::Dynamic, options("Trainer 2"), 100);
    let second = second.await?;
    for got in [&first, &second] {
        let distinct: HashSet<i64> = got.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            got.len(),
            "a split was produced twice: {got:?}"
        );
    }
    // Trainer 2 starts at the front of both windows, which trainer 1 read first (how much of
    // each depends on which worker answered first, so tf.data's testDynamicSharding only asks
    // for a common element).
    let first: HashSet<i64> = first.into_iter().collect();
    assert!(
        second.iter().any(|v| first.contains(v)),
        "the trainers shared no element: {second:?}"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_trainer_skips_what_the_window_evicted() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 0).await?;
    cluster
        .add_worker_with(|config| config.cross_trainer_cache_size_bytes = Some(500))
        .await?;
    let fast = first_elements(
        &cluster,
        ShardingPolicy::Off,
        trainer("job", "Trainer 1"),
        200,
    );
    assert_eq!(fast.await?, (0..200).collect::<Vec<_>>());
    // The window holds a few dozen elements past what trainer 1 requested: trainer 2 starts
    // there and still reads 200 elements, since the input is infinite (testSlowClientSkipsData).
    let slow = first_elements(
        &cluster,
        ShardingPolicy::Off,
        trainer("job", "Trainer 2"),
        200,
    );
    let slow = slow.await?;
    assert!(slow[0] > 0, "trainer 2 read evicted elements: {slow:?}");
    let expected: Vec<i64> = (slow[0]..slow[0] + 200).collect();
    assert_eq!(slow, expected);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_misuse_gets_tf_data_errors() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 1).await?;
    let client = cluster.client();

    info!("--- a job's cache setting is part of its identity (testNamedJobMismatch)");
    let cached = first_elements(
        &cluster,
        ShardingPolicy::Off,
        trainer("job", "Trainer 1"),
        10,
    );
    assert_eq!(cached.await?, (0..10).collect::<Vec<_>>());
    let plain = DistributeOptions {
        job_name: Some("job".into()),
        ..DistributeOptions::default()
    };
    let service = client
        .distribute(&infinite(), ShardingPolicy::Off, plain)
        .await?;
    let message = crate::invalid_argument(service.iter().await);
    assert!(
        message.contains("Existing cross-trainer cache: <enabled>; got <disabled>"),
        "{message}"
    );

    info!("--- the checks of an iterator's creation");
    cluster.wait_caught_up(1, Duration::from_secs(20)).await?;
    let jobs_before = cluster.state_of(1).expect("running").jobs().count();
    let anonymous = DistributeOptions {
        job_name: None,
        ..trainer("unused", "Trainer 1")
    };
    let service = client
        .distribute(&infinite(), ShardingPolicy::Off, anonymous)
        .await?;
    assert_eq!(
        crate::invalid_argument(service.iter().await),
        "Cross-trainer caching requires named jobs. Got empty `job_name`."
    );
    let finite = client
        .distribute(
            &Dataset::range(10).map("square"),
            ShardingPolicy::Off,
            trainer("finite", "T"),
        )
        .await?;
    assert_eq!(
        crate::invalid_argument(finite.iter().await),
        "Cross-trainer caching requires the input dataset to be infinite. Got input with \
         cardinality 10"
    );
    let coordinated = DistributeOptions {
        consumer_index: Some(0),
        num_consumers: Some(2),
        ..trainer("coordinated", "T")
    };
    let coordinated = client
        .distribute(&infinite(), ShardingPolicy::Off, coordinated)
        .await?;
    assert_eq!(
        crate::invalid_argument(coordinated.iter().await),
        "Cross-trainer caching does not support coordinated reads. Got number of coordinated \
         consumers: 2"
    );
    cluster.wait_caught_up(1, Duration::from_secs(20)).await?;
    let jobs_after = cluster.state_of(1).expect("running").jobs().count();
    assert_eq!(jobs_before, jobs_after, "a refused iterator created a job");

    let empty = client
        .distribute(&infinite(), ShardingPolicy::Off, trainer("job", ""))
        .await;
    assert_eq!(
        crate::invalid_argument(empty),
        "tf.data service cross-trainer cache requires a non-empty trainer ID."
    );

    info!("--- one dataset object: two epochs pass, the third is refused (tf.data's check is `repetition > 1`)");
    let service = client
        .distribute(&infinite(), ShardingPolicy::Off, trainer("epochs", "T"))
        .await?;
    for _ in 0..2 {
        let mut epoch = service.iter().await?;
        crate::read_ints(&mut epoch, 5).await?;
    }
    assert_eq!(
        crate::invalid_argument(service.iter().await),
        "Cross-trainer caching requires infinite datasets and disallows multiple repetitions of \
         the same dataset. Got repetition 2"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_restarts_its_cache_from_the_beginning() -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    // A generous worker timeout: the restart must not look like the loss of the worker, whose
    // unfinished task would then be dropped.
    let mut cluster = TestCluster::start_with(3, 0, |config| {
        config.worker_timeout = Duration::from_secs(30);
    })
    .await?;
    cluster.add_worker().await?;
    let service = cluster
        .client()
        .distribute(
            &infinite(),
            ShardingPolicy::Off,
            trainer("job", "Trainer 1"),
        )
        .await?;
    let mut epoch = service.iter().await?;
    assert_eq!(
        crate::read_ints(&mut epoch, 100).await?,
        (0..100).collect::<Vec<_>>()
    );

    info!("--- restarting the worker (testWorkerRestart)");
    cluster.kill_worker(0).await?;
    cluster.restart_worker(0).await?;
    // What the client requested before the restart comes first, then the new task's start.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no element of the restarted task"
        );
        let next = tokio::time::timeout_at(deadline, crate::read_ints(&mut epoch, 1)).await??;
        if next == [0] {
            break;
        }
    }
    assert_eq!(
        crate::read_ints(&mut epoch, 100).await?,
        (1..101).collect::<Vec<_>>()
    );
    cluster.shutdown().await;
    Ok(())
}
