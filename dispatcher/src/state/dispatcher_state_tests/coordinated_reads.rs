//! Coordinated reads: consumers' rounds and pending tasks.

use super::*;

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

fn block(round: Option<u64>) -> Outcome {
    Outcome::Rounds { block_round: round }
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
