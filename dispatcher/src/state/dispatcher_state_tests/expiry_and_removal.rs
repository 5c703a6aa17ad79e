//! Workers removed, iterations garbage collected, and idle iterations, jobs and datasets removed.

use super::*;

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
/// When an iteration finishes as its workers are removed, by the dataset's cardinality: one of
/// infinite cardinality goes on while a worker lives and then waits for one, and a removed
/// worker's task never ends it; a finite or unknown one ends with the tasks of the workers left.
/// The same in distributed_epoch and parallel_epochs.
#[test]
fn infinite_iterations_outlive_their_workers_table() {
    use ShardingPolicy::*;
    const INF: i64 = DatasetMetadata::INFINITE;
    // The iteration 2000 has tasks 4000 on w1 and 4001 on w2.
    let start = |cardinality: i64, sharding: ShardingPolicy| {
        vec![
            (
                register_with_cardinality("d", b"a", cardinality),
                registered("d"),
            ),
            (worker("w1"), workers_tasks(&[])),
            (worker("w2"), workers_tasks(&[])),
            (job("d", sharding, None), job_id(5000)),
            (iteration(5000, 0), iter_client(2000, 3000)),
        ]
    };
    type Row = (&'static str, i64, Vec<(Update, Outcome)>, bool);
    let rows: Vec<Row> = vec![
        // (case, cardinality, steps after the start, finished after them)
        (
            "a removed worker's task leaves the other running",
            INF,
            vec![(remove_worker("w1"), Outcome::WorkerRemoved)],
            false,
        ),
        (
            "every worker removed: it waits, and a new worker gets a task",
            INF,
            vec![
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (remove_worker("w2"), Outcome::WorkerRemoved),
                (worker("w3"), workers_tasks(&[4002])),
                (worker("w1"), workers_tasks(&[4003])), // back: its task was dropped
            ],
            false,
        ),
        (
            "a dropped task keeps it open though every other task ended",
            INF,
            vec![
                (finish("w1", &[4000]), Outcome::TasksFinished),
                (remove_worker("w2"), Outcome::WorkerRemoved),
            ],
            false,
        ),
        (
            "a dropped task keeps it open though a new worker's task ended too",
            INF,
            vec![
                (remove_worker("w2"), Outcome::WorkerRemoved),
                (worker("w3"), workers_tasks(&[4002])),
                (finish("w1", &[4000]), Outcome::TasksFinished),
                (finish("w3", &[4002]), Outcome::TasksFinished),
            ],
            false,
        ),
        (
            "every task reached its end: it is over",
            INF,
            vec![
                (finish("w1", &[4000]), Outcome::TasksFinished),
                (finish("w2", &[4001]), Outcome::TasksFinished),
            ],
            true,
        ),
        (
            "finite: it ends with the tasks of the workers left",
            10,
            vec![
                (finish("w1", &[4000]), Outcome::TasksFinished),
                (remove_worker("w2"), Outcome::WorkerRemoved),
            ],
            true,
        ),
        (
            "unknown cardinality: as finite",
            -2,
            vec![
                (remove_worker("w2"), Outcome::WorkerRemoved),
                (finish("w1", &[4000]), Outcome::TasksFinished),
            ],
            true,
        ),
        (
            "finite, every worker removed: it waits for one",
            10,
            vec![
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (remove_worker("w2"), Outcome::WorkerRemoved),
            ],
            false,
        ),
    ];
    for sharding in [Dynamic, Off] {
        for (case, cardinality, steps, want) in &rows {
            let name = format!("{sharding:?}: {case}");
            let mut script = start(*cardinality, sharding);
            script.extend(steps.iter().cloned());
            let state = run(&name, script);
            let it = state
                .iteration(IterationId(2000))
                .expect("iteration exists");
            assert_eq!(it.finished, *want, "case {name:?}");
        }
    }
}

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
