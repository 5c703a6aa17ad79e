//! Tasks that crashed their worker: their iterations fail once, and no worker gets them again.

use super::*;

fn crashed(worker: &str, tasks: &[u64]) -> Update {
    Update::FailCrashedTasks {
        worker: worker.into(),
        task_ids: tasks.iter().map(|t| TaskId(*t)).collect(),
        signal: "SIGABRT".into(),
    }
}

fn failed(iterations: &[u64]) -> Outcome {
    Outcome::IterationsFailed {
        iterations: iterations.iter().map(|i| IterationId(*i)).collect(),
    }
}

/// The first steps of every case: a dataset, workers `w1` and `w2`, and one parallel_epochs
/// iteration 2000 with tasks 4000 (w1) and 4001 (w2).
fn two_workers_reading() -> Vec<(Update, Outcome)> {
    vec![
        (register(None, b"a"), registered("1000")),
        (worker("w1"), workers_tasks(&[])),
        (worker("w2"), workers_tasks(&[])),
        (job("1000", ShardingPolicy::Off, Some("j")), job_id(5000)),
        (iteration(5000, 0), iter_client(2000, 3000)),
    ]
}

#[test]
fn crash_report_table() {
    // (name, steps after `two_workers_reading`, the iteration's failure afterwards)
    type Case = (&'static str, Vec<(Update, Outcome)>, Option<&'static str>);
    let message = "task 4000 of iteration 2000 crashed worker w1 (signal SIGABRT); the iteration \
                   is failed rather than run on another worker";
    let cases: Vec<Case> = vec![
        (
            "a crash fails the iteration; neither the restarted nor a new worker gets a task",
            vec![
                (crashed("w1", &[4000]), failed(&[2000])),
                (worker("w1"), workers_tasks(&[])),
                (worker("w3"), workers_tasks(&[])),
            ],
            Some(message),
        ),
        (
            "reported after the worker was removed, the crash still fails the iteration",
            vec![
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (crashed("w1", &[4000]), failed(&[2000])),
                (worker("w1"), workers_tasks(&[])),
            ],
            Some(message),
        ),
        (
            "reported twice (a retry), the iteration fails once",
            vec![
                (crashed("w1", &[4000]), failed(&[2000])),
                (crashed("w1", &[4000]), failed(&[])),
            ],
            Some(message),
        ),
        (
            "another worker's task, an unknown task: ignored",
            vec![
                (crashed("w1", &[4001, 4999]), failed(&[])),
                (worker("w3"), workers_tasks(&[4002])),
            ],
            None,
        ),
        (
            "a finished iteration is not failed",
            vec![
                (finish("w1", &[4000]), Outcome::TasksFinished),
                (finish("w2", &[4001]), Outcome::TasksFinished),
                (crashed("w1", &[4000]), failed(&[])),
            ],
            None,
        ),
    ];
    for (name, steps, want) in cases {
        let mut script = two_workers_reading();
        script.extend(steps);
        let state = run(name, script);
        assert!(
            state.iteration(IterationId(2000)).is_some(),
            "case {name:?}"
        );
        assert_eq!(
            state.iteration_failure(IterationId(2000)),
            want,
            "case {name:?}"
        );
        if want.is_some() {
            for worker in ["w1", "w2", "w3"] {
                assert!(
                    state.active_tasks_of_worker(worker).is_empty(),
                    "case {name:?}: {worker} still runs a task of the failed iteration"
                );
            }
        }
    }
}
