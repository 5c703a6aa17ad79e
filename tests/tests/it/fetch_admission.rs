//! Only readers the dispatcher admitted to an iteration read its tasks: another caller, with a
//! valid client credential (or, on a cluster without authentication, anyone), that opens a
//! fetch stream or a coordinated read for a job's task (its id taken from the status RPC) is
//! refused with `PermissionDenied` on both transports, whatever admission it presents (none,
//! its own to another iteration, the job reader's client id with a forged one); and the job's
//! reader still reads every element exactly once.

use crate::{assert_exactly_once, read_ints, sorted_ints};
use sluice_client::{DispatcherClientExt, DistributeOptions, RegisterOptions, ShardingPolicy};
use sluice_element::Element;
use sluice_pipeline::Dataset;
use sluice_proto::worker::worker_client::WorkerClient;
use sluice_proto::worker::{FetchRequest, GetElementRequest};
use sluice_rpc::{raw_fetch, DispatcherClient, JobRequest};
use sluice_security::{ClientSecurity, FetchKey, ServerRole};
use sluice_tests::TestCluster;
use sluice_types::{DatasetId, TargetWorkers};
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status};
use tracing::info;

const DEADLINE: Duration = Duration::from_secs(30);
const N: i64 = 5000;

/// The tasks of job iterations (by task id) and the worker holding each, as the status RPC
/// shows them to any reader.
fn tasks_in_status(status: &str) -> anyhow::Result<Vec<(u64, String)>> {
    let status: serde_json::Value = serde_json::from_str(status)?;
    let mut tasks = Vec::new();
    for worker in status["workers"].as_array().into_iter().flatten() {
        let address = worker["address"].as_str().unwrap_or_default().to_string();
        for task in worker["active_tasks"].as_array().into_iter().flatten() {
            tasks.push((task.as_u64().unwrap_or_default(), address.clone()));
        }
    }
    Ok(tasks)
}

/// Opens a raw fetch stream with `first`, presenting `security`: its first answer.
async fn raw_answer(
    security: &ClientSecurity,
    address: &str,
    first: FetchRequest,
) -> anyhow::Result<Result<usize, Status>> {
    let socket = raw_fetch::connect(address, security).await?;
    let token = security.token().map(|t| t.expose().as_bytes());
    let (_requests, mut batches) = raw_fetch::open(socket, token, first, 1 << 16).await?;
    let answer = tokio::time::timeout(DEADLINE, batches.message()).await?;
    Ok(answer.map(|batch| batch.map_or(0, |b| b.lengths.len().max(b.each_length as usize))))
}

/// Opens a gRPC `Fetch` with `first`, presenting `security`: whether it was served.
async fn grpc_answer(
    security: &ClientSecurity,
    address: &str,
    first: FetchRequest,
) -> anyhow::Result<Result<(), Status>> {
    let mut worker = grpc_worker(security, address).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(first).await?;
    let answer = tokio::time::timeout(DEADLINE, worker.fetch(ReceiverStream::new(rx))).await?;
    Ok(answer.map(|_| ()))
}

async fn grpc_worker(
    security: &ClientSecurity,
    address: &str,
) -> anyhow::Result<WorkerClient<sluice_security::AuthChannel>> {
    let endpoint = security.endpoint(address)?;
    let channel = security.connect(&endpoint, ServerRole::Worker).await?;
    Ok(WorkerClient::new(security.authed(channel)))
}

/// An admission of the attacker's own: its client's, to an iteration of a job of its own.
async fn own_admission(attacker: &DispatcherClient) -> anyhow::Result<(u64, Vec<u8>)> {
    let dataset_id = attacker
        .register_dataset(&Dataset::range(3), &RegisterOptions::default())
        .await?;
    let job = attacker
        .get_or_create_job(&JobRequest {
            dataset_id: DatasetId(dataset_id),
            sharding: ShardingPolicy::Off,
            job_name: Some("the attacker's".into()),
            num_consumers: None,
            use_cross_trainer_cache: false,
            target_workers: TargetWorkers::Auto,
            delivery: sluice_types::Delivery::AtMostOnce,
        })
        .await?;
    let iteration = attacker.get_or_create_iteration(job, 0).await?;
    Ok((iteration.client_id.0, iteration.admission.to_bytes()))
}

fn assert_refused(status: &Status, what: &str) {
    assert_eq!(status.code(), Code::PermissionDenied, "{what}: {status:?}");
    assert!(
        status
            .message()
            .contains("only readers the dispatcher admitted"),
        "{what}: {}",
        status.message()
    );
}

/// Reads the epoch's rest, to its end.
async fn read_rest(epoch: &mut sluice_client::ElementStream) -> anyhow::Result<Vec<Element>> {
    let mut rest = Vec::new();
    tokio::time::timeout(DEADLINE, async {
        while let Some(element) = epoch.next().await {
            rest.push(element?);
        }
        anyhow::Ok(())
    })
    .await??;
    Ok(rest)
}

/// A job's reader reads part of its epoch; `attacker` (with `security`) finds the job's task in
/// the status and tries to read it every way it can; the reader then reads the rest.
async fn a_reader_keeps_its_elements(
    cluster: &TestCluster,
    attacker: &DispatcherClient,
    security: &ClientSecurity,
) -> anyhow::Result<()> {
    let reader = cluster.client();
    let service = reader
        .distribute(
            &Dataset::range(N),
            ShardingPolicy::Off,
            DistributeOptions {
                job_name: Some("victim".into()),
                ..DistributeOptions::default()
            },
        )
        .await?;
    let mut epoch = service.iter().await?;
    let mut got = tokio::time::timeout(DEADLINE, read_ints(&mut epoch, 100)).await??;

    info!("--- the attacker finds the job's task in the status");
    let tasks = tasks_in_status(&attacker.get_status().await?)?;
    anyhow::ensure!(tasks.len() == 1, "one task is running: {tasks:?}");
    let (task_id, address) = tasks[0].clone();
    let leader = cluster.wait_for_leader(DEADLINE).await?;
    let state = cluster.state_of(leader).expect("the leader's state");
    let (victim, iteration) = state
        .active_clients()
        .map(|(client, iteration)| (client.0, iteration.id.0))
        .next()
        .expect("the reader is a client of the iteration");
    let (own_client, own_admission) = own_admission(attacker).await?;
    // The right shape, signed with a key of the attacker's own.
    let forged = FetchKey::random().admit(iteration, victim).to_bytes();

    let attempts: Vec<(&str, u64, Vec<u8>)> = vec![
        ("no admission, its own client id", own_client, vec![]),
        ("no admission, the reader's client id", victim, vec![]),
        (
            "its own admission to another iteration",
            own_client,
            own_admission.clone(),
        ),
        (
            "its own admission, under the reader's client id",
            victim,
            own_admission,
        ),
        ("a forged admission of the reader", victim, forged),
    ];
    for (what, client_id, admission) in attempts {
        info!(
            what,
            "--- a fetch stream of the job's task, both transports"
        );
        let first = FetchRequest {
            task_id,
            credits: 1 << 16,
            client_id,
            admission: admission.clone(),
            acknowledges: true,
            window: 1 << 16,
            ..FetchRequest::default()
        };
        let raw = raw_answer(security, &address, first.clone()).await?;
        assert_refused(&raw.expect_err(what), what);
        let grpc = grpc_answer(security, &address, first).await?;
        assert_refused(&grpc.expect_err(what), what);
    }
    info!("--- a coordinated read of the task");
    let mut worker = grpc_worker(security, &address).await?;
    let refused = worker
        .get_element(GetElementRequest {
            task_id,
            client_id: victim,
            ..GetElementRequest::default()
        })
        .await
        .expect_err("refused");
    assert_refused(&refused, "GetElement without an admission");

    info!("--- the job's reader reads the rest: every element, once");
    let rest = read_rest(&mut epoch).await?;
    got.extend(sorted_ints(&rest));
    got.sort_unstable();
    assert_exactly_once(&got, N);
    assert_eq!(got.len() as i64, N);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_client_with_a_valid_token_reads_nothing_of_a_jobs_task() -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    let cluster = TestCluster::start_secure(1, 1).await?;
    let security = cluster
        .credentials()
        .expect("a secure cluster has credentials")
        .client()?;
    // Another process of a trainer's, with the same client token.
    let attacker = cluster.client();
    a_reader_keeps_its_elements(&cluster, &attacker, &security).await?;
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_authentication_any_caller_reads_nothing_of_a_jobs_task() -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    let cluster = TestCluster::start(1, 1).await?;
    let attacker = cluster.client();
    a_reader_keeps_its_elements(&cluster, &attacker, &ClientSecurity::default()).await?;
    cluster.shutdown().await;
    Ok(())
}

/// The fetch key replica `id` applied, if any.
fn key_on(cluster: &TestCluster, id: u64) -> Option<FetchKey> {
    cluster.state_of(id).and_then(|s| s.fetch_key().cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_its_first_fetch_key_through_a_change_of_leader() -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    let mut cluster = TestCluster::start(3, 0).await?;
    let leader = cluster.wait_for_leader(DEADLINE).await?;

    info!("--- the leader sets a key with nobody asking, and every replica applies it");
    sluice_tests::wait_until("every replica has the fetch key", DEADLINE, || {
        let done = (1..=3).all(|id| key_on(&cluster, id).is_some());
        async move { done }
    })
    .await?;
    let key = key_on(&cluster, leader).expect("waited for it");
    for id in 1..=3 {
        assert!(key_on(&cluster, id) == Some(key.clone()), "replica {id}");
    }

    info!("--- a new leader keeps it: admissions it signs are under the same key");
    cluster.kill(leader).await?;
    let next = cluster.wait_for_leader(DEADLINE).await?;
    assert_ne!(next, leader);
    let client = cluster.client();
    let (client_id, admission) = own_admission(&client).await?;
    let iteration = cluster
        .state_of(next)
        .and_then(|s| {
            s.client_iteration(sluice_types::ClientId(client_id))
                .map(|it| it.id.0)
        })
        .expect("the client's iteration");
    assert_eq!(admission, key.admit(iteration, client_id).to_bytes());
    assert!(key_on(&cluster, next) == Some(key), "the key never changes");
    cluster.shutdown().await;
    Ok(())
}
