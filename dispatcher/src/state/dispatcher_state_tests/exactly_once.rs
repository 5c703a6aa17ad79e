//! Exactly-once lineages: leases and deliveries recorded, tasks moving when their worker is
//! removed or restarts, and taken over once every client let go.

use super::*;
use crate::state::lineage::{DeliveryReport, RecordedLease};
use sluice_types::{Delivery, IndexRuns};

fn job_delivering(sharding: ShardingPolicy, name: Option<&str>, delivery: Delivery) -> Update {
    Update::GetOrCreateJobWithDelivery {
        dataset_id: DatasetId("1000".into()),
        sharding,
        job_name: name.map(Into::into),
        anonymous_suffix: 7,
        options: JobOptions::default(),
        delivery,
    }
}
fn report(client: u64, task: u64, runs: &[(u64, u64)], released: bool) -> Update {
    Update::ReportDelivered {
        client_id: ClientId(client),
        reports: vec![DeliveryReport {
            task_id: TaskId(task),
            runs: runs.to_vec(),
            released,
        }],
    }
}
fn incarnation(address: &str, incarnation: u64) -> Update {
    Update::WorkerIncarnation {
        address: address.into(),
        incarnation,
    }
}
fn restarted(moved: &[u64]) -> Outcome {
    Outcome::WorkerRestarted {
        moved: moved.iter().map(|t| TaskId(*t)).collect(),
    }
}
fn recorded() -> Outcome {
    Outcome::DeliveryRecorded
}

/// A dataset of 3 splits, workers w1 and w2, an exactly-once distributed_epoch job "j" and its
/// iteration 2000 with client 3000: task 4000 on w1, 4001 on w2; 4000 leased splits [0, 2).
fn two_workers_reading() -> Vec<(Update, Outcome)> {
    vec![
        (register(None, b"a"), registered("1000")),
        (worker("w1"), workers_tasks(&[])),
        (worker("w2"), workers_tasks(&[])),
        (
            job_delivering(ShardingPolicy::Dynamic, Some("j"), Delivery::ExactlyOnce),
            job_id(5000),
        ),
        (iteration(5000, 0), iter_client(2000, 3000)),
        (lease(2000, 4000, 0, 2), splits(0, 0, 2)),
    ]
}

/// An unfinished task with a lineage: (task, its worker, leases to replay, indices to skip).
pub(super) type Running = (u64, String, Vec<RecordedLease>, Vec<(u64, u64)>);

/// The unfinished tasks of `iteration` that run a lineage, as [`Running`].
pub(super) fn running_lineages(state: &DispatcherState, iteration: u64) -> Vec<Running> {
    let iteration = state.iteration(IterationId(iteration)).expect("iteration");
    iteration
        .tasks
        .iter()
        .filter_map(|t| {
            let task = state.task(*t)?;
            if task.finished {
                return None;
            }
            let (leases, skip) = state.replay_of(*t)?;
            Some((
                t.0,
                task.worker.clone(),
                leases.to_vec(),
                skip.iter().collect(),
            ))
        })
        .collect()
}
/// The same, as a table writes it.
type Listed = (u64, &'static str, Vec<RecordedLease>, &'static [(u64, u64)]);
type Case = (&'static str, Vec<(Update, Outcome)>, Expect);

/// What a case expects at its end.
struct Expect {
    /// The client's tasks to let go of.
    to_release: &'static [u64],
    /// Unfinished tasks with a lineage: (task, its worker, leases to replay, indices to skip).
    lineages: Vec<Listed>,
    finished: bool,
}

fn leased(repetition: u64, start: u64, end: u64) -> RecordedLease {
    leased_of(0, repetition, start, end)
}
fn leased_of(provider: u32, repetition: u64, start: u64, end: u64) -> RecordedLease {
    RecordedLease {
        provider,
        repetition,
        start,
        end,
    }
}

#[test]
fn lineage_table() {
    let cases: Vec<Case> = vec![
        (
            "leases and deliveries are recorded on the lineage",
            vec![(report(3000, 4000, &[(0, 5), (7, 9)], false), recorded())],
            Expect {
                to_release: &[],
                lineages: vec![
                    (4000, "w1", vec![leased(0, 0, 2)], &[(0, 5), (7, 9)]),
                    (4001, "w2", vec![], &[]),
                ],
                finished: false,
            },
        ),
        (
            "a removed worker's task waits for the client to let go, not ending the iteration",
            vec![
                (finish("w2", &[4001]), Outcome::TasksFinished),
                (remove_worker("w1"), Outcome::WorkerRemoved),
            ],
            Expect {
                to_release: &[4000],
                lineages: vec![],
                finished: false,
            },
        ),
        (
            "once the client let go, another worker takes the stream over where it stands",
            vec![
                (report(3000, 4000, &[(0, 3)], false), recorded()),
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (lease(2000, 4000, 0, 2), precondition("Task 4000 of iteration 2000 was dropped (its worker was removed or its iteration collected); it gets no more splits")),
                (report(3000, 4000, &[(3, 4), (6, 8)], true), recorded()),
                (lease(2000, 4002, 0, 1), splits(0, 2, 3)),
            ],
            Expect {
                to_release: &[],
                lineages: vec![
                    (4001, "w2", vec![], &[]),
                    (4002, "w2", vec![leased(0, 0, 2), leased(0, 2, 3)], &[(0, 4), (6, 8)]),
                ],
                finished: false,
            },
        ),
        (
            "a client that leaves lets go of everything",
            vec![
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (release(3000), Outcome::ClientReleased),
            ],
            Expect {
                to_release: &[],
                lineages: vec![
                    (4001, "w2", vec![], &[]),
                    (4002, "w2", vec![leased(0, 0, 2)], &[]),
                ],
                finished: false,
            },
        ),
        (
            "with no worker left the streams wait, and the next worker to register takes them",
            vec![
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (remove_worker("w2"), Outcome::WorkerRemoved),
                (report(3000, 4000, &[(0, 1)], true), recorded()),
                (report(3000, 4001, &[], true), recorded()),
                (worker("w3"), workers_tasks(&[4002])),
            ],
            Expect {
                to_release: &[],
                lineages: vec![
                    (4002, "w3", vec![], &[]),
                    (4003, "w3", vec![leased(0, 0, 2)], &[(0, 1)]),
                    (4004, "w3", vec![], &[]),
                ],
                finished: false,
            },
        ),
        (
            "the iteration finishes when the task that took the stream over finishes",
            vec![
                (finish("w2", &[4001]), Outcome::TasksFinished),
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (report(3000, 4000, &[], true), recorded()),
                (finish("w2", &[4002]), Outcome::TasksFinished),
            ],
            Expect {
                to_release: &[],
                lineages: vec![],
                finished: true,
            },
        ),
        (
            "a restarted worker's streams move; the same process again moves nothing",
            vec![
                (incarnation("w1", 11), restarted(&[])),
                (incarnation("w1", 11), restarted(&[])),
                (incarnation("w1", 12), restarted(&[4000])),
                (incarnation("w1", 12), restarted(&[])),
                (incarnation("nobody", 1), restarted(&[])),
            ],
            Expect {
                to_release: &[4000],
                lineages: vec![(4001, "w2", vec![], &[])],
                finished: false,
            },
        ),
        (
            "bad reports are refused and change nothing",
            vec![
                (report(3000, 4000, &[(5, 5)], false), invalid("the delivery report of task 4000 has an empty or reversed run [5, 5)")),
                (report(3000, 4000, &[(9, 2)], false), invalid("the delivery report of task 4000 has an empty or reversed run [9, 2)")),
                (report(3999, 4000, &[(0, 1)], false), not_found("Iteration client id not found: 3999")),
                (report(3000, 9999, &[(0, 1)], true), recorded()),
            ],
            Expect {
                to_release: &[],
                lineages: vec![
                    (4000, "w1", vec![leased(0, 0, 2)], &[]),
                    (4001, "w2", vec![], &[]),
                ],
                finished: false,
            },
        ),
    ];
    for (name, steps, expect) in cases {
        let mut all = two_workers_reading();
        all.extend(steps);
        let state = run(name, all);
        let to_release: Vec<u64> = state
            .tasks_to_release(ClientId(3000))
            .into_iter()
            .map(|t| t.0)
            .collect();
        assert_eq!(to_release, expect.to_release, "{name}: tasks to release");
        let iteration = state.iteration(IterationId(2000)).expect("iteration");
        let running: Vec<Running> = running_lineages(&state, 2000);
        let want: Vec<Running> = expect
            .lineages
            .into_iter()
            .map(|(t, w, l, s)| (t, w.to_string(), l, s.to_vec()))
            .collect();
        assert_eq!(running, want, "{name}: lineages");
        assert_eq!(iteration.finished, expect.finished, "{name}: finished");
    }
}

/// `two_workers_reading` with a definition of two split providers (3 and 4 splits, as
/// `zip(range(3), range(4))`): task 4000 leased provider 0's [0, 2), provider 1's [0, 1) and
/// provider 0's [2, 3), in that order.
fn two_providers_reading() -> Vec<(Update, Outcome)> {
    vec![
        (register_providers(b"zip", &[3, 4]), registered("1000")),
        (worker("w1"), workers_tasks(&[])),
        (worker("w2"), workers_tasks(&[])),
        (
            job_delivering(ShardingPolicy::Dynamic, Some("j"), Delivery::ExactlyOnce),
            job_id(5000),
        ),
        (iteration(5000, 0), iter_client(2000, 3000)),
        (lease_of(2000, 4000, 0, 0, 2), splits(0, 0, 2)),
        (lease_of(2000, 4000, 1, 0, 1), splits(0, 0, 1)),
        (lease_of(2000, 4000, 0, 0, 2), splits(0, 2, 3)),
    ]
}

#[test]
fn lineages_record_the_provider_of_each_lease() {
    let base = || {
        vec![
            leased_of(0, 0, 0, 2),
            leased_of(1, 0, 0, 1),
            leased_of(0, 0, 2, 3),
        ]
    };
    let cases: Vec<Case> = vec![
        (
            "each lease is recorded with its provider, in the order granted",
            vec![],
            Expect {
                to_release: &[],
                lineages: vec![(4000, "w1", base(), &[]), (4001, "w2", vec![], &[])],
                finished: false,
            },
        ),
        (
            "the task taking the stream over gets every provider's leases, then leases on",
            vec![
                (report(3000, 4000, &[(0, 2)], false), recorded()),
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (report(3000, 4000, &[], true), recorded()),
                (lease_of(2000, 4002, 1, 0, 2), splits(0, 1, 3)),
            ],
            Expect {
                to_release: &[],
                lineages: vec![
                    (4001, "w2", vec![], &[]),
                    (
                        4002,
                        "w2",
                        [base(), vec![leased_of(1, 0, 1, 3)]].concat(),
                        &[(0, 2)],
                    ),
                ],
                finished: false,
            },
        ),
        (
            "each provider moves through its repetitions on its own",
            vec![
                (lease_of(2000, 4000, 0, 0, 2), end_of_splits(0)),
                (lease_of(2000, 4001, 0, 1, 2), splits(1, 0, 2)),
                (lease_of(2000, 4000, 1, 0, 2), splits(0, 1, 3)),
                (lease_of(2000, 4000, 1, 2, 1), invalid("split repetition 2 is beyond the provider's next repetition (it is in repetition 0)")),
            ],
            Expect {
                to_release: &[],
                lineages: vec![
                    (4000, "w1", [base(), vec![leased_of(1, 0, 1, 3)]].concat(), &[]),
                    (4001, "w2", vec![leased_of(0, 1, 0, 2)], &[]),
                ],
                finished: false,
            },
        ),
        (
            "a provider past the definition's is refused and records nothing",
            vec![
                (lease_of(2000, 4000, 2, 0, 1), invalid("split provider index 2 out of range: iteration 2000 has 2")),
                (lease_of(2000, 4000, u32::MAX, u64::MAX, u32::MAX), invalid("split provider index 4294967295 out of range: iteration 2000 has 2")),
            ],
            Expect {
                to_release: &[],
                lineages: vec![(4000, "w1", base(), &[]), (4001, "w2", vec![], &[])],
                finished: false,
            },
        ),
    ];
    for (name, steps, expect) in cases {
        let mut all = two_providers_reading();
        all.extend(steps);
        let state = run(name, all);
        state.check_invariants().expect(name);
        let to_release: Vec<u64> = state
            .tasks_to_release(ClientId(3000))
            .into_iter()
            .map(|t| t.0)
            .collect();
        assert_eq!(to_release, expect.to_release, "{name}: tasks to release");
        let want: Vec<Running> = expect
            .lineages
            .into_iter()
            .map(|(t, w, l, s)| (t, w.to_string(), l, s.to_vec()))
            .collect();
        assert_eq!(running_lineages(&state, 2000), want, "{name}: lineages");
        // A snapshot keeps the providers: decoded, the state replays the same leases.
        let decoded: DispatcherState =
            sluice_journal::codec::decode(&sluice_journal::codec::encode(&state)).expect(name);
        assert_eq!(
            running_lineages(&decoded, 2000),
            want,
            "{name}: decoded lineages"
        );
    }
}

#[test]
fn reports_from_another_iteration_are_refused() {
    let mut steps = two_workers_reading();
    steps.extend([
        (
            job_delivering(ShardingPolicy::Dynamic, Some("k"), Delivery::ExactlyOnce),
            job_id(5001),
        ),
        (iteration(5001, 0), iter_client(2001, 3001)),
        (
            report(3001, 4000, &[(0, 10)], true),
            invalid("task 4000 is not a task of iteration 2001, which client 3001 reads"),
        ),
    ]);
    let state = run("another iteration", steps);
    assert_eq!(
        state.replay_of(TaskId(4000)).map(|(_, s)| s.clone()),
        Some(IndexRuns::new())
    );
}

#[test]
fn delivery_applies_where_it_means_something_and_a_named_job_keeps_its_own() {
    // (sharding, delivery asked) -> whether the job delivers exactly once
    let cases = [
        (
            ShardingPolicy::Dynamic,
            Delivery::ExactlyOnce,
            Delivery::ExactlyOnce,
        ),
        (
            ShardingPolicy::Dynamic,
            Delivery::AtMostOnce,
            Delivery::AtMostOnce,
        ),
        (
            ShardingPolicy::File,
            Delivery::ExactlyOnce,
            Delivery::ExactlyOnce,
        ),
        (
            ShardingPolicy::Off,
            Delivery::ExactlyOnce,
            Delivery::AtMostOnce,
        ),
    ];
    for (sharding, asked, want) in cases {
        let state = run(
            "delivery",
            vec![
                (register(None, b"a"), registered("1000")),
                (job_delivering(sharding, Some("j"), asked), job_id(5000)),
            ],
        );
        assert_eq!(
            state.job_delivery(JobId(5000)),
            want,
            "{sharding:?} {asked:?}"
        );
    }
    run(
        "a named job asked for with another delivery",
        vec![
            (register(None, b"a"), registered("1000")),
            (
                job_delivering(ShardingPolicy::Dynamic, Some("j"), Delivery::ExactlyOnce),
                job_id(5000),
            ),
            (
                job_delivering(ShardingPolicy::Dynamic, Some("j"), Delivery::AtMostOnce),
                invalid("Tried to create job with name j, but found an existing job with different parameters: Existing delivery: <exactly_once>; got <at_most_once>. "),
            ),
            (
                job_delivering(ShardingPolicy::Dynamic, Some("j"), Delivery::ExactlyOnce),
                job_id(5000),
            ),
        ],
    );
}

#[test]
fn an_at_most_once_job_drops_a_removed_workers_task_as_before() {
    let state = run(
        "at most once",
        vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (worker("w2"), workers_tasks(&[])),
            (
                job_delivering(ShardingPolicy::Dynamic, Some("j"), Delivery::AtMostOnce),
                job_id(5000),
            ),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (remove_worker("w1"), Outcome::WorkerRemoved),
        ],
    );
    assert!(state.tasks_to_release(ClientId(3000)).is_empty());
    assert!(state.replay_of(TaskId(4000)).is_none());
    assert_eq!(state.iteration(IterationId(2000)).unwrap().tasks.len(), 2);
}

#[test]
fn a_static_shard_moves_and_its_worker_coming_back_does_not_read_it_again() {
    let list = ["w1", "w2"];
    let state = run(
        "static shard",
        vec![
            (register(None, b"a"), registered("1000")),
            (static_worker("w1", &list), workers_tasks(&[])),
            (static_worker("w2", &list), workers_tasks(&[])),
            (
                job_delivering(ShardingPolicy::File, Some("j"), Delivery::ExactlyOnce),
                job_id(5000),
            ),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (remove_worker("w1"), Outcome::WorkerRemoved),
            (report(3000, 4000, &[(0, 2)], true), recorded()),
            // w1 is back: its shard is read by task 4002 on w2, so it gets no task.
            (static_worker("w1", &list), workers_tasks(&[])),
        ],
    );
    let moved = state.task(TaskId(4002)).expect("the moved task");
    assert_eq!(moved.worker, "w2");
    assert_eq!(state.shard_worker_of(TaskId(4002), "w2"), "w1");
    assert_eq!(
        state.worker_index(state.shard_worker_of(TaskId(4002), "w2")),
        Some(0)
    );
}
