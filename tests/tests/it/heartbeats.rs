//! What a client heartbeat carries: the iteration's task list only when it differs from the one
//! the client holds (a fleet of clients polling every second would otherwise receive every
//! task of its iteration every second), and at once when it changes during a long poll; and how
//! long a poll may wait.

use sluice_client::DispatcherClientExt;
use sluice_rpc::{ClientHeartbeat, DispatcherClient, JobRequest, KnownTasks, WorkerHeartbeat};
use sluice_types::{ClientId, DatasetId, ShardingPolicy};
use std::time::{Duration, Instant};

/// A heartbeat of `client_id`, which holds `known`.
async fn heartbeat(
    client: &DispatcherClient,
    client_id: ClientId,
    known: KnownTasks,
    poll: Duration,
) -> anyhow::Result<Option<Vec<u64>>> {
    let heartbeat = ClientHeartbeat {
        client_id,
        known_tasks: known,
        current_round: None,
        blocked_round: None,
    };
    let reply = client.client_heartbeat(&heartbeat, poll).await?;
    Ok(reply
        .tasks
        .map(|tasks| tasks.iter().map(|t| t.task_id).collect()))
}

/// Registers a simulated worker at `address` (its first heartbeat).
async fn register_worker(client: &DispatcherClient, address: &str) -> anyhow::Result<()> {
    let heartbeat = WorkerHeartbeat {
        worker: address.into(),
        current_tasks: vec![],
        tags: vec![],
        incarnation: 0,
    };
    client.worker_heartbeat(&heartbeat, Duration::ZERO).await?;
    Ok(())
}

/// A new job on a dataset of its own, and the client of its first iteration.
async fn client_of_a_new_job(client: &DispatcherClient) -> anyhow::Result<ClientId> {
    let dataset = client
        .register_dataset(&sluice_pipeline::Dataset::range(100), &Default::default())
        .await?;
    let job = client
        .get_or_create_job(&JobRequest {
            dataset_id: DatasetId(dataset),
            sharding: ShardingPolicy::Off,
            job_name: None,
            num_consumers: None,
            use_cross_trainer_cache: false,
            target_workers: Default::default(),
            // Simulated workers number no elements: tf.data's delivery.
            delivery: sluice_types::Delivery::AtMostOnce,
        })
        .await?;
    Ok(client.get_or_create_iteration(job, 0).await?.client_id)
}

fn known(ids: &[u64]) -> KnownTasks {
    KnownTasks {
        count: ids.len() as u32,
        last: ids.last().copied(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_heartbeat_lists_the_tasks_only_when_they_changed() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 0).await?;
    let client = cluster.client();
    let id = client_of_a_new_job(&client).await?;

    // No worker yet: a client that knows no task holds the current list.
    assert_eq!(
        heartbeat(&client, id, known(&[]), Duration::ZERO).await?,
        None
    );

    // A worker joins during a long poll: the poll ends early, with the new list. (Early: well
    // before the poll's 60 s, by a bound only a poll that missed the change crosses.)
    let poll = Duration::from_secs(60);
    let waiting = tokio::spawn({
        let client = client.clone();
        async move {
            let started = Instant::now();
            let reply = heartbeat(&client, id, known(&[]), poll).await;
            (reply, started.elapsed())
        }
    });
    register_worker(&client, "127.0.0.1:9").await?;
    let (reply, waited) = waiting.await?;
    let first = reply?.expect("a new task is a new list");
    assert_eq!(first.len(), 1);
    assert!(
        waited < sluice_tests::HANG,
        "the poll waited {waited:?} after the change"
    );

    // The list held is current: no list.
    assert_eq!(
        heartbeat(&client, id, known(&first), Duration::ZERO).await?,
        None
    );
    // A stale list of the same length is not current.
    let stale = KnownTasks {
        count: 1,
        last: Some(first[0] + 1000),
    };
    assert_eq!(
        heartbeat(&client, id, stale, Duration::ZERO).await?,
        Some(first.clone())
    );

    // A second worker: the client holding one task gets both, in the dispatcher's order.
    register_worker(&client, "127.0.0.1:10").await?;
    let both = heartbeat(&client, id, known(&first), Duration::ZERO)
        .await?
        .expect("the list changed");
    assert_eq!(both.len(), 2);
    assert_eq!(both[0], first[0]);
    assert_eq!(
        heartbeat(&client, id, known(&both), Duration::ZERO).await?,
        None
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_poll_lasts_at_most_half_the_client_timeout_so_a_polling_client_stays(
) -> anyhow::Result<()> {
    const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);
    sluice_tests::init_tracing();
    let cluster = sluice_tests::LocalCluster::start_with(1, 0, |config| {
        config.client_timeout = CLIENT_TIMEOUT;
    })
    .await?;
    let client = cluster.client();
    let id = client_of_a_new_job(&client).await?;

    // Polls of 60 s, for three client timeouts: each ends after half the timeout (under
    // `HANG`: only a poll that was not cut short crosses it), and the client, seen at every
    // poll, is never released (its heartbeat would fail, not found).
    let started = Instant::now();
    while started.elapsed() < 3 * CLIENT_TIMEOUT {
        let polled = Instant::now();
        assert_eq!(
            heartbeat(&client, id, known(&[]), Duration::from_secs(60)).await?,
            None
        );
        assert!(
            polled.elapsed() < sluice_tests::HANG,
            "a poll of {:?} with a client timeout of {CLIENT_TIMEOUT:?}",
            polled.elapsed()
        );
    }
    cluster.shutdown().await;
    Ok(())
}
