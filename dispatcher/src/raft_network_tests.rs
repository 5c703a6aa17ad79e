//! The append encode path: an append over the peers' bound is never sent but reported as too
//! large with the entries that fit, so openraft splits it; one entry alone over the bound is a
//! network error rather than a hint openraft could never satisfy.

use super::*;
use crate::state::{Proposal, Request, Update};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};

/// An append of one entry per size, each a proposal of about that many bytes.
fn append(sizes: &[usize]) -> AppendEntriesRequest<TypeConfig> {
    let entries = sizes
        .iter()
        .zip(1u64..)
        .map(|(&bytes, index)| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Proposal {
                time_micros: 1,
                requests: vec![Request {
                    id: None,
                    update: Update::RemoveWorker {
                        address: "w".repeat(bytes),
                    },
                }],
            }),
        })
        .collect();
    AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: None,
        leader_commit: None,
        entries,
    }
}

const KIB: usize = 1024;

#[test]
fn an_append_within_the_bound_is_encoded_whole() {
    let rpc = append(&[100 * KIB, 100 * KIB]);
    let payload = append_payload(&rpc, 300 * KIB).expect("fits");
    let back: AppendEntriesRequest<TypeConfig> = codec::decode(&payload).expect("decodes");
    assert_eq!(back.entries.len(), 2);
    assert_eq!(payload, codec::encode(&rpc));
}

#[test]
fn an_append_over_the_bound_is_too_large_with_the_entries_that_fit() {
    let rpc = append(&[100 * KIB; 5]);
    let limit = 350 * KIB;
    match append_payload(&rpc, limit).map_err(AppendRefusal::into_rpc_error) {
        Err(RPCError::PayloadTooLarge(too_large)) => {
            assert_eq!(too_large.action(), RPCTypes::AppendEntries);
            assert_eq!(too_large.entries_hint(), 3);
            let message = too_large.to_string();
            assert!(
                message.contains(&format!("limit of {limit} bytes")),
                "{message}"
            );
        }
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    // What openraft sends next, the first three entries, fits.
    let mut first_three = append(&[100 * KIB; 5]);
    first_three.entries.truncate(3);
    assert!(append_payload(&first_three, limit).is_ok());
}

#[test]
fn a_large_entry_after_small_ones_is_split_off() {
    let rpc = append(&[KIB, KIB, 500 * KIB, KIB]);
    match append_payload(&rpc, 400 * KIB).map_err(AppendRefusal::into_rpc_error) {
        Err(RPCError::PayloadTooLarge(too_large)) => assert_eq!(too_large.entries_hint(), 2),
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
}

#[test]
fn one_entry_over_the_bound_is_a_network_error_naming_it() {
    let rpc = append(&[500 * KIB, KIB]);
    match append_payload(&rpc, 400 * KIB).map_err(AppendRefusal::into_rpc_error) {
        Err(RPCError::Network(e)) => {
            let message = e.to_string();
            assert!(message.contains("first entry"), "{message}");
            assert!(
                message.contains(&format!("{} bytes", 400 * KIB)),
                "{message}"
            );
        }
        other => panic!("expected a network error, got {other:?}"),
    }
}
