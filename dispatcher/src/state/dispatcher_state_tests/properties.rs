//! Random scripts of valid and invalid updates (ids that exist and that do not, repetitions and
//! rounds up to `u64::MAX`), applied in lockstep to three states as three replicas apply one
//! log: `apply` never panics, the replicas agree on every outcome and on the final state, no
//! split of an iteration is leased twice, and a provider never leases an older repetition after
//! a newer one.
//!
//! And replaying one log twice gives the same state and outcomes.

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
        (
            worker_name.clone(),
            prop::collection::vec(4000..4008u64, 0..3)
        )
            .prop_map(|(w, t)| Update::FailCrashedTasks {
                worker: w.into(),
                task_ids: t.into_iter().map(TaskId).collect(),
                signal: "SIGSEGV".into(),
            }),
        worker_name.prop_map(remove_worker),
        any::<[u8; 32]>().prop_map(|bytes| Update::SetFetchKey {
            key: sluice_security::FetchKey::from_bytes(&bytes).expect("32 bytes"),
        }),
        (2000..2004u64).prop_map(gc),
        (
            prop::sample::select(vec!["1000", "1001"]),
            prop::sample::select(vec!["j", "k"]),
        )
            .prop_map(|(d, name)| Update::GetOrCreateJobWithDelivery {
                dataset_id: DatasetId(d.into()),
                sharding: ShardingPolicy::Dynamic,
                job_name: Some(name.into()),
                anonymous_suffix: 7,
                options: JobOptions::default(),
                delivery: sluice_types::Delivery::ExactlyOnce,
            }),
        (
            3000..3006u64,
            prop::sample::select(vec!["r1", "r2", ""]),
            prop_oneof![0..4u64, Just(u64::MAX)],
            prop::option::of(0..4u64),
            prop::collection::vec((4000..4008u64, 0..6u64, 0..6u64), 0..3),
        )
            .prop_map(|(c, reader, step, base, taken)| Update::SaveCheckpoint {
                client_id: ClientId(c),
                reader: reader.into(),
                step,
                base_step: base,
                taken: taken
                    .into_iter()
                    .map(|(t, s, n)| (TaskId(t), vec![(s, s.saturating_add(n))]))
                    .collect(),
            }),
        (
            5000..5004u64,
            0..2u64,
            prop_oneof![0..4u64, Just(u64::MAX)],
            prop::sample::select(vec!["r1", "r2"]),
        )
            .prop_map(|(j, r, step, reader)| Update::ResumeIteration {
                job_id: JobId(j),
                repetition: r,
                step,
                reader: reader.into(),
            }),
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
