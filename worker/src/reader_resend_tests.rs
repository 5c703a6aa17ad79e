//! Readers that acknowledge, over raw fetch streams that break: a reader that reconnects gets
//! exactly what it had not received, and the worker keeps no more than the reader's window.

use super::tests::{packed, request, start, task, DEADLINE};
use sluice_pipeline::Dataset;
use sluice_proto::worker::FetchRequest;
use sluice_rpc::raw_fetch;
use sluice_security::ClientSecurity;
use std::net::SocketAddr;
use tracing::info;

/// Where a reader stands: the worker incarnation it counts in, and what it received.
#[derive(Debug, Default, Clone, Copy)]
struct Resume {
    incarnation: u64,
    received: u64,
}

fn acking(task_id: u64, credits: u32, window: u32, at: Resume) -> FetchRequest {
    FetchRequest {
        acknowledges: true,
        received: at.received,
        incarnation: at.incarnation,
        window,
        ..request(task_id, credits)
    }
}

/// Reads task `task_id` over one raw fetch stream as an acknowledging reader from `at`,
/// granting back each message's credits, until its end or (when `stop_after` is set) until at
/// least that many elements arrived, when the connection is dropped. Every message must start
/// exactly at the reader's count. Returns the integers received, where the reader stands, and
/// whether the end arrived.
async fn read_acking(
    addr: SocketAddr,
    task_id: u64,
    credits: u32,
    mut at: Resume,
    stop_after: Option<usize>,
) -> (Vec<i64>, Resume, bool) {
    let socket = raw_fetch::connect(&addr.to_string(), &ClientSecurity::default())
        .await
        .expect("connect");
    let first = acking(task_id, credits, credits, at);
    let (requests, mut batches) = raw_fetch::open(socket, None, first, credits)
        .await
        .expect("open");
    let mut got = Vec::new();
    loop {
        let batch = tokio::time::timeout(DEADLINE, batches.message())
            .await
            .expect("a batch in time")
            .expect("a batch")
            .expect("no close before the end");
        assert!(batch.error.is_empty(), "{}", batch.error);
        if at.incarnation != batch.incarnation {
            assert_eq!(at.incarnation, 0, "the same worker process throughout");
            at.incarnation = batch.incarnation;
        }
        assert_eq!(
            batch.first_sequence, at.received,
            "resumed at the reader's count"
        );
        let elements = packed(&batch);
        let n = elements.len();
        got.extend(
            elements
                .into_decoder()
                .map(|e| e.expect("an element").as_i64().expect("an integer")),
        );
        at.received += n as u64;
        if batch.end_of_sequence {
            let _ = requests.send(acking(task_id, 0, credits, at)).await;
            return (got, at, true);
        }
        if stop_after.is_some_and(|k| got.len() >= k) {
            return (got, at, false);
        }
        requests
            .send(acking(task_id, n as u32, credits, at))
            .await
            .expect("the stream is open");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_reconnects_gets_exactly_what_it_had_not_received() {
    let worker = start(vec![task(1, Dataset::range(1000))]).await;
    let credits = 16;

    info!("--- a first stream, dropped mid-way");
    let (mut got, at, ended) =
        read_acking(worker.addr, 1, credits, Resume::default(), Some(40)).await;
    assert!(!ended);
    let ledger = worker
        .state
        .existing_ledger(&crate::reader_stream::ledger_key(&request(1, 0)))
        .expect("the reader's ledger");
    let unacked = ledger.lock().expect("ledger").unacked();
    assert!(
        unacked <= u64::from(credits),
        "{unacked} held for a window of {credits}"
    );

    info!("--- the reader lost the last 5 elements it was sent: they come again");
    got.truncate(got.len() - 5);
    let lost = Resume {
        received: at.received - 5,
        ..at
    };
    let (more, at, ended) = read_acking(worker.addr, 1, credits, lost, Some(200)).await;
    assert!(!ended);
    got.extend(more);

    info!("--- and once more, from the reader's exact count, to the end");
    let (rest, at, ended) = read_acking(worker.addr, 1, credits, at, None).await;
    assert!(ended);
    got.extend(rest);
    assert_eq!(
        got,
        (0..1000).collect::<Vec<i64>>(),
        "every element once, in order"
    );
    assert_eq!(at.received, 1000);

    info!("--- the end acknowledged, the ledger goes");
    wait_for_no_ledger(&worker.state).await;
}

/// Waits (at most `DEADLINE`) until the worker holds no ledger.
async fn wait_for_no_ledger(state: &crate::worker_state::WorkerState) {
    sluice_testwait::wait_until("the ledger to be dropped", DEADLINE, || {
        state.ledger_count() == 0
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_reconnecting_after_the_end_gets_the_rest_and_the_end() {
    let worker = start(vec![task(1, Dataset::range(30))]).await;

    info!("--- everything is taken and sent; the reader keeps only the first 10");
    let (got, at, ended) = read_acking(worker.addr, 1, 64, Resume::default(), None).await;
    assert!(ended);
    assert_eq!(got.len(), 30);
    // The end's acknowledgement let the ledger go; a reader whose connection broke before it
    // reached the worker finds the elements held instead. Make that case: hold them again.
    wait_for_no_ledger(&worker.state).await;
    worker.state.delete(1);
    let key = crate::reader_stream::ledger_key(&request(1, 0));
    let ledger = worker.state.ledger(key);
    ledger
        .lock()
        .expect("ledger")
        .record(packed(&encoded_range(30)), Default::default());

    info!("--- the task is finished: the rest, then the end");
    let lost = Resume { received: 10, ..at };
    let (rest, _, ended) = read_acking(worker.addr, 1, 64, lost, None).await;
    assert!(ended);
    assert_eq!(rest, (10..30).collect::<Vec<i64>>());
}

/// A message carrying `range(n)`, as the worker encodes it.
fn encoded_range(n: i64) -> sluice_proto::worker::ElementBatch {
    let mut builder = sluice_element::PackedBuilder::default();
    for i in 0..n {
        builder.push(
            &sluice_element::Tensor::scalar_i64(i).into(),
            sluice_element::Compression::None,
        );
    }
    let (packed, lengths, each_length, payloads) = builder.finish().into_wire();
    sluice_proto::worker::ElementBatch {
        packed,
        lengths,
        each_length,
        payloads,
        ..Default::default()
    }
}

/// The planted bug of the chaos self-test: a reader that acknowledges what it receives is sent
/// an element it already acknowledged, as if it were new.
#[cfg(feature = "planted-resend-bug")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_planted_bug_a_reader_receives_a_duplicate() {
    let worker = start(vec![task(1, Dataset::range(2000))]).await;
    let (got, _, ended) = read_acking(worker.addr, 1, 64, Resume::default(), None).await;
    assert!(ended);
    let mut unique = got.clone();
    unique.sort_unstable();
    unique.dedup();
    assert!(
        unique.len() < got.len(),
        "a duplicate among {} elements",
        got.len()
    );
}

/// The memory bound: a reader that grants many credits but acknowledges late is never sent more
/// than its window past its last acknowledgement, and the ledger holds no more than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holds_no_more_than_the_readers_window_unacknowledged() {
    let worker = start(vec![task(1, Dataset::range(300))]).await;
    let (credits, window) = (1000, 16);
    let socket = raw_fetch::connect(&worker.addr.to_string(), &ClientSecurity::default())
        .await
        .expect("connect");
    let first = acking(1, credits, window, Resume::default());
    let (requests, mut batches) = raw_fetch::open(socket, None, first, credits)
        .await
        .expect("open");
    let key = crate::reader_stream::ledger_key(&request(1, 0));
    let mut at = Resume::default();
    let mut acked = 0;
    loop {
        let batch = tokio::time::timeout(DEADLINE, batches.message())
            .await
            .expect("a batch in time")
            .expect("a batch")
            .expect("no close before the end");
        at.incarnation = batch.incarnation;
        at.received += packed(&batch).len() as u64;
        assert!(
            at.received - acked <= u64::from(window),
            "{} elements past the last acknowledgement ({acked})",
            at.received - acked
        );
        if let Some(ledger) = worker.state.existing_ledger(&key) {
            let unacked = ledger.lock().expect("ledger").unacked();
            assert!(unacked <= u64::from(window), "{unacked} held");
        }
        if batch.end_of_sequence {
            break;
        }
        // Acknowledged only once the window is used up; no more credits.
        if at.received - acked == u64::from(window) {
            acked = at.received;
            requests
                .send(acking(1, 0, window, at))
                .await
                .expect("the stream is open");
        }
    }
    assert_eq!(at.received, 300);
}

/// A reader that read from an earlier process of this worker counts in that process's numbers:
/// its count acknowledges nothing here, and it is served from the first element.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_from_another_worker_process_acknowledges_nothing() {
    let worker = start(vec![task(1, Dataset::range(50))]).await;
    let elsewhere = Resume {
        incarnation: worker.state.incarnation ^ 1,
        received: 900,
    };
    let socket = raw_fetch::connect(&worker.addr.to_string(), &ClientSecurity::default())
        .await
        .expect("connect");
    let (requests, mut batches) = raw_fetch::open(socket, None, acking(1, 4, 8, elsewhere), 8)
        .await
        .expect("open");
    // More credits, still in the other process's numbers.
    requests
        .send(acking(1, 4, 8, elsewhere))
        .await
        .expect("the stream is open");
    let mut received = 0;
    while received < 8 {
        let batch = tokio::time::timeout(DEADLINE, batches.message())
            .await
            .expect("a batch in time")
            .expect("not refused")
            .expect("a batch");
        assert_eq!(batch.incarnation, worker.state.incarnation);
        assert_eq!(
            batch.first_sequence, received,
            "served from the first element"
        );
        received += packed(&batch).len() as u64;
    }
}
