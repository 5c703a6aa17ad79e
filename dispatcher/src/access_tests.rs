//! Table tests of the ownership rule: workers "a" and "b" (registered by names "a" and "b") each
//! hold one task of one iteration; callers of every kind try to act for them.

use super::*;
use crate::state::{ApplyContext, DatasetMetadata, JobOptions, Request, Update};
use sluice_element::Compression;
use sluice_types::{DatasetId, JobId, ShardingPolicy};

fn apply(state: &mut DispatcherState, update: Update) {
    state.apply(ApplyContext::default(), &Request { id: None, update });
}

/// Worker addresses `wa` and `wb`, owned by "a" and "b", with tasks 1 (wa) and 2 (wb)... as the
/// state numbers them; returns the state and each worker's task.
fn two_workers() -> (DispatcherState, TaskId, TaskId) {
    let mut state = DispatcherState::default();
    for (address, owner) in [("wa", "a"), ("wb", "b")] {
        apply(
            &mut state,
            Update::RegisterWorker {
                address: address.into(),
                tags: vec![],
                worker_addresses: vec![],
                owner: owner.into(),
            },
        );
    }
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
            num_splits: vec![4],
        },
    );
    apply(
        &mut state,
        Update::GetOrCreateJob {
            dataset_id: DatasetId("d".into()),
            sharding: ShardingPolicy::Dynamic,
            job_name: Some("j".into()),
            anonymous_suffix: 0,
            options: JobOptions::default(),
        },
    );
    let job = state.jobs().next().expect("the job").id;
    apply(
        &mut state,
        Update::GetOrCreateIteration {
            job_id: JobId(job.0),
            repetition: 0,
        },
    );
    let task_of = |address: &str| {
        state
            .active_tasks_of_worker(address)
            .first()
            .copied()
            .expect("a task per worker")
    };
    let (ta, tb) = (task_of("wa"), task_of("wb"));
    (state, ta, tb)
}

#[test]
fn ownership_table() {
    let (state, ta, tb) = two_workers();
    let a = Identity::new(Role::Worker, "a");
    let b = Identity::new(Role::Worker, "b");
    let admin = Identity::new(Role::Admin, "ops");
    let open = Identity::anonymous();
    let shared = Identity::shared("shared");
    let cases: Vec<(&str, Result<(), DispatcherError>, bool)> = vec![
        ("a for wa", check_worker(&state, &a, "wa"), true),
        ("b for wa", check_worker(&state, &b, "wa"), false),
        (
            "b for an unknown worker",
            check_worker(&state, &b, "wc"),
            true,
        ),
        ("a for its task", check_task(&state, &a, ta), true),
        ("a for b's task", check_task(&state, &a, tb), false),
        ("admin for b's task", check_task(&state, &admin, tb), true),
        ("no authentication", check_task(&state, &open, tb), true),
        ("shared token", check_task(&state, &shared, ta), true),
        ("unknown task", check_task(&state, &a, TaskId(999)), true),
        (
            "a finishes its task",
            check_finish(&state, &a, "wa", &[ta]),
            true,
        ),
        (
            "a finishes b's task as wa",
            check_finish(&state, &a, "wa", &[tb]),
            false,
        ),
        (
            "a finishes b's task as wb",
            check_finish(&state, &a, "wb", &[tb]),
            false,
        ),
        (
            "admin finishes wb's task as wa",
            check_finish(&state, &admin, "wa", &[tb]),
            false,
        ),
    ];
    for (name, got, allowed) in cases {
        match got {
            Ok(()) => assert!(allowed, "{name}: allowed"),
            Err(DispatcherError::Rejected(Rejection::PermissionDenied(message))) => {
                assert!(!allowed, "{name}: refused with {message}")
            }
            Err(other) => panic!("{name}: {other}"),
        }
    }
}

#[test]
fn a_worker_address_stays_with_the_name_that_registered_it() {
    let (mut state, _, _) = two_workers();
    let outcome = state.apply(
        ApplyContext::default(),
        &Request {
            id: None,
            update: Update::RegisterWorker {
                address: "wa".into(),
                tags: vec![],
                worker_addresses: vec![],
                owner: "b".into(),
            },
        },
    );
    assert_eq!(
        outcome,
        crate::state::Outcome::Rejected(Rejection::PermissionDenied(
            "worker address wa is registered by 'a', not 'b'".into()
        ))
    );
    assert_eq!(state.worker("wa").map(|w| w.owner.as_str()), Some("a"));
}

#[test]
fn a_worker_certificate_keeps_its_holder_to_the_hosts_it_names() {
    let caller = Identity::new(Role::Worker, "a");
    let hosts: Vec<String> = ["localhost", "127.0.0.1", "::1", "10.0.0.21", "*.w.example"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (address, named) in [
        ("10.0.0.21:6000", true),
        ("127.0.0.1:41000", true),
        ("[::1]:41000", true),
        ("pod-1.w.example:6000", true),
        ("10.0.0.22:6000", false),
        ("dispatcher.example:6000", false),
    ] {
        let got = check_named_address(&caller, address, Some(&hosts));
        match got {
            Ok(()) => assert!(named, "{address}: allowed"),
            Err(DispatcherError::Rejected(Rejection::PermissionDenied(message))) => {
                assert!(!named, "{address}: refused with {message}");
                assert!(
                    message.starts_with(&format!("worker 'a' may not act for worker {address}: its certificate names the hosts localhost, 127.0.0.1")),
                    "{message}"
                );
            }
            Err(other) => panic!("{address}: {other}"),
        }
    }
    // Without a certificate that names hosts, any address.
    assert!(check_named_address(&caller, "10.0.0.22:6000", None).is_ok());
}
