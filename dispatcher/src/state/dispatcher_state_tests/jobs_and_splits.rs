//! The general table (datasets, jobs, iterations, tasks, splits), iterations finishing with their
//! tasks, and splits going only to live tasks.

use super::*;

#[test]
fn apply_table() {
    use ShardingPolicy::*;
    let cases: Vec<(&str, Vec<(Update, Outcome)>)> = vec![
        ("generated dataset ids count from 1000", vec![
            (register(None, b"a"), registered("1000")),
            (register(None, b"a"), registered("1001")), // no dedupe by definition, as tf.data
        ]),
        ("explicit ids: same structure returns it, another is rejected, generator skips taken ids", vec![
            (register(Some("1000"), b"a"), registered("1000")),
            (register(Some("1000"), b"a"), registered("1000")),
            (register(Some("1000"), b"b"), invalid("Datasets with the same ID should have the same structure, got diff for dataset ID 1000. To fix this error, make sure you're registering the same dataset with the same ID.")),
            (register(None, b"c"), registered("1001")),
        ]),
        ("jobs need a registered dataset", vec![
            (job("404", Off, None), not_found("Dataset id 404 not found")),
        ]),
        ("static sharding policies make jobs like any other (the worker shards)", vec![
            (register(None, b"a"), registered("1000")),
            (static_worker("h:1", &["h:%port%", "h:%port%"]), workers_tasks(&[])),
            (job("1000", File, None), job_id(5000)),
            (job("1000", Hint, Some("h")), job_id(5001)),
            (job("1000", Data, Some("h")), invalid("Tried to create job with name h, but found an existing job with different parameters: Existing processing mode: <HINT>; got <DATA>. ")),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (static_worker("h:2", &["h:%port%", "h:%port%"]), workers_tasks(&[4001])),
        ]),
        ("a dataset without a split provider is refused in distributed_epoch mode only", vec![
            (register_without_provider("nested"), registered("nested")),
            (job("nested", Dynamic, None), invalid("Dataset nested has no split provider, so it cannot be read in distributed_epoch mode: its sources must all be splittable (range, from_slices, from_tensors or files; not random); use parallel_epochs or a static sharding policy")),
            (job("nested", Dynamic, Some("d")), invalid("Dataset nested has no split provider, so it cannot be read in distributed_epoch mode: its sources must all be splittable (range, from_slices, from_tensors or files; not random); use parallel_epochs or a static sharding policy")),
            (job("nested", Off, None), job_id(5000)),
            (job("nested", Data, Some("d")), job_id(5001)),
        ]),
        ("named jobs are shared; anonymous jobs are always new", vec![
            (register(None, b"a"), registered("1000")),
            (job("1000", Off, Some("shared")), job_id(5000)),
            (job("1000", Off, Some("shared")), job_id(5000)),
            (job("1000", Off, None), job_id(5001)),
            (job("1000", Off, None), job_id(5002)),
        ]),
        ("a job name reused with other parameters is rejected, naming what differs", vec![
            (register(None, b"a"), registered("1000")),
            (register(None, b"b"), registered("1001")),
            (job("1000", Off, Some("j")), job_id(5000)),
            (job("1000", Dynamic, Some("j")), invalid("Tried to create job with name j, but found an existing job with different parameters: Existing processing mode: <OFF>; got <DYNAMIC>. ")),
            (job("1001", Off, Some("j")), invalid("Tried to create job with name j, but found an existing job with different parameters: Existing dataset: 1000; got 1001, whose definition differs. ")),
            (register(None, b"a"), registered("1002")),
            (job("1002", Off, Some("j")), job_id(5000)), // the same definition registered again
            (job("1000", Off, Some("")), invalid("`job_name` must not be empty")),
            // The same definition, registered to be read uncompressed.
            (register_uncompressed(b"a"), registered("1003")),
            (job("1003", Off, Some("j")), invalid("Tried to create job with name j, but found an existing job with different parameters: Existing compression: <auto>; got <none> (Data type mismatch). ")),
        ]),
        ("an iteration gets one task per registered worker and a new client per call", vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (worker("w2"), workers_tasks(&[])),
            (job("1000", Off, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (iteration(5000, 0), iter_client(2000, 3001)),
            (iteration(5000, 1), iter_client(2001, 3002)),
            (iteration(5001, 0), not_found("Job with id 5001 not found")),
        ]),
        ("a worker registering mid-epoch gets a task for every unfinished iteration, once", vec![
            (register(None, b"a"), registered("1000")),
            (job("1000", Off, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (worker("w1"), workers_tasks(&[4000])),
            (worker("w1"), workers_tasks(&[])), // a restarted worker keeps its tasks
            (worker("w2"), workers_tasks(&[4001])),
            (finish("w1", &[4000]), Outcome::TasksFinished),
            (finish("w2", &[4001]), Outcome::TasksFinished),
            (worker("w3"), workers_tasks(&[])), // finished iterations get no new tasks
        ]),
        ("split leases are disjoint ranges, and the end moves to the next repetition", vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (worker("w2"), workers_tasks(&[])),
            (job("1000", Dynamic, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (lease(2000, 4000, 0, 2), splits(0, 0, 2)),
            (lease(2000, 4001, 0, 2), splits(0, 2, 3)),
            (lease(2000, 4000, 0, 2), end_of_splits(0)),
            (lease(2000, 4001, 0, 2), end_of_splits(0)),
            (lease(2000, 4000, 1, 8), splits(1, 0, 3)),
        ]),
        ("split leases are checked", vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (job("1000", Off, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (lease(2000, 4000, 0, 2), precondition("Cannot get split for iteration 2000, since it is not a distributed_epoch iteration.")),
            (lease(2999, 4000, 0, 2), not_found("Iteration id 2999 not found")),
            (job("1000", Dynamic, None), job_id(5001)),
            (iteration(5001, 0), iter_client(2001, 3001)),
            (lease(2001, 4000, 0, 2), not_found("Task 4000 of iteration 2001 not found")),
        ]),
        ("a split repetition past the provider's next is refused, and the cursor stays", vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (job("1000", Dynamic, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (lease(2000, 4000, u64::MAX, 1), invalid("split repetition 18446744073709551615 is beyond the provider's next repetition (it is in repetition 0)")),
            (lease(2000, 4000, u64::MAX, 1), invalid("split repetition 18446744073709551615 is beyond the provider's next repetition (it is in repetition 0)")),
            (lease(2000, 4000, 2, 1), invalid("split repetition 2 is beyond the provider's next repetition (it is in repetition 0)")),
            (lease(2000, 4000, 0, 1), splits(0, 0, 1)),
            (lease(2000, 4000, 1, 1), splits(1, 0, 1)),
        ]),
        ("releasing a client twice is NotFound", vec![
            (register(None, b"a"), registered("1000")),
            (job("1000", Off, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (release(3000), Outcome::ClientReleased),
            (release(3000), not_found("Iteration client id not found: 3000")),
        ]),
        ("finish reports skip unknown ids and other workers' tasks one by one", vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (worker("w2"), workers_tasks(&[])),
            (job("1000", Off, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (finish("w1", &[9999, 4001, 4000]), Outcome::TasksFinished),
        ]),
    ];
    for (name, steps) in cases {
        run(name, steps);
    }
}

#[test]
fn an_iteration_finishes_when_all_its_tasks_finish() {
    use ShardingPolicy::*;
    let state = run(
        "finish",
        vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (worker("w2"), workers_tasks(&[])),
            (job("1000", Off, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (finish("w1", &[4000]), Outcome::TasksFinished),
        ],
    );
    assert!(!state.iteration(IterationId(2000)).unwrap().finished);
    assert_eq!(state.active_tasks_of_worker("w1").len(), 0);
    assert_eq!(state.active_tasks_of_worker("w2").len(), 1);
    let mut state = state;
    state.apply(
        ApplyContext::default(),
        &Request {
            id: None,
            update: finish("w2", &[4001]),
        },
    );
    assert!(state.iteration(IterationId(2000)).unwrap().finished);
}

#[test]
fn splits_go_only_to_live_tasks() {
    use ShardingPolicy::*;
    run(
        "finished and dropped tasks get no splits",
        vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (worker("w2"), workers_tasks(&[])),
            (job("1000", Dynamic, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (lease(2000, 4000, 0, 1), splits(0, 0, 1)),
            (finish("w1", &[4000]), Outcome::TasksFinished),
            (
                lease(2000, 4000, 0, 1),
                precondition("Task 4000 of iteration 2000 has finished; it gets no more splits"),
            ),
            (remove_worker("w2"), Outcome::WorkerRemoved),
            (
                lease(2000, 4001, 0, 1),
                precondition(
                    "Task 4001 of iteration 2000 was dropped (its worker was removed or its \
                     iteration collected); it gets no more splits",
                ),
            ),
        ],
    );
}

/// A lease of a repetition the provider has left behind is answered from the state, as applying
/// it would answer, and only then: the current and next repetitions, and a request whose outcome
/// is recorded, are applied.
#[test]
fn a_lease_of_a_past_repetition_is_answered_without_applying_it() {
    use ShardingPolicy::*;
    let mut state = run(
        "the provider moves to repetition 2",
        vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (job("1000", Dynamic, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (lease(2000, 4000, 0, 3), splits(0, 0, 3)),
            (lease(2000, 4000, 1, 1), splits(1, 0, 1)),
            (lease(2000, 4000, 2, 1), splits(2, 0, 1)),
        ],
    );
    let request = |repetition| LeaseRequest {
        iteration_id: IterationId(2000),
        provider: 0,
        repetition,
        max_splits: 1,
        task_id: TaskId(4000),
    };
    let recorded = RequestId {
        requester: 1,
        seq: 0,
        watermark: 0,
    };
    let Update::LeaseSplits(old) = lease(2000, 4000, 0, 1) else {
        unreachable!()
    };
    let outcome = state.apply(
        ApplyContext::default(),
        &Request {
            id: Some(recorded),
            update: Update::LeaseSplits(old),
        },
    );
    assert_eq!(outcome, end_of_splits(0));
    let rows = [
        // (request id, repetition, answered from the state)
        (None, 0, true),
        (None, 1, true),
        (None, 2, false),           // the provider's repetition: splits may be left
        (None, 3, false),           // the next: the provider moves to it
        (Some(recorded), 1, false), // a retry gets its recorded outcome
    ];
    for (id, repetition, past) in rows {
        let lease = request(repetition);
        assert_eq!(state.check_lease(id, &lease), Ok(()));
        let got = state.lease_of_past_repetition(id, &lease);
        assert_eq!(got.is_some(), past, "{id:?} {repetition}");
        if let Some(got) = got {
            let mut applied = state.clone();
            let outcome = applied.apply(
                ApplyContext::default(),
                &Request {
                    id: None,
                    update: Update::LeaseSplits(lease),
                },
            );
            assert_eq!(Outcome::Splits(got), outcome, "{repetition}");
            assert_eq!(
                applied.iteration(IterationId(2000)),
                state.iteration(IterationId(2000))
            );
        }
    }
}

/// A lease request is logged as the struct variant `LeaseSplits` was before it carried a
/// `LeaseRequest` (`iteration_id`, `provider`, `repetition`, `max: u64`, `task_id`), byte for
/// byte, so journals written before decode unchanged.
#[test]
fn a_lease_request_encodes_as_the_same_bytes_as_the_fields_it_replaced() {
    // The variants before `LeaseSplits` only give it its index.
    #[derive(serde::Serialize)]
    #[allow(dead_code)]
    enum Before {
        RegisterDataset,
        RegisterWorker,
        GetOrCreateJob,
        GetOrCreateIteration,
        LeaseSplits {
            iteration_id: IterationId,
            provider: u32,
            repetition: u64,
            max: u64,
            task_id: TaskId,
        },
    }
    for (provider, repetition, max_splits) in [(0, 0, 0), (1, 300, 4), (7, u64::MAX, u32::MAX)] {
        let before = Before::LeaseSplits {
            iteration_id: IterationId(2000),
            provider,
            repetition,
            max: u64::from(max_splits),
            task_id: TaskId(4000),
        };
        let update = Update::LeaseSplits(LeaseRequest {
            iteration_id: IterationId(2000),
            provider,
            repetition,
            max_splits,
            task_id: TaskId(4000),
        });
        let encoded = sluice_journal::codec::encode(&before);
        assert_eq!(sluice_journal::codec::encode(&update), encoded);
        assert_eq!(
            sluice_journal::codec::decode::<Update>(&encoded).ok(),
            Some(update)
        );
    }
}
