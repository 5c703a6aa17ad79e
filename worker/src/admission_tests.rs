//! Readers' admissions on a worker's port: a reader holding a valid client credential but not
//! the dispatcher's admission of its client id to the task's iteration is refused with
//! `PermissionDenied`, on both transports and for coordinated reads, before anything is taken
//! from the task, so the admitted reader still gets every element; a worker that has not heard
//! the fetch key yet answers `Unavailable`.

use super::tests::{
    decode, ints, read_grpc_with, read_raw_with, request, start, start_keyed, task, test_key,
    Worker, DEADLINE,
};
use sluice_pipeline::{Dataset, Transform};
use sluice_proto::worker::worker_client::WorkerClient;
use sluice_proto::worker::{FetchRequest, GetElementRequest};
use sluice_rpc::raw_fetch;
use sluice_security::{ClientSecurity, FetchKey, ServerSecurity};
use tonic::{Code, Status};
use tracing::info;

/// The iteration the tests' tasks belong to here, and the admitted reader's client id.
const ITERATION: u64 = 2000;
const READER: u64 = 3000;

async fn worker_of_iteration(key: Option<FetchKey>) -> Worker {
    let mut plain = task(1, Dataset::range(50));
    plain.def.iteration_id = ITERATION;
    let mut cached = task(2, Dataset::range(50).repeat_forever());
    cached.def.iteration_id = ITERATION;
    cached.def.use_cross_trainer_cache = true;
    let mut rounds = task(3, Dataset::range(50));
    rounds.def.iteration_id = ITERATION;
    rounds.def.num_consumers = Some(1);
    start_keyed(vec![plain, cached, rounds], &ServerSecurity::default(), key).await
}

/// The first request of a stream of task `task_id` by `client_id`, presenting `admission`.
fn presenting(task_id: u64, client_id: u64, admission: Vec<u8>) -> FetchRequest {
    FetchRequest {
        client_id,
        admission,
        trainer_id: "trainer".into(),
        ..request(task_id, 1 << 16)
    }
}

/// What an attacker may present: (what it is, client id, admission bytes).
fn forgeries() -> Vec<(&'static str, u64, Vec<u8>)> {
    let key = test_key();
    vec![
        ("no admission", 4000, vec![]),
        ("no admission, the reader's id", READER, vec![]),
        (
            "its own admission to another iteration",
            4000,
            key.admit(ITERATION + 1, 4000).to_bytes(),
        ),
        (
            "the reader's admission, under its own id",
            4000,
            key.admit(ITERATION, READER).to_bytes(),
        ),
        (
            "an admission under another key",
            READER,
            FetchKey::random().admit(ITERATION, READER).to_bytes(),
        ),
        (
            "a truncated admission",
            READER,
            key.admit(ITERATION, READER).to_bytes()[..16].to_vec(),
        ),
        ("zeros", READER, vec![0; 32]),
    ]
}

fn refused(status: &Status, task_id: u64, what: &str) {
    assert_eq!(status.code(), Code::PermissionDenied, "{what}: {status:?}");
    let message = status.message();
    assert!(
        message.starts_with(&format!("task {task_id} of iteration {ITERATION}: ")),
        "{what}: {message}"
    );
    assert!(message.contains("admitted"), "{what}: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_without_the_dispatchers_admission_is_refused_and_takes_nothing() {
    let worker = worker_of_iteration(Some(test_key())).await;
    let open = ClientSecurity::default();
    let admitted = test_key().admit(ITERATION, READER).to_bytes();

    for task_id in [1, 2] {
        info!(task_id, "--- forged fetch streams, on both transports");
        for (what, client_id, admission) in forgeries() {
            let first = presenting(task_id, client_id, admission);
            let raw = read_raw_with(&open, worker.addr, first.clone())
                .await
                .expect_err(what);
            refused(&raw, task_id, what);
            let grpc = read_grpc_with(&open, worker.addr, first)
                .await
                .expect_err(what);
            refused(&grpc, task_id, what);
            assert_eq!(raw.message(), grpc.message(), "{what}");
        }
        let wrong = read_raw_with(
            &open,
            worker.addr,
            presenting(
                task_id,
                4000,
                test_key().admit(ITERATION, READER).to_bytes(),
            ),
        )
        .await
        .expect_err("refused");
        assert_eq!(
            wrong.message(),
            format!(
                "task {task_id} of iteration {ITERATION}: the admission presented is not the \
                 dispatcher's admission of client 4000 to iteration {ITERATION}; only readers \
                 the dispatcher admitted to the iteration (GetOrCreateIteration) may read its \
                 tasks"
            )
        );
    }

    info!("--- the admitted reader gets every element, from the first");
    let read = read_raw_with(&open, worker.addr, presenting(1, READER, admitted.clone()))
        .await
        .expect("served");
    assert_eq!(ints(&read), (0..50).collect::<Vec<_>>());
    let cached = first_message(&worker, presenting(2, READER, admitted.clone())).await;
    let want: Vec<i64> = (0..cached.len() as i64).map(|i| i % 50).collect();
    assert!(
        cached == want,
        "the trainer's cursor starts at the cache's first element"
    );

    info!("--- coordinated reads: refused without the admission, served with it");
    let mut grpc = WorkerClient::connect(format!("http://{}", worker.addr))
        .await
        .expect("connect");
    let round = |client_id: u64, admission: Vec<u8>| GetElementRequest {
        task_id: 3,
        consumer_index: 0,
        round_index: 0,
        client_id,
        admission,
        ..Default::default()
    };
    for (what, client_id, admission) in forgeries() {
        let status = grpc
            .get_element(round(client_id, admission))
            .await
            .expect_err(what);
        refused(&status, 3, what);
    }
    let element = grpc
        .get_element(round(READER, admitted.clone()))
        .await
        .expect("served")
        .into_inner();
    assert!(!element.element.is_empty(), "round 0 carries an element");

    info!("--- after the task ended, only the reader may come back for its end");
    worker.state.delete(1);
    let status = read_raw_with(&open, worker.addr, presenting(1, 4000, vec![]))
        .await
        .expect_err("refused");
    refused(&status, 1, "a finished task");
    let end = read_raw_with(&open, worker.addr, presenting(1, READER, admitted))
        .await
        .expect("the end");
    assert!(end.is_empty());
}

/// The integers of the first message of a raw stream opened with `first`.
async fn first_message(worker: &Worker, first: FetchRequest) -> Vec<i64> {
    let socket = raw_fetch::connect(&worker.addr.to_string(), &ClientSecurity::default())
        .await
        .expect("connect");
    let credits = first.credits;
    let (_requests, mut batches) = raw_fetch::open(socket, None, first, credits)
        .await
        .expect("open");
    let batch = tokio::time::timeout(DEADLINE, batches.message())
        .await
        .expect("a batch in time")
        .expect("a batch")
        .expect("a message");
    ints(&decode(batch))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_has_no_fetch_key_yet_answers_unavailable_until_it_has() {
    let worker = worker_of_iteration(None).await;
    let open = ClientSecurity::default();
    let admitted = test_key().admit(ITERATION, READER).to_bytes();
    for first in [
        presenting(1, READER, admitted.clone()),
        presenting(1, 4000, vec![]),
    ] {
        let status = read_grpc_with(&open, worker.addr, first)
            .await
            .expect_err("no key yet");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(
            status.message(),
            "task 1: this worker has not yet received the cluster's fetch key from the \
             dispatcher, so it cannot check the reader's admission; retry"
        );
    }
    worker.state.set_fetch_key(test_key());
    let read = read_grpc_with(&open, worker.addr, presenting(1, READER, admitted))
        .await
        .expect("served once the key arrived");
    assert_eq!(ints(&read), (0..50).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_the_worker_does_not_hold_is_not_here_yet_whatever_the_admission() {
    let worker = start(vec![]).await;
    let status = read_raw_with(
        &ClientSecurity::default(),
        worker.addr,
        presenting(9, 1, vec![]),
    )
    .await
    .expect_err("not here");
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unavailable, "Task 9 not found")
    );
}
