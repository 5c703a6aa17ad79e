//! Workers: static-sharding worker lists and the index each worker gets.

use super::*;

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

/// `address` registered by the identity `owner`.
fn owned_worker(address: &str, owner: &str) -> Update {
    Update::RegisterWorker {
        address: address.into(),
        tags: vec![],
        worker_addresses: vec![],
        owner: owner.into(),
    }
}

fn remove(address: &str) -> Update {
    Update::RemoveWorker {
        address: address.into(),
    }
}

#[test]
fn worker_address_ownership_table() {
    // (case, steps: an update and the refusal it gets, if any; then each address's owner)
    type Case = (
        &'static str,
        Vec<(Update, Option<&'static str>)>,
        Vec<(&'static str, Option<&'static str>)>,
    );
    let squat = "worker address a:2 belongs to worker 'w2', which registered it and is down; \
                 'w1' may not take it";
    let cases: Vec<Case> = vec![
        (
            "another identity may not take a registered address",
            vec![
                (owned_worker("a:2", "w2"), None),
                (
                    owned_worker("a:2", "w1"),
                    Some("worker address a:2 is registered by 'w2', not 'w1'"),
                ),
            ],
            vec![("a:2", Some("w2"))],
        ),
        (
            "nor the address of a removed worker: it stays its identity's",
            vec![
                (owned_worker("a:1", "w1"), None),
                (owned_worker("a:2", "w2"), None),
                (remove("a:2"), None),
                (owned_worker("a:2", "w1"), Some(squat)),
                (owned_worker("a:2", "w1"), Some(squat)),
            ],
            vec![("a:1", Some("w1")), ("a:2", Some("w2"))],
        ),
        (
            "the identity comes back at its address",
            vec![
                (owned_worker("a:2", "w2"), None),
                (remove("a:2"), None),
                (owned_worker("a:2", "w1"), Some(squat)),
                (owned_worker("a:2", "w2"), None),
            ],
            vec![("a:2", Some("w2"))],
        ),
        (
            "the identity registers elsewhere: its old address is released",
            vec![
                (owned_worker("a:2", "w2"), None),
                (remove("a:2"), None),
                (owned_worker("a:3", "w2"), None),
                (owned_worker("a:2", "w1"), None),
            ],
            vec![("a:2", Some("w1")), ("a:3", Some("w2"))],
        ),
        (
            "without authentication (no name) an address is anyone's once removed",
            vec![
                (owned_worker("a:2", ""), None),
                (remove("a:2"), None),
                (owned_worker("a:2", ""), None),
                (remove("a:2"), None),
            ],
            vec![("a:2", None)],
        ),
        (
            "workers sharing one identity keep each their own address",
            vec![
                (owned_worker("a:1", "worker"), None),
                (owned_worker("a:2", "worker"), None),
                (remove("a:1"), None),
                (owned_worker("a:3", "worker"), None),
            ],
            vec![
                ("a:1", None),
                ("a:2", Some("worker")),
                ("a:3", Some("worker")),
            ],
        ),
    ];
    for (name, steps, owners) in cases {
        let mut state = DispatcherState::default();
        for (i, (update, refusal)) in steps.into_iter().enumerate() {
            let outcome = state.apply(ApplyContext::default(), &Request { id: None, update });
            match (refusal, outcome) {
                (None, Outcome::Rejected(r)) => panic!("{name}: step {i} refused: {r:?}"),
                (None, _) => {}
                (Some(want), Outcome::Rejected(Rejection::PermissionDenied(got))) => {
                    assert_eq!(got, want, "{name}: step {i}")
                }
                (Some(want), other) => panic!("{name}: step {i}: {other:?}, not {want}"),
            }
        }
        for (address, owner) in owners {
            assert_eq!(state.address_owner(address), owner, "{name}: {address}");
        }
    }
}

#[test]
fn a_snapshot_from_before_the_trailing_fields_decodes_with_them_empty() {
    use sluice_journal::codec::{decode, encode};
    // The state as builds before the trailing fields encoded it: the same fields, less the
    // last ones (`fetch_key`, an empty option: one byte; `exactly_once`, empty; then
    // `iteration_failures` and `departed_workers`, empty maps: one byte each, their length).
    // A snapshot ends with the state.
    let mut state = DispatcherState::default();
    let register = Request {
        id: None,
        update: owned_worker("a:1", "w1"),
    };
    state.apply(ApplyContext::default(), &register);
    let now = encode(&state);
    // Less the codec's version byte.
    let exactly_once = encode(&crate::state::lineage::ExactlyOnce::default()).len() - 1;
    for missing in [1, 1 + exactly_once, 2 + exactly_once, 3 + exactly_once] {
        let before = &now[..now.len() - missing];
        let decoded: DispatcherState = decode(before).expect("decodes");
        assert_eq!(decoded.address_owner("a:1"), Some("w1"));
        assert_eq!(decoded.iteration_failure(IterationId(2000)), None);
    }

    let removal = Request {
        id: None,
        update: remove("a:1"),
    };
    state.apply(ApplyContext::default(), &removal);
    let decoded: DispatcherState = decode(&encode(&state)).expect("decodes");
    assert_eq!(decoded.address_owner("a:1"), Some("w1"));
    assert_eq!(decoded.worker("a:1"), None);
}
