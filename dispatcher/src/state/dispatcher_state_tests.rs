//! Table tests of `DispatcherState::apply`: each case is a script of requests applied to a fresh
//! state, with the outcome every step must produce.

use super::request_log::MAX_OUTCOMES_PER_REQUESTER;
use super::*;
use sluice_dataset::Compression;
use sluice_types::{
    ClientId, DatasetId, IterationId, JobId, LeaseRequest, ShardingPolicy, SplitLease,
    TargetWorkers, TaskId,
};

fn meta() -> DatasetMetadata {
    DatasetMetadata {
        element_spec: vec![1, 2],
        cardinality: 10,
        compression: Compression::Auto,
    }
}
fn register(id: Option<&str>, def: &[u8]) -> Update {
    Update::RegisterDataset {
        dataset_id: id.map(|s| DatasetId(s.into())),
        def: def.to_vec(),
        metadata: meta(),
        num_splits: vec![3],
    }
}
fn worker(address: &str) -> Update {
    static_worker(address, &[])
}
/// A worker registered by a leader configured with the static-sharding list `list`.
fn static_worker(address: &str, list: &[&str]) -> Update {
    Update::RegisterWorker {
        address: address.into(),
        tags: vec![],
        worker_addresses: list.iter().map(|s| s.to_string()).collect(),
        owner: String::new(),
    }
}
fn job(dataset: &str, sharding: ShardingPolicy, name: Option<&str>) -> Update {
    Update::GetOrCreateJob {
        dataset_id: DatasetId(dataset.into()),
        sharding,
        job_name: name.map(Into::into),
        anonymous_suffix: 7,
        options: JobOptions::default(),
    }
}
fn iteration(job: u64, repetition: u64) -> Update {
    Update::GetOrCreateIteration {
        job_id: JobId(job),
        repetition,
    }
}
fn lease(iteration: u64, task: u64, repetition: u64, max_splits: u32) -> Update {
    Update::LeaseSplits(LeaseRequest {
        iteration_id: IterationId(iteration),
        provider: 0,
        repetition,
        max_splits,
        task_id: TaskId(task),
    })
}
fn finish(worker: &str, tasks: &[u64]) -> Update {
    Update::FinishTasks {
        worker: worker.into(),
        task_ids: tasks.iter().map(|t| TaskId(*t)).collect(),
    }
}
fn release(client: u64) -> Update {
    Update::ReleaseIterationClient {
        client_id: ClientId(client),
    }
}

fn registered(id: &str) -> Outcome {
    Outcome::DatasetRegistered {
        dataset_id: DatasetId(id.into()),
    }
}
fn workers_tasks(tasks: &[u64]) -> Outcome {
    Outcome::WorkerRegistered {
        tasks: tasks.iter().map(|t| TaskId(*t)).collect(),
    }
}
fn job_id(id: u64) -> Outcome {
    Outcome::Job { job_id: JobId(id) }
}
fn iter_client(iteration: u64, client: u64) -> Outcome {
    Outcome::Iteration {
        iteration_id: IterationId(iteration),
        client_id: ClientId(client),
    }
}
fn splits(repetition: u64, start: u64, end: u64) -> Outcome {
    Outcome::Splits(SplitLease {
        repetition,
        start,
        end,
        end_of_splits: false,
    })
}
fn end_of_splits(repetition: u64) -> Outcome {
    Outcome::Splits(SplitLease {
        repetition,
        start: 0,
        end: 0,
        end_of_splits: true,
    })
}
/// A part of the definition `def` (the key is the whole definition's).
fn stage(def: &[u8], offset: u64, part: &[u8]) -> Update {
    Update::StageDefinition {
        key: definition_key(def),
        offset,
        bytes: part.to_vec(),
    }
}
fn register_staged(id: Option<&str>, def: &[u8], len: u64) -> Update {
    Update::RegisterStagedDataset {
        dataset_id: id.map(|s| DatasetId(s.into())),
        key: definition_key(def),
        len,
        metadata: meta(),
        num_splits: vec![3],
    }
}
fn staged(bytes: u64) -> Outcome {
    Outcome::DefinitionStaged { staged: bytes }
}
fn not_found(msg: &str) -> Outcome {
    Outcome::Rejected(Rejection::NotFound(msg.into()))
}
fn invalid(msg: &str) -> Outcome {
    Outcome::Rejected(Rejection::InvalidArgument(msg.into()))
}
fn precondition(msg: &str) -> Outcome {
    Outcome::Rejected(Rejection::FailedPrecondition(msg.into()))
}

fn run(name: &str, steps: Vec<(Update, Outcome)>) -> DispatcherState {
    let mut state = DispatcherState::default();
    for (i, (update, want)) in steps.into_iter().enumerate() {
        let got = state.apply(
            ApplyContext::default(),
            &Request {
                id: None,
                update: update.clone(),
            },
        );
        assert_eq!(got, want, "case {name:?}, step {i}: {update:?}");
    }
    state
}

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
fn staged_definitions_table() {
    let redo = "register the dataset again";
    let cases: Vec<(&str, Vec<(Update, Outcome)>)> = vec![
        (
            "parts in order, then the registration",
            vec![
                (stage(b"abcde", 0, b"ab"), staged(2)),
                (stage(b"abcde", 2, b"cd"), staged(4)),
                (stage(b"abcde", 4, b"e"), staged(5)),
                (register_staged(None, b"abcde", 5), registered("1000")),
            ],
        ),
        (
            "a part already in place, or overlapping the end, is taken again",
            vec![
                (stage(b"abcde", 0, b"abc"), staged(3)),
                (stage(b"abcde", 0, b"abc"), staged(3)),
                (stage(b"abcde", 1, b"bcde"), staged(5)),
                (register_staged(Some("d"), b"abcde", 5), registered("d")),
            ],
        ),
        (
            "a gap is refused and changes nothing",
            vec![
                (stage(b"abcde", 0, b"ab"), staged(2)),
                (
                    stage(b"abcde", 3, b"de"),
                    precondition(&format!(
                        "a definition part at offset 3, but only 2 bytes of it are staged: {redo}"
                    )),
                ),
                (stage(b"abcde", 2, b"cde"), staged(5)),
            ],
        ),
        (
            "a registration before every byte is staged is refused",
            vec![
                (stage(b"abcde", 0, b"ab"), staged(2)),
                (
                    register_staged(None, b"abcde", 5),
                    precondition(&format!("2 of the definition's 5 bytes are staged: {redo}")),
                ),
                (
                    register_staged(None, b"xyz", 3),
                    precondition(&format!(
                        "the definition is not staged (another upload replaced it): {redo}"
                    )),
                ),
            ],
        ),
        (
            "a later part of a definition never started is refused",
            vec![(
                stage(b"abcde", 2, b"cd"),
                precondition(&format!(
                    "no part of the definition before offset 2 is staged (another upload \
                     replaced it): {redo}"
                )),
            )],
        ),
        (
            "another definition's first part drops the one in staging",
            vec![
                (stage(b"abcde", 0, b"ab"), staged(2)),
                (stage(b"xyz", 0, b"xy"), staged(2)),
                (
                    stage(b"abcde", 2, b"cd"),
                    precondition(&format!(
                        "no part of the definition before offset 2 is staged (another upload \
                         replaced it): {redo}"
                    )),
                ),
                (stage(b"xyz", 2, b"z"), staged(3)),
                (register_staged(None, b"xyz", 3), registered("1000")),
            ],
        ),
        (
            "parts of a registered definition change nothing; its registration is a new dataset",
            vec![
                (register(None, b"abcde"), registered("1000")),
                (stage(b"abcde", 0, b"ab"), staged(5)),
                (stage(b"abcde", 4, b"e"), staged(5)),
                (register_staged(None, b"abcde", 5), registered("1001")),
            ],
        ),
        (
            "a whole registration of a definition in staging stores it whole",
            vec![
                (stage(b"abcde", 0, b"ab"), staged(2)),
                (register(None, b"abcde"), registered("1000")),
                (register_staged(None, b"abcde", 5), registered("1001")),
            ],
        ),
        (
            "a part past the largest definition, or whose end overflows, is refused",
            vec![
                (
                    stage(b"abcde", MAX_DEFINITION_BYTES, b"a"),
                    invalid(&format!(
                        "a definition part of 1 bytes at offset {MAX_DEFINITION_BYTES} reaches \
                         past the largest definition, {MAX_DEFINITION_BYTES} bytes"
                    )),
                ),
                (
                    stage(b"abcde", u64::MAX, b"a"),
                    invalid(&format!(
                        "a definition part of 1 bytes at offset {} reaches past the largest \
                         definition, {MAX_DEFINITION_BYTES} bytes",
                        u64::MAX
                    )),
                ),
            ],
        ),
    ];
    for (name, steps) in cases {
        let state = run(name, steps);
        if let Err(e) = state.check_invariants() {
            panic!("case {name:?}: {e}");
        }
    }
    // The staged definition is the one registered.
    let state = run(
        "parts",
        vec![
            (stage(b"abcde", 0, b"abc"), staged(3)),
            (stage(b"abcde", 3, b"de"), staged(5)),
            (register_staged(None, b"abcde", 5), registered("1000")),
        ],
    );
    let dataset = state
        .dataset(&DatasetId("1000".into()))
        .expect("registered");
    assert_eq!(state.dataset_def(dataset), Some(&b"abcde"[..]));
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
fn a_repeated_request_id_returns_the_recorded_outcome() {
    let mut state = DispatcherState::default();
    let id = |seq| {
        Some(RequestId {
            requester: 42,
            seq,
            watermark: 0,
        })
    };
    let apply = |state: &mut DispatcherState, seq, update: Update| {
        state.apply(
            ApplyContext::default(),
            &Request {
                id: id(seq),
                update,
            },
        )
    };
    assert_eq!(
        apply(&mut state, 1, register(None, b"a")),
        registered("1000")
    );
    assert_eq!(
        apply(&mut state, 1, register(None, b"a")),
        registered("1000"),
        "retry is not applied again"
    );
    assert_eq!(
        apply(&mut state, 2, register(None, b"a")),
        registered("1001")
    );
    apply(&mut state, 3, worker("w"));
    apply(&mut state, 4, job("1000", ShardingPolicy::Dynamic, None));
    apply(&mut state, 5, iteration(5000, 0));
    // A lease whose reply was lost and is retried returns the same range, not a new one.
    assert_eq!(
        apply(&mut state, 6, lease(2000, 4000, 0, 2)),
        splits(0, 0, 2)
    );
    assert_eq!(
        apply(&mut state, 6, lease(2000, 4000, 0, 2)),
        splits(0, 0, 2)
    );
    assert_eq!(
        apply(&mut state, 7, lease(2000, 4000, 0, 2)),
        splits(0, 2, 3)
    );
    // However many requests follow, a request at or above the watermark keeps its outcome.
    for seq in 8..8 + 200 {
        apply(&mut state, seq, release(9999));
    }
    assert_eq!(
        apply(&mut state, 6, lease(2000, 4000, 0, 2)),
        splits(0, 0, 2)
    );
}

/// Watermarks: `(seq, watermark, update, expected)` applied in order by requester 42.
#[test]
fn request_watermarks_table() {
    let mut state = DispatcherState::default();
    let refused_below = |seq: u64, watermark: u64| {
        precondition(&format!(
            "request {seq} of requester 42 is below the requester's watermark {watermark}: it \
             was answered before, and is not applied again"
        ))
    };
    let steps: Vec<(u64, u64, Update, Outcome)> = vec![
        (1, 1, register(None, b"a"), registered("1000")),
        (2, 1, register(None, b"b"), registered("1001")),
        // Seq 1 is still awaited (watermark 1): its retry gets the recorded outcome.
        (1, 1, register(None, b"a"), registered("1000")),
        // The requester now says everything below 3 was answered.
        (3, 3, register(None, b"c"), registered("1002")),
        (1, 3, register(None, b"a"), refused_below(1, 3)),
        (2, 1, register(None, b"b"), refused_below(2, 3)),
        // A watermark above the request's own seq counts as its seq.
        (5, 9, register(None, b"d"), registered("1003")),
        (4, 4, register(None, b"e"), refused_below(4, 5)),
        (5, 5, register(None, b"d"), registered("1003")),
    ];
    for (step, (seq, watermark, update, expected)) in steps.into_iter().enumerate() {
        let request = Request {
            id: Some(RequestId {
                requester: 42,
                seq,
                watermark,
            }),
            update,
        };
        let outcome = state.apply(ApplyContext::default(), &request);
        assert_eq!(
            outcome, expected,
            "step {step}: seq {seq} watermark {watermark}"
        );
    }
    assert_eq!(
        state.sizes().datasets,
        4,
        "refused requests changed nothing"
    );
}

#[test]
fn a_requester_that_never_raises_its_watermark_is_refused_not_grown() {
    let mut state = DispatcherState::default();
    let request = |seq| Request {
        id: Some(RequestId {
            requester: 7,
            seq,
            watermark: 0,
        }),
        update: release(9999),
    };
    for seq in 0..MAX_OUTCOMES_PER_REQUESTER as u64 {
        state.apply(ApplyContext::default(), &request(seq));
    }
    let refused = state.apply(
        ApplyContext::default(),
        &request(MAX_OUTCOMES_PER_REQUESTER as u64),
    );
    assert!(
        matches!(refused, Outcome::Rejected(Rejection::ResourceExhausted(_))),
        "{refused:?}"
    );
    assert_eq!(state.sizes().recorded_outcomes, MAX_OUTCOMES_PER_REQUESTER);
}

#[test]
fn a_silent_requester_is_forgotten_after_the_ttl() {
    use super::request_log::REQUESTER_TTL_MICROS;
    let mut state = DispatcherState::default();
    let at = |time_micros| ApplyContext {
        log_index: 0,
        time_micros,
    };
    for requester in 0..100 {
        let request = Request {
            id: Some(RequestId {
                requester,
                seq: 1,
                watermark: 1,
            }),
            update: release(9999),
        };
        state.apply(at(requester), &request);
    }
    assert_eq!(state.sizes().requesters, 100);
    let later = Request {
        id: None,
        update: release(9999),
    };
    state.apply(at(50 + REQUESTER_TTL_MICROS), &later);
    assert_eq!(
        state.sizes().requesters,
        50,
        "the 50 silent longest are gone"
    );
    state.apply(at(1000 + REQUESTER_TTL_MICROS), &later);
    assert_eq!(state.sizes().requesters, 0);
}

#[test]
fn replaying_the_same_log_gives_the_same_state() {
    let log: Vec<Update> = vec![
        register(None, b"a"),
        worker("w1"),
        job("1000", ShardingPolicy::Dynamic, Some("j")),
        iteration(5000, 0),
        lease(2000, 4000, 0, 2),
        worker("w2"),
        finish("w1", &[4000]),
    ];
    let replay = || {
        let mut state = DispatcherState::default();
        let outcomes: Vec<Outcome> = log
            .iter()
            .map(|u| {
                state.apply(
                    ApplyContext::default(),
                    &Request {
                        id: None,
                        update: u.clone(),
                    },
                )
            })
            .collect();
        (format!("{state:?}"), outcomes)
    };
    assert_eq!(replay(), replay());
}

fn remove_worker(address: &str) -> Update {
    Update::RemoveWorker {
        address: address.into(),
    }
}
fn gc(iteration: u64) -> Update {
    Update::GarbageCollectIteration {
        iteration_id: IterationId(iteration),
    }
}

#[test]
fn expiry_and_garbage_collection_table() {
    use ShardingPolicy::*;
    type Case = (&'static str, Vec<(Update, Outcome)>, Vec<(u64, bool)>);
    let cases: Vec<Case> = vec![
        // (name, script, expected (iteration, finished) after it)
        (
            "a removed worker's tasks are dropped and the epoch ends with the others",
            vec![
                (register(None, b"a"), registered("1000")),
                (worker("w1"), workers_tasks(&[])),
                (worker("w2"), workers_tasks(&[])),
                (job("1000", Dynamic, None), job_id(5000)),
                (iteration(5000, 0), iter_client(2000, 3000)),
                (finish("w1", &[4000]), Outcome::TasksFinished),
                (remove_worker("w2"), Outcome::WorkerRemoved),
            ],
            vec![(2000, true)],
        ),
        (
            "an iteration whose every worker was removed waits for a worker to come back",
            vec![
                (register(None, b"a"), registered("1000")),
                (worker("w1"), workers_tasks(&[])),
                (job("1000", Dynamic, None), job_id(5000)),
                (iteration(5000, 0), iter_client(2000, 3000)),
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (remove_worker("w1"), Outcome::WorkerRemoved), // proposed twice: a no-op
                (worker("w1"), workers_tasks(&[4001])), // back: a new task for the same iteration
                (finish("w1", &[4000]), Outcome::TasksFinished), // the dropped task cannot finish it
            ],
            vec![(2000, false)],
        ),
        (
            "a returning worker's new task finishes the iteration",
            vec![
                (register(None, b"a"), registered("1000")),
                (worker("w1"), workers_tasks(&[])),
                (job("1000", Dynamic, None), job_id(5000)),
                (iteration(5000, 0), iter_client(2000, 3000)),
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (worker("w1"), workers_tasks(&[4001])),
                (finish("w1", &[4001]), Outcome::TasksFinished),
            ],
            vec![(2000, true)],
        ),
        (
            "an idle iteration is collected and its key serves a new iteration",
            vec![
                (register(None, b"a"), registered("1000")),
                (worker("w1"), workers_tasks(&[])),
                (job("1000", Off, Some("j")), job_id(5000)),
                (iteration(5000, 0), iter_client(2000, 3000)),
                (gc(2000), Outcome::IterationCollected), // a client is attached: not idle, kept
                (release(3000), Outcome::ClientReleased),
                (gc(2000), Outcome::IterationCollected),
                (iteration(5000, 0), iter_client(2001, 3001)),
                (gc(2999), not_found("Iteration id 2999 not found")),
            ],
            vec![(2000, true), (2001, false)],
        ),
    ];
    for (name, steps, finished) in cases {
        let state = run(name, steps);
        for (iteration, want) in finished {
            let it = state
                .iteration(IterationId(iteration))
                .expect("iteration exists");
            assert_eq!(
                it.finished, want,
                "case {name:?}: iteration {iteration} finished"
            );
        }
    }
    let state = run(
        "gc marks",
        vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (job("1000", Off, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (release(3000), Outcome::ClientReleased),
            (gc(2000), Outcome::IterationCollected),
        ],
    );
    let it = state
        .iteration(IterationId(2000))
        .expect("kept for history");
    assert!(it.garbage_collected && state.task(TaskId(4000)).expect("task").dropped);
    assert_eq!(
        state.active_tasks_of_worker("w1").len(),
        0,
        "the worker stops the collected task"
    );
}

/// `RemoveIdle` listing everything with these cutoffs.
fn remove_idle(iterations_before: u64, datasets_before: u64) -> Update {
    Update::RemoveIdle {
        iterations_before,
        datasets_before,
        iterations: (2000..2003).map(IterationId).collect(),
        jobs: (5000..5003).map(JobId).collect(),
        datasets: ["1000", "1001", "mine"]
            .iter()
            .map(|d| DatasetId(d.to_string()))
            .collect(),
    }
}
fn removed(iterations: u64, jobs: u64, datasets: u64) -> Outcome {
    Outcome::IdleRemoved {
        iterations,
        jobs,
        datasets,
    }
}

/// Like `run`, each step at its own leader time.
fn run_timed(name: &str, steps: Vec<(u64, Update, Outcome)>) -> DispatcherState {
    let mut state = DispatcherState::default();
    for (i, (time_micros, update, want)) in steps.into_iter().enumerate() {
        let ctx = ApplyContext {
            log_index: i as u64,
            time_micros,
        };
        let got = state.apply(
            ctx,
            &Request {
                id: None,
                update: update.clone(),
            },
        );
        assert_eq!(got, want, "case {name:?}, step {i}: {update:?}");
        if let Err(broken) = state.check_invariants() {
            panic!("case {name:?}, step {i}: {broken}");
        }
    }
    state
}

#[test]
fn idle_removal_table() {
    use ShardingPolicy::*;
    // (name, script of (time, update, outcome), then what the state holds:
    // (datasets, definitions, jobs, iterations, tasks))
    type Case = (&'static str, Vec<(u64, Update, Outcome)>, [usize; 5]);
    let cases: Vec<Case> = vec![
        (
            "a finished iteration goes once its last client left before the cutoff, with its \
             job; then its dataset",
            vec![
                (10, register(None, b"a"), registered("1000")),
                (10, worker("w1"), workers_tasks(&[])),
                (20, job("1000", Off, None), job_id(5000)),
                (20, iteration(5000, 0), iter_client(2000, 3000)),
                (30, finish("w1", &[4000]), Outcome::TasksFinished),
                (40, remove_idle(100, 0), removed(0, 0, 0)), // its client is still there
                (50, release(3000), Outcome::ClientReleased),
                (60, remove_idle(50, 0), removed(0, 0, 0)), // released at 50, not before 50
                (70, remove_idle(51, 0), removed(1, 1, 0)), // the job goes with its last iteration
                (90, remove_idle(51, 20), removed(0, 0, 0)), // the dataset was used at 20
                (90, remove_idle(51, 21), removed(0, 0, 1)),
            ],
            [0, 0, 0, 0, 0],
        ),
        (
            "an unfinished iteration with clients stays; so do its job and dataset",
            vec![
                (10, register(None, b"a"), registered("1000")),
                (10, worker("w1"), workers_tasks(&[])),
                (20, job("1000", Dynamic, Some("j")), job_id(5000)),
                (20, iteration(5000, 0), iter_client(2000, 3000)),
                (90, remove_idle(u64::MAX, u64::MAX), removed(0, 0, 0)),
            ],
            [1, 1, 1, 1, 1],
        ),
        (
            "a collected iteration goes, and its key makes a fresh iteration",
            vec![
                (10, register(None, b"a"), registered("1000")),
                (10, worker("w1"), workers_tasks(&[])),
                (20, job("1000", Off, Some("j")), job_id(5000)),
                (20, iteration(5000, 0), iter_client(2000, 3000)),
                (30, release(3000), Outcome::ClientReleased),
                (40, gc(2000), Outcome::IterationCollected),
                (45, job("1000", Off, Some("j")), job_id(5000)), // asked for again
                (50, remove_idle(31, 0), removed(1, 0, 0)),
                (60, iteration(5000, 0), iter_client(2001, 3001)),
                (
                    60,
                    lease(2000, 4000, 0, 1),
                    not_found("Iteration id 2000 not found"),
                ),
            ],
            [1, 1, 1, 1, 1],
        ),
        (
            "a job asked for again after the cutoff stays",
            vec![
                (10, register(None, b"a"), registered("1000")),
                (20, job("1000", Off, Some("j")), job_id(5000)),
                (60, job("1000", Off, Some("j")), job_id(5000)),
                (70, remove_idle(50, 0), removed(0, 0, 0)),
                (70, remove_idle(61, 0), removed(0, 1, 0)),
                (80, job("1000", Off, Some("j")), job_id(5001)), // a new job of that name
            ],
            [1, 1, 1, 0, 0],
        ),
        (
            "definitions are stored once per content and go with their last dataset",
            vec![
                (10, register(None, b"a"), registered("1000")),
                (11, register(None, b"a"), registered("1001")),
                (12, register(Some("mine"), b"b"), registered("mine")),
                (20, remove_idle(0, 11), removed(0, 0, 1)),
            ],
            [2, 2, 0, 0, 0],
        ),
        (
            "a dataset a job reads stays, however old",
            vec![
                (10, register(None, b"a"), registered("1000")),
                (20, job("1000", Off, None), job_id(5000)),
                (90, remove_idle(0, u64::MAX), removed(0, 0, 0)),
            ],
            [1, 1, 1, 0, 0],
        ),
    ];
    for (name, steps, want) in cases {
        let state = run_timed(name, steps);
        let sizes = state.sizes();
        let got = [
            sizes.datasets,
            sizes.definitions,
            sizes.jobs,
            sizes.iterations,
            sizes.tasks,
        ];
        assert_eq!(
            got, want,
            "case {name:?}: datasets, definitions, jobs, iterations, tasks"
        );
    }
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

fn coordinated_job(name: &str, num_consumers: u32) -> Update {
    Update::GetOrCreateJob {
        dataset_id: DatasetId("1000".into()),
        sharding: ShardingPolicy::Off,
        job_name: Some(name.into()),
        anonymous_suffix: 7,
        options: JobOptions {
            num_consumers: Some(num_consumers),
            ..JobOptions::default()
        },
    }
}
fn rounds(client: u64, current_round: u64, blocked_round: Option<u64>) -> Update {
    Update::ClientRounds {
        client_id: ClientId(client),
        current_round,
        blocked_round,
    }
}
fn block(round: Option<u64>) -> Outcome {
    Outcome::Rounds { block_round: round }
}
fn remove_task(task: u64) -> Update {
    Update::RemoveTask {
        task_id: TaskId(task),
    }
}

/// The pending-task protocol of coordinated reads (tf.data's `DI.h` header comment), with the
/// round estimate kept per iteration (tf.data keys it by client and reads it by iteration, so its first target round is always rejected).
#[test]
fn coordinated_reads_table() {
    // Two consumers (clients 3000 and 3001) read job "rr" of iteration 2000; w1 runs task 4000.
    let start = || {
        vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (coordinated_job("rr", 2), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (iteration(5000, 0), iter_client(2000, 3001)),
        ]
    };
    let with = |more: Vec<(Update, Outcome)>| start().into_iter().chain(more).collect::<Vec<_>>();
    // (name, script, the iteration's tasks with their starting rounds, pending task ids)
    type Case = (
        &'static str,
        Vec<(Update, Outcome)>,
        Vec<(u64, u64)>,
        Vec<u64>,
    );
    let cases: Vec<Case> = vec![
        (
            "without a pending task rounds are only recorded",
            with(vec![(rounds(3000, 7, None), block(None))]),
            vec![(4000, 0)],
            vec![],
        ),
        (
            "rounds past the largest are refused and change nothing",
            with(vec![
                (worker("w2"), workers_tasks(&[4001])),
                (rounds(3000, u64::MAX, None), invalid("current_round 18446744073709551615 is past the largest round, 4611686018427387904")),
                (rounds(3001, 0, Some(u64::MAX)), invalid("blocked_round 18446744073709551615 is past the largest round, 4611686018427387904")),
                (rounds(3000, 0, Some(1)), block(Some(1))),
            ]),
            vec![(4000, 0)],
            vec![4001],
        ),
        (
            "a worker joining mid-job gets a pending task one round past the estimate",
            with(vec![
                (rounds(3000, 7, None), block(None)),
                (worker("w2"), workers_tasks(&[4001])),
            ]),
            vec![(4000, 0)],
            vec![4001],
        ),
        (
            "the task joins when every consumer holds before the target round",
            with(vec![
                (rounds(3000, 7, None), block(None)),
                (worker("w2"), workers_tasks(&[4001])),
                (rounds(3000, 7, Some(8)), block(Some(8))),
                (rounds(3001, 6, Some(8)), block(None)),
            ]),
            vec![(4000, 0), (4001, 8)],
            vec![],
        ),
        (
            "a consumer already in the target round moves it later, exponentially",
            with(vec![
                (worker("w2"), workers_tasks(&[4001])), // target 1
                (rounds(3000, 0, Some(1)), block(Some(1))),
                (rounds(3001, 5, None), block(Some(7))), // 5 + 2: and 3000 must agree again
                (rounds(3000, 7, None), block(Some(11))), // 7 + 4
                (rounds(3000, 7, Some(11)), block(Some(11))),
                (rounds(3001, 9, Some(11)), block(None)),
            ]),
            vec![(4000, 0), (4001, 11)],
            vec![],
        ),
        (
            "pending tasks join one at a time, first in first out",
            with(vec![
                (worker("w2"), workers_tasks(&[4001])),
                (worker("w3"), workers_tasks(&[4002])),
                (rounds(3000, 0, Some(1)), block(Some(1))),
                (rounds(3001, 0, Some(1)), block(Some(1))), // 4001 joins; 4002 keeps target 1
            ]),
            vec![(4000, 0), (4001, 1)],
            vec![4002],
        ),
        (
            "a removed task leaves the rounds; its worker returns as a pending task",
            with(vec![
                (remove_task(4000), Outcome::TaskRemoved),
                (remove_task(4000), Outcome::TaskRemoved), // asked twice: a no-op
                (worker("w1"), workers_tasks(&[4001])),
            ]),
            vec![],
            vec![4001],
        ),
        (
            "only coordinated tasks can be removed",
            vec![
                (register(None, b"a"), registered("1000")),
                (worker("w1"), workers_tasks(&[])),
                (job("1000", ShardingPolicy::Off, None), job_id(5000)),
                (iteration(5000, 0), iter_client(2000, 3000)),
                (
                    remove_task(4000),
                    precondition("MaybeRemoveTask called on a non-round-robin task."),
                ),
                (remove_task(4999), not_found("Task 4999 not found")),
                (
                    rounds(3999, 0, None),
                    not_found("Iteration client id not found: 3999"),
                ),
            ],
            vec![(4000, 0)],
            vec![],
        ),
        (
            "a removed worker's pending task is dropped",
            with(vec![
                (worker("w2"), workers_tasks(&[4001])),
                (remove_worker("w2"), Outcome::WorkerRemoved),
            ]),
            vec![(4000, 0)],
            vec![],
        ),
        (
            "a named job asked for with other parameters says what differs",
            with(vec![(
                Update::GetOrCreateJob {
                    dataset_id: DatasetId("1000".into()),
                    sharding: ShardingPolicy::Dynamic,
                    job_name: Some("rr".into()),
                    anonymous_suffix: 7,
                    options: JobOptions {
                        num_consumers: None,
                        use_cross_trainer_cache: true,
                        target_workers: TargetWorkers::Local,
                    },
                },
                invalid(
                    "Tried to create job with name rr, but found an existing job with different \
                     parameters: Existing processing mode: <OFF>; got <DYNAMIC>. Existing \
                     cross-trainer cache: <disabled>; got <enabled>. Existing target workers: \
                     <AUTO>; got <LOCAL>. Existing number of consumers: <2>; got <none>. ",
                ),
            )]),
            vec![(4000, 0)],
            vec![],
        ),
    ];
    for (name, steps, want_tasks, want_pending) in cases {
        let state = run(name, steps);
        let it = state.iteration(IterationId(2000)).expect("iteration");
        let tasks: Vec<(u64, u64)> = state
            .tasks_of_iteration(it)
            .iter()
            .map(|t| (t.id.0, t.starting_round))
            .collect();
        let pending: Vec<u64> = it.pending_tasks.iter().map(|p| p.task_id.0).collect();
        assert_eq!(tasks, want_tasks, "case {name:?}: tasks");
        assert_eq!(pending, want_pending, "case {name:?}: pending tasks");
    }
}

#[test]
fn worker_index_resolution_table() {
    // (configured list, registrations in order with the index each gets or the refusal,
    //  the list afterwards)
    type Case = (
        &'static str,
        &'static [&'static str],
        Vec<(&'static str, Result<Option<u64>, String>)>,
        &'static [&'static str],
    );
    let refused = |addr: &str, list: &str| {
        Err(format!(
            "Failed to assign an index for worker {addr}. Configured workers list: [{list}]. The \
             worker's address is not configured, or other workers are already running at the \
             configured host. If your worker has restarted, make sure it runs at the same address \
             and port."
        ))
    };
    let cases: Vec<Case> = vec![
        (
            "no list: any worker, no index",
            &[],
            vec![("a:1", Ok(None)), ("b:2", Ok(None))],
            &[],
        ),
        (
            "exact entries give their positions, whatever the order of registration",
            &["a:1", "b:2", "c:3"],
            vec![
                ("c:3", Ok(Some(2))),
                ("a:1", Ok(Some(0))),
                ("b:2", Ok(Some(1))),
            ],
            &["a:1", "b:2", "c:3"],
        ),
        (
            "%port% entries are taken in order by workers of their host",
            &["h:%port%", "h:%port%", "g:%port%"],
            vec![
                ("g:7", Ok(Some(2))),
                ("h:9", Ok(Some(0))),
                ("h:8", Ok(Some(1))),
            ],
            &["h:9", "h:8", "g:7"],
        ),
        (
            "named ports and bare hosts take any port",
            &["h:%port_worker%", "h"],
            vec![("h:5", Ok(Some(0))), ("h:6", Ok(Some(1)))],
            &["h:5", "h:6"],
        ),
        (
            "a restarted worker at the same address keeps its entry",
            &["h:%port%", "h:%port%"],
            vec![
                ("h:5", Ok(Some(0))),
                ("h:6", Ok(Some(1))),
                ("h:5", Ok(Some(0))),
                ("h:6", Ok(Some(1))),
            ],
            &["h:5", "h:6"],
        ),
        (
            "more workers than entries of the host",
            &["localhost:%port%"],
            vec![
                ("localhost:5", Ok(Some(0))),
                ("localhost:6", refused("localhost:6", "localhost:5")),
            ],
            &["localhost:5"],
        ),
        (
            "an exact entry matches only its port",
            &["h:1"],
            vec![("h:2", refused("h:2", "h:1"))],
            &["h:1"],
        ),
        (
            "another host does not match",
            &["fake_worker_0", "fake_worker_1"],
            vec![(
                "localhost:5",
                refused("localhost:5", "fake_worker_0, fake_worker_1"),
            )],
            &["fake_worker_0", "fake_worker_1"],
        ),
        (
            "a named, non-placeholder port is not a placeholder",
            &["localhost:worker"],
            vec![("localhost:5", refused("localhost:5", "localhost:worker"))],
            &["localhost:worker"],
        ),
        (
            "an exact entry wins over an earlier placeholder of its host",
            &["h:%port%", "h:2"],
            vec![("h:2", Ok(Some(1))), ("h:1", Ok(Some(0)))],
            &["h:1", "h:2"],
        ),
        (
            "bracketed IPv6 hosts",
            &["[::1]:%port%"],
            vec![("[::1]:5", Ok(Some(0)))],
            &["[::1]:5"],
        ),
    ];
    for (name, list, registrations, after) in cases {
        let mut state = DispatcherState::default();
        for (addr, want) in registrations {
            let outcome = state.apply(
                ApplyContext::default(),
                &Request {
                    id: None,
                    update: static_worker(addr, list),
                },
            );
            let got = match outcome {
                Outcome::WorkerRegistered { .. } => Ok(state.worker_index(addr)),
                Outcome::Rejected(Rejection::FailedPrecondition(m)) => Err(m),
                other => panic!("case {name:?}: {addr}: {other:?}"),
            };
            assert_eq!(got, want, "case {name:?}: {addr}");
        }
        assert_eq!(state.static_workers(), after, "case {name:?}");
    }
}

#[test]
fn a_leader_with_another_worker_list_cannot_register_workers() {
    let a: &[&str] = &["h:%port%", "h:%port%"];
    run(
        "mismatched worker lists",
        vec![
            (static_worker("h:1", a), workers_tasks(&[])),
            (
                static_worker("h:2", &["h:%port%"]),
                precondition(
                    "this dispatcher is configured with worker addresses [h:%port%], but the \
                     cluster recorded [h:%port%, h:%port%] from the replica that first \
                     registered a worker; every dispatcher replica must run with the same \
                     --worker-addresses",
                ),
            ),
            (static_worker("h:2", a), workers_tasks(&[])),
        ],
    );
    // An empty list is a configuration too: a later leader cannot switch to a list.
    run(
        "no list, then a list",
        vec![
            (worker("h:1"), workers_tasks(&[])),
            (
                static_worker("h:2", &["h:%port%"]),
                precondition(
                    "this dispatcher is configured with worker addresses [h:%port%], but the \
                     cluster recorded [] from the replica that first registered a worker; every \
                     dispatcher replica must run with the same --worker-addresses",
                ),
            ),
        ],
    );
}

#[test]
fn worker_indices_survive_worker_removal_and_snapshots() {
    let list: &[&str] = &["h:%port%", "h:%port%", "h:%port%"];
    let state = run(
        "removal",
        vec![
            (static_worker("h:7", list), workers_tasks(&[])),
            (static_worker("h:8", list), workers_tasks(&[])),
            (remove_worker("h:7"), Outcome::WorkerRemoved),
            (static_worker("h:9", list), workers_tasks(&[])),
            (static_worker("h:7", list), workers_tasks(&[])),
        ],
    );
    assert_eq!(state.worker_index("h:7"), Some(0), "back at its entry");
    assert_eq!(state.worker_index("h:8"), Some(1));
    assert_eq!(
        state.worker_index("h:9"),
        Some(2),
        "did not take h:7's entry"
    );
    // A snapshot is the serialized state: a replica restored from it resolves the same.
    let restored: DispatcherState =
        sluice_journal::codec::decode(&sluice_journal::codec::encode(&state)).unwrap();
    assert_eq!(restored.static_workers(), state.static_workers());
}

/// Random scripts of valid and invalid updates (ids that exist and that do not, repetitions and
/// rounds up to `u64::MAX`), applied in lockstep to three states as three replicas apply one
/// log: `apply` never panics, the replicas agree on every outcome and on the final state, no
/// split of an iteration is leased twice, and a provider never leases an older repetition after
/// a newer one.
mod properties {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn any_round() -> impl Strategy<Value = u64> {
        prop_oneof![
            0..20u64,
            Just(super::super::dispatcher_state::MAX_ROUND),
            any::<u64>()
        ]
    }

    fn any_update() -> impl Strategy<Value = Update> {
        let worker_name = prop::sample::select(vec!["w1", "w2", "w3"]);
        prop_oneof![
            prop::sample::select(vec![&b"a"[..], &b"b"[..]]).prop_map(|d| register(None, d)),
            worker_name.clone().prop_map(worker),
            (
                prop::sample::select(vec!["1000", "1001", "404"]),
                prop::bool::ANY,
                prop::option::of(prop::sample::select(vec!["j", "k"])),
            )
                .prop_map(|(d, dynamic, name)| {
                    let sharding = if dynamic {
                        ShardingPolicy::Dynamic
                    } else {
                        ShardingPolicy::Off
                    };
                    job(d, sharding, name)
                }),
            (5000..5004u64, 0..3u64).prop_map(|(j, r)| iteration(j, r)),
            (
                2000..2004u64,
                4000..4008u64,
                prop_oneof![0..4u64, Just(u64::MAX - 1), Just(u64::MAX), any::<u64>()],
                prop_oneof![0..4u32, Just(u32::MAX)],
            )
                .prop_map(|(i, t, r, m)| lease(i, t, r, m)),
            (
                worker_name.clone(),
                prop::collection::vec(4000..4008u64, 0..3)
            )
                .prop_map(|(w, t)| finish(w, &t)),
            (3000..3006u64).prop_map(release),
            (3000..3006u64, any_round(), prop::option::of(any_round()))
                .prop_map(|(c, r, b)| rounds(c, r, b)),
            (4000..4008u64).prop_map(remove_task),
            worker_name.prop_map(remove_worker),
            (2000..2004u64).prop_map(gc),
            // Parts of the definitions "ab" and "ba" in any order, and their registrations
            // with a right or a wrong length.
            (
                prop::sample::select(vec![&b"ab"[..], &b"ba"[..]]),
                prop_oneof![0..3u64, Just(u64::MAX)],
                1..3usize,
            )
                .prop_map(|(def, offset, len)| {
                    let start = (offset as usize).min(def.len());
                    let end = (start + len).min(def.len());
                    stage(def, offset, &def[start..end])
                }),
            (prop::sample::select(vec![&b"ab"[..], &b"ba"[..]]), 1..4u64)
                .prop_map(|(def, len)| register_staged(None, def, len)),
            (
                prop_oneof![Just(0u64), 0..200u64, Just(u64::MAX)],
                prop_oneof![Just(0u64), 0..200u64, Just(u64::MAX)],
                prop::collection::vec(2000..2006u64, 0..3),
                prop::collection::vec(5000..5006u64, 0..3),
                prop::collection::vec(prop::sample::select(vec!["1000", "1001", "404"]), 0..2),
            )
                .prop_map(|(ib, db, its, jobs, datasets)| Update::RemoveIdle {
                    iterations_before: ib,
                    datasets_before: db,
                    iterations: its.into_iter().map(IterationId).collect(),
                    jobs: jobs.into_iter().map(JobId).collect(),
                    datasets: datasets.into_iter().map(|d| DatasetId(d.into())).collect(),
                }),
        ]
    }

    /// A step: an update, maybe with a request id of one of two requesters (seq and
    /// watermark small, so retries and stale requests happen), at a time that only grows.
    fn any_step() -> impl Strategy<Value = (Update, Option<RequestId>, u64)> {
        (
            any_update(),
            prop::option::of((0..2u64, 0..8u64, 0..8u64)),
            0..50u64,
        )
            .prop_map(|(update, id, dt)| {
                let id = id.map(|(requester, seq, watermark)| RequestId {
                    requester,
                    seq,
                    watermark,
                });
                (update, id, dt)
            })
    }

    fn apply(state: &mut DispatcherState, update: &Update) -> Outcome {
        apply_at(state, update, None, 0)
    }

    fn apply_at(
        state: &mut DispatcherState,
        update: &Update,
        id: Option<RequestId>,
        time_micros: u64,
    ) -> Outcome {
        state.apply(
            ApplyContext {
                log_index: 0,
                time_micros,
            },
            &Request {
                id,
                update: update.clone(),
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn replicas_agree_and_no_split_is_leased_twice(
            script in prop::collection::vec(any_step(), 1..150)
        ) {
            let mut replicas = [
                DispatcherState::default(),
                DispatcherState::default(),
                DispatcherState::default(),
            ];
            let mut leased: BTreeMap<u64, BTreeSet<(u64, u64)>> = BTreeMap::new();
            let mut newest: BTreeMap<u64, u64> = BTreeMap::new();
            // Two distributed_epoch iterations (2000, 2001) with tasks 4000-4003 to start from,
            // so that random leases often reach a cursor.
            let start = [
                register(None, b"a"),
                worker("w1"),
                worker("w2"),
                job("1000", ShardingPolicy::Dynamic, None),
                iteration(5000, 0),
                job("1000", ShardingPolicy::Dynamic, Some("j")),
                iteration(5001, 0),
            ];
            for update in &start {
                for replica in &mut replicas {
                    apply(replica, update);
                }
            }
            let mut time = 0;
            let mut answered: BTreeMap<(u64, u64), Outcome> = BTreeMap::new();
            for (update, id, dt) in &script {
                time += dt;
                let outcomes: Vec<Outcome> = replicas
                    .iter_mut()
                    .map(|s| apply_at(s, update, *id, time))
                    .collect();
                prop_assert_eq!(&outcomes[0], &outcomes[1]);
                prop_assert_eq!(&outcomes[0], &outcomes[2]);
                if let Err(broken) = replicas[0].check_invariants() {
                    prop_assert!(false, "after {:?}: {}", update, broken);
                }
                // A request id seen before is answered with its recorded outcome, or refused
                // (below the watermark): never applied again.
                if let Some(id) = id {
                    if let Some(first) = answered.get(&(id.requester, id.seq)) {
                        let refused = matches!(
                            &outcomes[0],
                            Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("watermark")
                        );
                        prop_assert!(
                            &outcomes[0] == first || refused,
                            "request {:?} answered {:?}, then {:?}", id, first, outcomes[0]
                        );
                        continue;
                    }
                    answered.insert((id.requester, id.seq), outcomes[0].clone());
                }
                let (Update::LeaseSplits(LeaseRequest { iteration_id, .. }), Outcome::Splits(lease)) =
                    (update, &outcomes[0])
                else {
                    continue;
                };
                if lease.end_of_splits {
                    continue;
                }
                let newest = newest.entry(iteration_id.0).or_insert(lease.repetition);
                prop_assert!(
                    lease.repetition >= *newest,
                    "iteration {} leased repetition {} after {}",
                    iteration_id.0,
                    lease.repetition,
                    newest
                );
                *newest = lease.repetition;
                let splits = leased.entry(iteration_id.0).or_default();
                for split in lease.start..lease.end {
                    prop_assert!(
                        splits.insert((lease.repetition, split)),
                        "split {} of repetition {} of iteration {} leased twice",
                        split,
                        lease.repetition,
                        iteration_id.0
                    );
                }
            }
            let states: Vec<String> = replicas.iter().map(|s| format!("{s:?}")).collect();
            prop_assert_eq!(&states[0], &states[1]);
            prop_assert_eq!(&states[0], &states[2]);
        }
    }
}

/// Definitions are encoded as one byte string; the bytes in the journal are the same as a
/// sequence of bytes would give, so journals written before decode unchanged.
#[test]
fn a_definition_encodes_as_the_same_bytes_as_a_sequence_of_bytes() {
    #[derive(serde::Serialize)]
    struct AsSequence {
        dataset_id: Option<DatasetId>,
        def: Vec<u8>,
    }
    let def: Vec<u8> = (0..=255).collect();
    let update = register(None, &def);
    let Update::RegisterDataset { dataset_id, .. } = &update else {
        unreachable!()
    };
    let sequence = sluice_journal::codec::encode(&AsSequence {
        dataset_id: dataset_id.clone(),
        def: def.clone(),
    });
    let encoded = sluice_journal::codec::encode(&update);
    // The codec's version byte, the variant's index (one byte), then the fields in order.
    assert_eq!(encoded[0], sequence[0]);
    assert!(encoded[2..].starts_with(&sequence[1..]));
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
