//! The index agrees with the state's own query, and is rebuilt only when allowed.

use super::*;
use crate::ids::{DatasetId, JobId, TaskId};
use crate::state::{
    ApplyContext, Compression, DatasetMetadata, JobOptions, Request, ShardingPolicy, Update,
};

fn apply(state: &mut DispatcherState, update: Update) {
    state.apply(ApplyContext::default(), &Request { id: None, update });
}

/// Two workers, two jobs with an iteration each (a task per worker each), one task finished.
fn state() -> DispatcherState {
    let mut state = DispatcherState::default();
    apply(
        &mut state,
        Update::RegisterDataset {
            dataset_id: Some(DatasetId("d".into())),
            def: vec![1],
            metadata: DatasetMetadata {
                element_spec: vec![],
                cardinality: 10,
                compression: Compression::Auto,
            },
            num_splits: vec![10],
        },
    );
    for address in ["w1", "w2"] {
        apply(
            &mut state,
            Update::RegisterWorker {
                address: address.into(),
                tags: vec![],
                worker_addresses: vec![],
                owner: String::new(),
            },
        );
    }
    for name in ["a", "b"] {
        apply(
            &mut state,
            Update::GetOrCreateJob {
                dataset_id: DatasetId("d".into()),
                sharding: ShardingPolicy::Dynamic,
                job_name: Some(name.into()),
                anonymous_suffix: 0,
                options: JobOptions::default(),
            },
        );
    }
    for job in state.jobs().map(|j| j.id.0).collect::<Vec<_>>() {
        apply(
            &mut state,
            Update::GetOrCreateIteration {
                job_id: JobId(job),
                repetition: 0,
            },
        );
    }
    let first = state
        .active_tasks_of_worker("w1")
        .map(|t| t.id)
        .next()
        .expect("w1 has tasks");
    apply(
        &mut state,
        Update::FinishTasks {
            worker: "w1".into(),
            task_ids: vec![first],
        },
    );
    state
}

/// `state` after w2 reported all its tasks finished.
fn finished_w2(state: &DispatcherState) -> DispatcherState {
    let mut new = state.clone();
    let task_ids: Vec<TaskId> = state.active_tasks_of_worker("w2").map(|t| t.id).collect();
    apply(
        &mut new,
        Update::FinishTasks {
            worker: "w2".into(),
            task_ids,
        },
    );
    new
}

fn active(
    index: &WorkerTasks,
    state: &DispatcherState,
    applied: u64,
    worker: &str,
) -> (Vec<u64>, Freshness) {
    index.with_active(state, Some(applied), Some(applied), worker, |a| {
        a.iter().copied().collect()
    })
}

#[test]
fn the_index_holds_what_the_state_says_each_worker_runs() {
    let state = state();
    let index = WorkerTasks::default();
    for worker in ["w1", "w2", "unknown"] {
        let want: Vec<u64> = state
            .active_tasks_of_worker(worker)
            .map(|t| t.id.0)
            .collect();
        let (got, freshness) = active(&index, &state, 1, worker);
        assert_eq!(got, want, "worker {worker}");
        assert_eq!(freshness, Freshness::Current);
    }
    assert_eq!(active(&index, &state, 1, "w1").0.len(), 1);
    assert_eq!(active(&index, &state, 1, "w2").0.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_newer_state_is_read_behind_until_a_rebuild_is_allowed_but_never_below_the_read_point() {
    let old = state();
    let new = finished_w2(&old);
    let index = WorkerTasks::default();
    assert_eq!(active(&index, &old, 1, "w2").0.len(), 2);
    // Applied 2 but the index may be as old as 1: read behind, asked to check again.
    let (got, freshness) = index.with_active(&new, Some(2), Some(1), "w2", |a| a.len());
    assert_eq!(got, 2);
    assert!(matches!(freshness, Freshness::Behind(_)));
    // A heartbeat whose read waited for 2 never reads the index built at 1.
    let (got, freshness) = index.with_active(&new, Some(2), Some(2), "w2", |a| a.len());
    assert_eq!((got, freshness), (0, Freshness::Current));
}

#[tokio::test(start_paused = true)]
async fn the_index_is_rebuilt_once_the_interval_passed() {
    let old = state();
    let new = finished_w2(&old);
    let index = WorkerTasks::default();
    active(&index, &old, 1, "w2");
    tokio::time::advance(REBUILD_INTERVAL).await;
    let (got, freshness) = index.with_active(&new, Some(2), Some(1), "w2", |a| a.len());
    assert_eq!((got, freshness), (0, Freshness::Current));
}
