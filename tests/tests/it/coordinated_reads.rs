//! Coordinated reads (`consumer_index` + `num_consumers` + `job_name`): consumers in lockstep
//! rounds, workers joining through pending tasks, workers lost, and the round errors.

use crate::read_ints;
use sluice_client::DispatcherClientExt;
use sluice_client::{ClientError, DistributeOptions, ElementStream, ShardingPolicy};
use sluice_pipeline::{Dataset, Transform};
use sluice_tests::TestCluster;
use std::time::Duration;
use tracing::info;

fn consumer(job: &str, index: u32, num_consumers: u32) -> DistributeOptions {
    DistributeOptions {
        job_name: Some(job.into()),
        consumer_index: Some(index),
        num_consumers: Some(num_consumers),
        ..DistributeOptions::default()
    }
}

async fn open(
    cluster: &TestCluster,
    dataset: &Dataset,
    options: DistributeOptions,
) -> Result<ElementStream, ClientError> {
    let service = cluster
        .client()
        .distribute(dataset, ShardingPolicy::Off, options)
        .await?;
    service.iter().await
}

/// Reads `steps` elements from each of `num_consumers` consumers of `job`, concurrently.
async fn read_consumers(
    cluster: &TestCluster,
    dataset: &Dataset,
    job: &str,
    num_consumers: u32,
    steps: usize,
) -> anyhow::Result<Vec<Vec<i64>>> {
    let mut readers = Vec::new();
    for c in 0..num_consumers {
        let mut epoch = open(cluster, dataset, consumer(job, c, num_consumers)).await?;
        readers.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(30), read_ints(&mut epoch, steps)).await?
        }));
    }
    let mut out = Vec::new();
    for reader in readers {
        out.push(reader.await??);
    }
    Ok(out)
}

/// Reads `steps` elements from each epoch, concurrently.
async fn read_all(epochs: &mut [ElementStream], steps: usize) -> anyhow::Result<Vec<Vec<i64>>> {
    let reads = epochs.iter_mut().map(|epoch| read_ints(epoch, steps));
    futures::future::join_all(reads).await.into_iter().collect()
}

/// Every step of every consumer comes from the same round of the same worker: the consumers'
/// elements at a step are consecutive elements of one worker's stream, in consumer order.
fn assert_lockstep(consumers: &[Vec<i64>]) {
    let n = consumers.len() as i64;
    for step in 0..consumers[0].len() {
        let first = consumers[0][step];
        let round: Vec<i64> = consumers.iter().map(|c| c[step]).collect();
        let want: Vec<i64> = (0..n).map(|c| first + c).collect();
        assert_eq!(round, want, "step {step}: consumers read different rounds");
        assert_eq!(
            first % n,
            0,
            "step {step}: a round starts at a multiple of {n}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_serves_consumers_in_rounds() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 1).await?;
    let dataset = Dataset::range(1_000_000).repeat_forever();
    let got = read_consumers(&cluster, &dataset, "rr1", 3, 50).await?;
    assert_lockstep(&got);
    // One worker: round r is elements 3r, 3r+1, 3r+2 unless a round was skipped.
    assert!(got[0].windows(2).all(|w| w[1] > w[0]), "{:?}", got[0]);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_alternate_within_a_round() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 2).await?;
    let dataset = Dataset::range(1_000_000).repeat_forever();
    let got = read_consumers(&cluster, &dataset, "rr2", 2, 40).await?;
    assert_lockstep(&got);
    // Both workers produce 0, 1, 2, ...: a round reads the same two elements from each worker
    // in turn, so unless a round was skipped every value shows up twice in a row.
    let pairs = got[0]
        .chunks(2)
        .filter(|p| p.len() == 2 && p[0] == p[1])
        .count();
    assert!(
        pairs >= 10,
        "rounds alternate between the workers: {:?}",
        got[0]
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_mid_job_joins_at_a_round_every_consumer_agreed_on() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 1).await?;
    let dataset = Dataset::range(1_000_000_000).repeat_forever();
    let mut epochs = Vec::new();
    for c in 0..2 {
        epochs.push(open(&cluster, &dataset, consumer("grow", c, 2)).await?);
    }
    let mut got: Vec<Vec<i64>> = vec![Vec::new(), Vec::new()];
    for (c, part) in read_all(&mut epochs, 100).await?.into_iter().enumerate() {
        got[c].extend(part);
    }
    info!("--- adding a worker while both consumers read");
    cluster.add_worker().await?;
    // Keep reading until the new worker's stream (which starts again at 0) shows up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let parts =
            tokio::time::timeout(Duration::from_secs(20), read_all(&mut epochs, 20)).await??;
        for (c, part) in parts.into_iter().enumerate() {
            got[c].extend(part);
        }
        let first_worker_at = got[0][99];
        if got[0][100..].iter().any(|v| *v < first_worker_at) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the added worker never joined the rounds"
        );
    }
    assert_lockstep(&got);
    let state = cluster.state_of(cluster.wait_for_leader(Duration::from_secs(5)).await?);
    let state = state.expect("the leader runs");
    let iteration = state.iterations().next().expect("one iteration");
    let tasks = state.tasks_of_iteration(iteration);
    assert_eq!(tasks.len(), 2);
    assert!(iteration.pending_tasks.is_empty());
    assert!(
        tasks[1].starting_round > 0,
        "the new task joined at a later round"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_drop_a_lost_worker_together_and_read_on() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 2).await?;
    let dataset = Dataset::range(1_000_000_000).repeat_forever();
    let mut epochs = Vec::new();
    for c in 0..2 {
        epochs.push(open(&cluster, &dataset, consumer("lose", c, 2)).await?);
    }
    for epoch in epochs.iter_mut() {
        read_ints(epoch, 1).await?;
    }
    info!("--- killing worker 1");
    cluster.kill_worker(1).await?;
    let mut readers = Vec::new();
    for mut epoch in epochs {
        readers.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(30), read_ints(&mut epoch, 200)).await?
        }));
    }
    let mut got = Vec::new();
    for reader in readers {
        got.push(reader.await??);
    }
    // After the removal only worker 0 remains: its rounds give consecutive pairs.
    let tail: Vec<Vec<i64>> = got.iter().map(|c| c[100..].to_vec()).collect();
    assert_lockstep(&tail);
    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await?;
    let state = cluster.state_of(leader).expect("the leader runs");
    let iteration = state.iterations().next().expect("one iteration");
    let tasks: Vec<&str> = state
        .tasks_of_iteration(iteration)
        .iter()
        .map(|t| t.worker.as_str())
        .collect();
    assert_eq!(
        tasks,
        [cluster.worker_addr(0)],
        "every consumer asked to remove the lost worker's task"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_errors_have_tf_data_texts() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 1).await?;
    let infinite = Dataset::range(1_000_000).repeat_forever();

    info!("--- a consumer index past the number of consumers");
    let mut epoch = open(&cluster, &infinite, consumer("bad_index", 3, 2)).await?;
    let error = epoch.next().await.expect("an error").unwrap_err();
    assert!(
        error.to_string().ends_with(
            "Requesting data for consumer index 3, but the task is configured for only 2 consumers"
        ),
        "{error}"
    );

    info!("--- a dataset known to be finite is refused up front");
    let refused = open(&cluster, &Dataset::range(3), consumer("finite", 0, 1))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "Round robin reads require that the input dataset has infinite cardinality, but the \
         dataset has cardinality 3. Consider adding a `.repeat()` transformation to the dataset.",
    );
    assert!(
        matches!(refused, ClientError::FailedPrecondition(_)),
        "{refused:?}"
    );

    info!("--- a finite dataset of unknown cardinality ends a round-robin task");
    let unknown = Dataset::range(3).filter("is_even");
    let mut epoch = open(&cluster, &unknown, consumer("finite", 0, 1)).await?;
    let error = loop {
        match epoch
            .next()
            .await
            .expect("the epoch fails rather than ends")
        {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(
        error.to_string().ends_with(
            "Encountered end of sequence on a round-robin read iterator. Please ensure that the \
             dataset used for round-robin reading has infinite cardinality, e.g. by adding a \
             .repeat() transformation at the end."
        ),
        "{error}"
    );

    info!("--- a consumer restarted under the same job name");
    let mut first = open(&cluster, &infinite, consumer("restarted", 0, 1)).await?;
    read_ints(&mut first, 10).await?;
    drop(first);
    let service = cluster
        .client()
        .distribute(&infinite, ShardingPolicy::Off, consumer("restarted", 0, 1))
        .await?;
    let mut again = service.iter().await?; // a new dataset object: repetition 0 again
    let error = again.next().await.expect("an error").unwrap_err();
    assert!(
        error
            .to_string()
            .contains("but the current round has already reached"),
        "{error}"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_read_options_are_validated() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 0).await?;
    let dataset = Dataset::range(10).repeat_forever();
    let cases = [
        (
            DistributeOptions {
                num_consumers: Some(2),
                consumer_index: Some(0),
                ..DistributeOptions::default()
            },
            "`job_name` must be set when setting `num_consumers`. num_consumers was set to 2.",
        ),
        (
            DistributeOptions {
                job_name: Some("j".into()),
                consumer_index: Some(0),
                ..DistributeOptions::default()
            },
            "Must either set both `consumer_index` and `num_consumers`, or neither.",
        ),
        (
            DistributeOptions {
                job_name: Some("j".into()),
                num_consumers: Some(2),
                ..DistributeOptions::default()
            },
            "Must either set both `consumer_index` and `num_consumers`, or neither.",
        ),
    ];
    for (options, want) in cases {
        let error = cluster
            .client()
            .distribute(&dataset, ShardingPolicy::Off, options)
            .await
            .unwrap_err();
        assert!(
            matches!(error, ClientError::InvalidArgument(_)),
            "{error:?}"
        );
        assert_eq!(error.to_string(), want);
    }

    info!("--- a named job reused with another number of consumers");
    let client = cluster.client();
    let a = client
        .distribute(&dataset, ShardingPolicy::Off, consumer("sized", 0, 2))
        .await?;
    let _epoch = a.iter().await?;
    let b = client
        .distribute(&dataset, ShardingPolicy::Off, consumer("sized", 0, 3))
        .await?;
    let error = b
        .iter()
        .await
        .err()
        .expect("the job exists with 2 consumers");
    assert_eq!(
        error.to_string(),
        "Tried to create job with name sized, but found an existing job with different \
         parameters: Existing number of consumers: <2>; got <3>. "
    );
    cluster.shutdown().await;
    Ok(())
}
