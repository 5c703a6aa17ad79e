//! Readers' states: a state records what its reader took in the checkpoint at its step; a
//! restore creates an iteration from the checkpoint (or joins the one another reader of the
//! same step restored), superseding the iteration under the job's name.

use super::exactly_once::running_lineages;
use super::*;
use crate::state::dispatcher_state::definition_key;
use crate::state::lineage::RecordedLease;
use crate::state::{CHECKPOINTS_KEPT, MAX_CHECKPOINTS};
use sluice_journal::codec::encode;
use sluice_types::Delivery;

fn exactly_once_job(name: &str) -> Update {
    Update::GetOrCreateJobWithDelivery {
        dataset_id: DatasetId("1000".into()),
        sharding: ShardingPolicy::Dynamic,
        job_name: Some(name.into()),
        anonymous_suffix: 7,
        options: JobOptions::default(),
        delivery: Delivery::ExactlyOnce,
    }
}
fn save(
    client: u64,
    reader: &str,
    step: u64,
    base: Option<u64>,
    taken: &[(u64, &[(u64, u64)])],
) -> Update {
    Update::SaveCheckpoint {
        client_id: ClientId(client),
        reader: reader.into(),
        step,
        base_step: base,
        taken: taken
            .iter()
            .map(|(t, runs)| (TaskId(*t), runs.to_vec()))
            .collect(),
    }
}
fn saved(job: &str) -> Outcome {
    Outcome::CheckpointSaved {
        job_name: job.into(),
        repetition: 0,
        definition: definition_key(b"a"),
    }
}
fn resume(job: u64, step: u64, reader: &str) -> Update {
    Update::ResumeIteration {
        job_id: JobId(job),
        repetition: 0,
        step,
        reader: reader.into(),
    }
}
fn leased(start: u64, end: u64) -> RecordedLease {
    RecordedLease {
        provider: 0,
        repetition: 0,
        start,
        end,
    }
}

/// A dataset of 3 splits, workers w1 and w2, an exactly-once distributed_epoch job "j" and its
/// iteration 2000 with client 3000: task 4000 on w1, 4001 on w2; 4000 leased splits [0, 2).
fn reading() -> Vec<(Update, Outcome)> {
    vec![
        (register(None, b"a"), registered("1000")),
        (worker("w1"), workers_tasks(&[])),
        (worker("w2"), workers_tasks(&[])),
        (exactly_once_job("j"), job_id(5000)),
        (iteration(5000, 0), iter_client(2000, 3000)),
        (lease(2000, 4000, 0, 2), splits(0, 0, 2)),
    ]
}

/// A checkpoint's lineages as (first task, leases, taken runs).
type Saved = Vec<(u64, Vec<RecordedLease>, Vec<(u64, u64)>)>;
/// (name, steps after `reading`, the checkpoint's step, its lineages)
type SavedCase = (&'static str, Vec<(Update, Outcome)>, u64, Saved);

fn lineages_of(state: &DispatcherState, step: u64) -> Saved {
    let checkpoint = state.checkpoint("j", 0, step).expect("checkpoint kept");
    checkpoint
        .lineages
        .iter()
        .map(|(key, l)| (key.1 .0, l.leases.clone(), l.taken.iter().collect()))
        .collect()
}

#[test]
fn states_add_what_their_readers_took_to_the_checkpoint_of_their_step() {
    let cases: Vec<SavedCase> = vec![
        (
            "a state records every lineage's leases and what the reader took",
            vec![(save(3000, "r1", 5, None, &[(4000, &[(0, 5)])]), saved("j"))],
            5,
            vec![
                (4000, vec![leased(0, 2)], vec![(0, 5)]),
                (4001, vec![], vec![]),
            ],
        ),
        (
            "readers at the same step add up",
            vec![
                (iteration(5000, 0), iter_client(2000, 3001)),
                (
                    save(3000, "r1", 5, None, &[(4000, &[(0, 3)]), (4001, &[(0, 2)])]),
                    saved("j"),
                ),
                (save(3001, "r2", 5, None, &[(4000, &[(3, 6)])]), saved("j")),
            ],
            5,
            vec![
                (4000, vec![leased(0, 2)], vec![(0, 6)]),
                (4001, vec![], vec![(0, 2)]),
            ],
        ),
        (
            "a later state adds what was taken since the state it names as its base",
            vec![
                (save(3000, "r1", 5, None, &[(4000, &[(0, 5)])]), saved("j")),
                (lease(2000, 4001, 0, 1), splits(0, 2, 3)),
                (
                    save(3000, "r1", 9, Some(5), &[(4001, &[(0, 4)])]),
                    saved("j"),
                ),
            ],
            9,
            vec![
                (4000, vec![leased(0, 2)], vec![(0, 5)]),
                (4001, vec![leased(2, 3)], vec![(0, 4)]),
            ],
        ),
        (
            "a state taken again at the same step changes nothing",
            vec![
                (save(3000, "r1", 5, None, &[(4000, &[(0, 5)])]), saved("j")),
                (save(3000, "r1", 5, Some(5), &[]), saved("j")),
            ],
            5,
            vec![
                (4000, vec![leased(0, 2)], vec![(0, 5)]),
                (4001, vec![], vec![]),
            ],
        ),
    ];
    for (name, steps, step, want) in cases {
        let mut all = reading();
        all.extend(steps);
        let state = run(name, all);
        assert_eq!(lineages_of(&state, step), want, "{name}");
        state.check_invariants().expect(name);
    }
}

#[test]
fn states_that_cannot_be_taken_are_refused_and_change_nothing() {
    let cases: Vec<(&str, Update, Outcome)> = vec![
        (
            "an unknown client",
            save(3999, "r1", 5, None, &[]),
            not_found("Iteration client id not found: 3999"),
        ),
        (
            "no reader name",
            save(3000, "", 5, None, &[]),
            invalid("a reader's name must have 1 to 256 bytes; got 0"),
        ),
        (
            "a base no checkpoint is kept for",
            save(3000, "r1", 9, Some(5), &[]),
            precondition(
                "the state this reader took at step 5 of job 'j' is no longer kept (the \
                 dispatcher keeps the last 16 of each job): take states at the same steps on \
                 every reader",
            ),
        ),
        (
            "a task of no lineage",
            save(3000, "r1", 5, None, &[(4999, &[(0, 1)])]),
            invalid("task 4999 is not a task of iteration 2000, which client 3000 reads"),
        ),
        (
            "a reversed run",
            save(3000, "r1", 5, None, &[(4000, &[(4, 2)])]),
            invalid("the state's runs of task 4000 include an empty or reversed run [4, 2)"),
        ),
        (
            "an unknown step to restore from",
            resume(5000, 7, "r1"),
            not_found(
                "no state of job 'j' at step 7 of epoch 0 is kept (the dispatcher keeps the \
                 last 16 of each job)",
            ),
        ),
    ];
    for (name, update, want) in cases {
        let mut all = reading();
        let before = run(name, all.clone());
        all.push((update, want));
        let after = run(name, all);
        assert_eq!(
            encode(&after),
            encode(&before),
            "{name}: a refused update changed the state"
        );
    }
}

#[test]
fn an_at_most_once_job_takes_no_state() {
    let state = run(
        "at most once",
        vec![
            (register(None, b"a"), registered("1000")),
            (worker("w1"), workers_tasks(&[])),
            (
                job("1000", ShardingPolicy::Dynamic, Some("j")),
                job_id(5000),
            ),
            (iteration(5000, 0), iter_client(2000, 3000)),
            (
                save(3000, "r1", 5, None, &[]),
                precondition(
                    "job 'j' delivers at most once: a reader's state needs exactly-once \
                     delivery (distributed_epoch or static sharding, without coordinated reads \
                     or a cross-trainer cache)",
                ),
            ),
            (
                resume(5000, 5, "r1"),
                precondition(
                    "job 'j' delivers at most once: only an exactly-once job resumes from a \
                     reader's state",
                ),
            ),
        ],
    );
    state.check_invariants().expect("invariants");
}

#[test]
fn a_restore_supersedes_the_iteration_and_replays_the_checkpoints_lineages() {
    let mut steps = reading();
    steps.extend([
        (save(3000, "r1", 5, None, &[(4000, &[(0, 5)])]), saved("j")),
        // Read on after the state: a lease and elements the restore must give again.
        (lease(2000, 4001, 0, 1), splits(0, 2, 3)),
        // Two lineages restored (placeholders 4002, 4003), a fresh task per worker (4004,
        // 4005), then the lineages on the least loaded workers (4006, 4007).
        (resume(5000, 5, "r1"), iter_client(2001, 3001)),
    ]);
    let state = run("restore", steps.clone());
    state.check_invariants().expect("invariants");
    assert!(state
        .iteration_failure(IterationId(2000))
        .is_some_and(|f| f.contains("was superseded")));
    assert_eq!(
        running_lineages(&state, 2001),
        vec![
            (4004, "w1".into(), vec![], vec![]),
            (4005, "w2".into(), vec![], vec![]),
            (4006, "w1".into(), vec![leased(0, 2)], vec![(0, 5)]),
            (4007, "w2".into(), vec![], vec![]),
        ]
    );
    // The cursor goes on from the checkpoint's: split 2, leased after it, is leased again.
    steps.push((lease(2001, 4004, 0, 4), splits(0, 2, 3)));
    // Another reader of the same step joins, also once the restored iteration finished; the
    // same reader again restores anew.
    steps.push((finish("w1", &[4004, 4006]), Outcome::TasksFinished));
    steps.push((finish("w2", &[4005, 4007]), Outcome::TasksFinished));
    steps.push((resume(5000, 5, "r2"), iter_client(2001, 3002)));
    steps.push((resume(5000, 5, "r1"), iter_client(2002, 3003)));
    let state = run("restore, join, restore again", steps.clone());
    state.check_invariants().expect("invariants");
    // It had finished: its readers read to its end, nothing fails them.
    assert_eq!(state.iteration_failure(IterationId(2001)), None);
    assert_eq!(
        running_lineages(&state, 2002)
            .into_iter()
            .filter(|(_, _, leases, _)| !leases.is_empty())
            .map(|(_, _, leases, skip)| (leases, skip))
            .collect::<Vec<_>>(),
        vec![(vec![leased(0, 2)], vec![(0, 5)])]
    );
    // A state taken in the restored iteration includes what was taken before the restore.
    let mut later = steps;
    let restored_task = running_lineages(&run("", later.clone()), 2002)
        .into_iter()
        .find(|(_, _, leases, _)| !leases.is_empty())
        .expect("a restored lineage")
        .0;
    later.push((
        save(3003, "r3", 8, None, &[(restored_task, &[(5, 8)])]),
        saved("j"),
    ));
    let state = run("a state after a restore", later);
    let taken: Vec<Vec<(u64, u64)>> = lineages_of(&state, 8)
        .into_iter()
        .map(|(_, _, taken)| taken)
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(taken, vec![vec![(0, 8)]]);
}

#[test]
fn a_restore_keeps_each_providers_leases_and_cursor() {
    let leased_of = |provider, start, end| RecordedLease {
        provider,
        repetition: 0,
        start,
        end,
    };
    // A definition of two providers (3 and 4 splits): 4000 leased provider 1's [0, 2), then
    // provider 0's [0, 1).
    let mut steps = vec![
        (register_providers(b"a", &[3, 4]), registered("1000")),
        (worker("w1"), workers_tasks(&[])),
        (worker("w2"), workers_tasks(&[])),
        (exactly_once_job("j"), job_id(5000)),
        (iteration(5000, 0), iter_client(2000, 3000)),
        (lease_of(2000, 4000, 1, 0, 2), splits(0, 0, 2)),
        (lease_of(2000, 4000, 0, 0, 1), splits(0, 0, 1)),
        (save(3000, "r1", 2, None, &[(4000, &[(0, 2)])]), saved("j")),
        // After the state: leases of both providers the restore must hand out again.
        (lease_of(2000, 4001, 1, 0, 1), splits(0, 2, 3)),
        (lease_of(2000, 4001, 0, 0, 1), splits(0, 1, 2)),
        (resume(5000, 2, "r1"), iter_client(2001, 3001)),
    ];
    let state = run("restore of two providers", steps.clone());
    state.check_invariants().expect("invariants");
    let recorded = vec![leased_of(1, 0, 2), leased_of(0, 0, 1)];
    assert_eq!(
        lineages_of(&state, 2),
        vec![
            (4000, recorded.clone(), vec![(0, 2)]),
            (4001, vec![], vec![])
        ]
    );
    assert_eq!(
        running_lineages(&state, 2001)
            .into_iter()
            .filter(|(_, _, leases, _)| !leases.is_empty())
            .map(|(_, _, leases, skip)| (leases, skip))
            .collect::<Vec<_>>(),
        vec![(recorded, vec![(0, 2)])]
    );
    // Each provider's cursor goes on from the checkpoint's.
    steps.push((lease_of(2001, 4004, 1, 0, 4), splits(0, 2, 4)));
    steps.push((lease_of(2001, 4004, 0, 0, 4), splits(0, 1, 3)));
    let state = run("leases after the restore", steps);
    let decoded: DispatcherState = sluice_journal::codec::decode(&encode(&state)).unwrap();
    assert_eq!(decoded.checkpoint("j", 0, 2), state.checkpoint("j", 0, 2));
}

#[test]
fn the_last_checkpoints_of_a_job_are_kept() {
    let mut steps = reading();
    for step in 1..=CHECKPOINTS_KEPT as u64 + 2 {
        steps.push((save(3000, "r1", step, None, &[]), saved("j")));
    }
    let state = run("many states", steps);
    assert!(state.checkpoint("j", 0, 1).is_none());
    assert!(state.checkpoint("j", 0, 2).is_none());
    assert!(state.checkpoint("j", 0, 3).is_some());
    assert!(state
        .checkpoint("j", 0, CHECKPOINTS_KEPT as u64 + 2)
        .is_some());
}

#[test]
fn checkpoints_of_job_names_that_come_and_go_are_bounded() {
    let mut steps = vec![
        (register(None, b"a"), registered("1000")),
        (worker("w1"), workers_tasks(&[])),
    ];
    // A job name per run, each with one state: the oldest go past the bound.
    let names = MAX_CHECKPOINTS / CHECKPOINTS_KEPT + 3;
    for n in 0..names {
        let (job, client, iteration_id) = (5000 + n as u64, 3000 + n as u64, 2000 + n as u64);
        let name = format!("run-{n}");
        steps.push((exactly_once_job(&name), job_id(job)));
        steps.push((iteration(job, 0), iter_client(iteration_id, client)));
        for step in 0..CHECKPOINTS_KEPT as u64 {
            steps.push((
                save(client, "r", step, None, &[]),
                Outcome::CheckpointSaved {
                    job_name: name.clone(),
                    repetition: 0,
                    definition: definition_key(b"a"),
                },
            ));
        }
    }
    let state = run("names that come and go", steps);
    assert!(state.checkpoint("run-0", 0, 0).is_none());
    assert!(state
        .checkpoint(&format!("run-{}", names - 1), 0, 0)
        .is_some());
    assert_eq!(state.checkpoint_count(), MAX_CHECKPOINTS);
}
