//! A removed task stops whatever its pipeline does, and a task past the memory budget fails
//! alone: the worker's other tasks keep serving.

use super::*;
use crate::config::WorkerConfig;
use crate::task_buffer::Taken;
use crate::task_runner::{TaskResources, TaskRunner};
use sluice_executor::MemoryBudget;
use sluice_formats::DataRoots;
use sluice_proto::dataset::DatasetDef;
use sluice_proto::dispatcher::{Compression, ShardingPolicy, TaskDef};
use sluice_rpc::fake_dispatcher::FakeDispatcher;
use sluice_rpc::DispatcherClient;
use std::time::{Duration, Instant};

/// How long a removed task's pipeline thread may run on: a bound only a pipeline that was not
/// stopped (it filters away 2^50 elements) crosses. How long it takes is `sluice bench --only
/// local`'s `cancel_stop_ms`.
const STOP_WITHIN: Duration = sluice_testwait::HANG;

/// A task of `expr`, whose definition the fake dispatcher serves as dataset `d<task_id>`.
fn task(task_id: u64, expr: &str) -> (TaskDef, DatasetDef) {
    let def = TaskDef {
        task_id,
        dataset_id: format!("d{task_id}"),
        sharding_policy: ShardingPolicy::Off as i32,
        compression: Compression::None as i32,
        ..Default::default()
    };
    let dataset = sluice_pipeline::parse(expr)
        .expect("a valid expression")
        .into_def();
    (def, dataset)
}

/// A worker's task table holding `tasks`, its tasks sharing a budget of `budget` bytes; the
/// fake dispatcher (kept alive by the caller) serves their definitions.
async fn worker(tasks: Vec<(TaskDef, DatasetDef)>, budget: u64) -> (WorkerState, FakeDispatcher) {
    let (completed, _) = mpsc::unbounded_channel();
    let state = WorkerState::new("127.0.0.1:7".into(), completed);
    // Only asked for definitions: the tasks run in mode OFF.
    let fake = FakeDispatcher::leader(0).await;
    let dispatcher = DispatcherClient::new(&fake.addr()).expect("a valid address");
    let resources = TaskResources {
        data_roots: DataRoots::none(),
        python: None,
        memory: MemoryBudget::new(budget, "--memory-budget"),
        stats: Default::default(),
    };
    for (def, dataset) in tasks {
        fake.add_dataset(&def.dataset_id, dataset);
        state.add(TaskRunner::new(
            def,
            dispatcher.clone(),
            tokio::runtime::Handle::current(),
            WorkerConfig::default(),
            state.address.clone(),
            resources.clone(),
        ));
    }
    (state, fake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_task_whose_pipeline_filters_everything_stops() {
    let (state, _fake) = worker(
        vec![task(1, "range(0, 1125899906842624, 2).filter(is_odd)")],
        u64::MAX,
    )
    .await;
    let runner = state.get(1).expect("the task is held");
    // A first read starts the pipeline; it yields nothing, ever.
    let _buffer = runner.buffer();
    assert!(
        !runner.wait_pipeline_ended(Duration::from_millis(50)),
        "the pipeline runs until the task is removed"
    );
    let removed = Instant::now();
    // What a heartbeat's `tasks_to_delete` does.
    state.delete(1);
    assert!(
        runner.wait_pipeline_ended(STOP_WITHIN),
        "the pipeline thread still runs {STOP_WITHIN:?} after its task was removed"
    );
    assert!(removed.elapsed() < STOP_WITHIN, "{:?}", removed.elapsed());
    assert!(runner.error().is_none(), "a removal is not a failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_past_the_memory_budget_fails_alone_and_the_others_keep_serving() {
    let (state, _fake) = worker(
        vec![
            task(1, "range(1125899906842624).batch(1000000000000)"),
            task(2, "range(1000000).batch(100)"),
        ],
        1 << 20,
    )
    .await;
    let huge = state.get(1).expect("the task is held").buffer();
    let taken = tokio::time::timeout(Duration::from_secs(30), huge.take(1))
        .await
        .expect("the task fails instead of filling memory");
    let Taken::Error(failure) = taken else {
        panic!("not a failure")
    };
    assert!(
        // The other task may or may not hold memory yet: either error names the batch.
        failure.message.starts_with("batch ") && failure.message.contains("needs 72 more bytes"),
        "{failure}"
    );
    assert!(
        failure.message.contains("raise --memory-budget"),
        "{failure}"
    );

    let small = state.get(2).expect("the task is held").buffer();
    for _ in 0..100 {
        let taken = tokio::time::timeout(Duration::from_secs(30), small.take(100))
            .await
            .expect("the other task serves");
        assert!(
            matches!(taken, Taken::Elements(_, _)),
            "the other task serves"
        );
    }
}
