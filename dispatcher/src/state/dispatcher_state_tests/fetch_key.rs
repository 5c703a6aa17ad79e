//! The cluster's fetch key: the first `SetFetchKey` sets it, later ones change nothing, and it
//! survives a snapshot.

use super::*;
use sluice_security::FetchKey;

fn key(byte: u8) -> FetchKey {
    FetchKey::from_bytes(&[byte; 32]).expect("32 bytes")
}

fn set(byte: u8) -> Update {
    Update::SetFetchKey { key: key(byte) }
}

fn outcome(set: bool) -> Outcome {
    Outcome::FetchKeySet { set }
}

#[test]
fn fetch_key_table() {
    // (name, steps, the key afterwards)
    type Case = (&'static str, Vec<(Update, Outcome)>, Option<u8>);
    let cases: Vec<Case> = vec![
        ("a fresh state has no key", vec![], None),
        (
            "the first key is set",
            vec![(set(1), outcome(true))],
            Some(1),
        ),
        (
            "a second key (another leader's) changes nothing",
            vec![(set(1), outcome(true)), (set(2), outcome(false))],
            Some(1),
        ),
        (
            "the same key again changes nothing",
            vec![(set(1), outcome(true)), (set(1), outcome(false))],
            Some(1),
        ),
        (
            "any key bytes are taken, zeros too",
            vec![(set(0), outcome(true)), (set(0xff), outcome(false))],
            Some(0),
        ),
        (
            "the key stays through the removal of everything else",
            vec![
                (register(None, b"a"), registered("1000")),
                (worker("w1"), workers_tasks(&[])),
                (set(3), outcome(true)),
                (job("1000", ShardingPolicy::Off, Some("j")), job_id(5000)),
                (iteration(5000, 0), iter_client(2000, 3000)),
                (remove_worker("w1"), Outcome::WorkerRemoved),
                (release(3000), Outcome::ClientReleased),
                (gc(2000), Outcome::IterationCollected),
                (set(4), outcome(false)),
            ],
            Some(3),
        ),
    ];
    for (name, steps, want) in cases {
        let state = run(name, steps);
        assert_eq!(state.fetch_key(), want.map(key).as_ref(), "case {name:?}");
    }
}

#[test]
fn a_retried_set_fetch_key_is_answered_as_the_first_time() {
    let mut state = DispatcherState::default();
    let id = Some(RequestId {
        requester: 1,
        seq: 1,
        watermark: 1,
    });
    let first = state.apply(ApplyContext::default(), &Request { id, update: set(1) });
    let retry = state.apply(ApplyContext::default(), &Request { id, update: set(2) });
    assert_eq!((first, retry), (outcome(true), outcome(true)));
    assert_eq!(state.fetch_key(), Some(&key(1)));
}

#[test]
fn the_key_survives_a_snapshot_and_a_snapshot_without_it_decodes() {
    use sluice_journal::codec::{decode, encode};
    let mut state = DispatcherState::default();
    let before_key = encode(&state);
    state.apply(
        ApplyContext::default(),
        &Request {
            id: None,
            update: set(7),
        },
    );
    let decoded: DispatcherState = decode(&encode(&state)).expect("decodes");
    assert_eq!(decoded.fetch_key(), Some(&key(7)));
    // A build before the key ended its snapshot one byte (the empty option) earlier.
    let older = &before_key[..before_key.len() - 1];
    let decoded: DispatcherState = decode(older).expect("decodes");
    assert_eq!(decoded.fetch_key(), None);
}

#[test]
fn the_state_does_not_print_the_key() {
    let mut state = DispatcherState::default();
    state.apply(
        ApplyContext::default(),
        &Request {
            id: None,
            update: set(0xab),
        },
    );
    let printed = format!("{state:?} {:?}", set(0xab));
    assert!(printed.contains("FetchKey(..)"), "{printed}");
    assert!(!printed.contains("171"), "{printed}");
}
