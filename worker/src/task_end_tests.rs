//! An exactly-once task reports its end once every element its streams took is recorded in a
//! reader's ledger and acknowledged, and at that moment: the acknowledgement wakes the wait,
//! not the next look on a timer.

use super::*;
use crate::config::WorkerConfig;
use crate::index_list::IndexList;
use crate::reader_stream::ReaderStream;
use crate::task_runner::{TaskResources, TaskRunner};
use bytes::Bytes;
use sluice_element::{Packed, PackedBuilder};
use sluice_executor::MemoryBudget;
use sluice_formats::DataRoots;
use sluice_proto::dispatcher::TaskDef;
use sluice_proto::worker::FetchRequest;
use sluice_rpc::DispatcherClient;

/// `n` elements (their encodings are their positions).
fn elements(n: u64) -> Packed {
    let mut builder = PackedBuilder::default();
    for i in 0..n {
        builder.push_encoded(&i.to_le_bytes(), Bytes::new());
    }
    builder.finish()
}

/// An exactly-once task of `state`, never started: the test takes and records its elements by
/// hand, as the fetch streams do.
fn exactly_once_task(state: &WorkerState, task_id: u64) -> Arc<TaskRunner> {
    let def = TaskDef {
        task_id,
        exactly_once: true,
        ..Default::default()
    };
    let resources = TaskResources {
        data_roots: DataRoots::none(),
        python: None,
        memory: MemoryBudget::new(u64::MAX, "--memory-budget"),
        stats: Default::default(),
    };
    Arc::new(TaskRunner::new(
        def,
        DispatcherClient::new("127.0.0.1:1").expect("a valid address"),
        tokio::runtime::Handle::current(),
        WorkerConfig::default(),
        state.address.clone(),
        resources,
    ))
}

// Paused time: a wait that only a timer ends moves the clock, one that a notification ends
// does not.
#[tokio::test(start_paused = true)]
async fn an_exactly_once_end_is_reported_when_the_last_taken_elements_are_acknowledged() {
    let (completed_tx, mut completed) = mpsc::unbounded_channel();
    let state = Arc::new(WorkerState::new("127.0.0.1:7".into(), completed_tx));
    let runner = exactly_once_task(&state, 1);
    let first = FetchRequest {
        task_id: 1,
        client_id: 9,
        acknowledges: true,
        incarnation: state.incarnation,
        credits: 8,
        window: 8,
        ..Default::default()
    };
    let mut reader = ReaderStream::open(&state, &first, None).expect("the stream opens");
    // A stream took the last 3 elements; the end is taken before it records them.
    runner.took(3);
    state.complete_when_acknowledged(runner.clone());
    // Not a multiple of `ACK_POLL`: each quiet wait ends between two of the wait's looks.
    let quiet = END_ACK_GRACE / 4 + ACK_POLL / 2;
    assert!(
        tokio::time::timeout(quiet, completed.recv()).await.is_err(),
        "elements taken and not yet in a ledger hold the end back"
    );
    reader.record((elements(3), IndexList::from_runs([(0, 3)])));
    runner.recorded(3);
    state.progress();
    assert!(
        tokio::time::timeout(quiet, completed.recv()).await.is_err(),
        "elements recorded and not acknowledged hold the end back"
    );
    // The wait looks again (finding the elements unacknowledged) and parks.
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    let acknowledged = tokio::time::Instant::now();
    let ack = FetchRequest {
        received: 3,
        ..first.clone()
    };
    reader
        .on_request(&ack)
        .expect("the acknowledgement is of what was sent");
    assert_eq!(
        tokio::time::timeout(quiet, completed.recv()).await,
        Ok(Some(1)),
        "the end is reported once everything is acknowledged"
    );
    assert_eq!(
        acknowledged.elapsed(),
        Duration::ZERO,
        "the acknowledgement itself wakes the wait, no timer"
    );
    // Reported once, however often it is asked.
    state.complete_when_acknowledged(runner);
    assert!(tokio::time::timeout(quiet, completed.recv()).await.is_err());
}
