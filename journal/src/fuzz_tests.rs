//! The fuzz target of the journal codec (see `sluice-fuzz`): bytes as they are read back from
//! disk or from a peer, decoded as log entries, votes, snapshot metadata, snapshots, and a
//! value shaped as the dispatcher's updates are (strings, bytes, maps, options, enums). Each
//! must decode or fail with `JournalError::Codec`, never panic, never hold memory out of
//! proportion to its input; and what decodes encodes to bytes that decode to it again (not
//! always the input's bytes: a set or map read out of order is kept in order).
//!
//! The input's first byte picks the type; the rest is the codec's bytes.
//! A long session: `SLUICE_FUZZ_CASES=100000 cargo nextest run -p sluice-journal --profile fuzz
//! -E 'test(fuzz_)'`.

use std::collections::BTreeMap;
use std::fmt::Debug;

use openraft::{
    BasicNode, Entry, EntryPayload, LogId, Membership, SnapshotMeta, StoredMembership, Vote,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sluice_fuzz::{AllocMeter, FuzzTarget};

use crate::codec::{decode, encode};
use crate::test_support::{Cmd, KvState, ToyConfig};
use crate::AppliedState;

#[global_allocator]
static METER: AllocMeter = AllocMeter;

/// Shaped as the dispatcher's updates: every kind of field bincode encodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Rich {
    Register {
        name: String,
        definition: Vec<u8>,
        tags: BTreeMap<String, Vec<u64>>,
        compression: Option<bool>,
    },
    Lease {
        task: u64,
        splits: Vec<(u64, i64)>,
        owner: Option<String>,
    },
    Batch(Vec<Rich2>),
    Empty,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Rich2 {
    id: u128,
    label: char,
    weight: f64,
    words: Vec<String>,
}

fn log_id(term: u64, index: u64) -> LogId<u64> {
    openraft::testing::log_id(term, 1, index)
}

fn membership() -> StoredMembership<u64, BasicNode> {
    let nodes = BTreeMap::from([
        (1, BasicNode::new("127.0.0.1:7001")),
        (2, BasicNode::new("127.0.0.1:7002")),
    ]);
    let config = vec![[1u64, 2].into_iter().collect()];
    StoredMembership::new(Some(log_id(1, 1)), Membership::new(config, nodes))
}

fn entries() -> Vec<Entry<ToyConfig>> {
    let set = |k: &str, v: &str| Cmd::Set {
        key: k.into(),
        value: v.into(),
    };
    vec![
        Entry {
            log_id: log_id(1, 1),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: log_id(2, 5),
            payload: EntryPayload::Normal(set("dataset-7", "range(10).batch(2)")),
        },
        Entry {
            log_id: log_id(3, 9),
            payload: EntryPayload::Membership(membership().membership().clone()),
        },
    ]
}

fn rich() -> Vec<Rich> {
    vec![
        Rich::Register {
            name: "job-a".into(),
            definition: b"\x0a\x02\x08\x0a".to_vec(),
            tags: BTreeMap::from([("x".into(), vec![1, u64::MAX])]),
            compression: Some(true),
        },
        Rich::Lease {
            task: 12,
            splits: vec![(0, -1), (u64::MAX, i64::MIN)],
            owner: None,
        },
        Rich::Batch(vec![Rich2 {
            id: u128::MAX,
            label: 'é',
            weight: -0.5,
            words: vec!["a".into(), String::new()],
        }]),
        Rich::Empty,
    ]
}

fn snapshot() -> AppliedState<ToyConfig, KvState> {
    AppliedState {
        last_applied: Some(log_id(3, 9)),
        last_membership: membership(),
        state: KvState {
            map: BTreeMap::from([("k".into(), "v".into()), ("dataset-7".into(), "x".into())]),
        },
    }
}

/// Bytes serde's `Vec` reserves at most before its items arrive (its "cautious" size hint).
const SEQUENCE_AHEAD: usize = 1 << 20;

/// The types the input's first byte picks from.
const KINDS: u8 = 5;

fn seeds() -> Vec<Vec<u8>> {
    let tagged = |kind: u8, bytes: Vec<u8>| [vec![kind], bytes].concat();
    let mut out = Vec::new();
    out.extend(entries().iter().map(|e| tagged(0, encode(e))));
    out.push(tagged(1, encode(&Vote::new_committed(3, 1u64))));
    out.push(tagged(1, encode(&Vote::new(4, 2u64))));
    out.push(tagged(
        2,
        encode(&SnapshotMeta::<u64, BasicNode> {
            last_log_id: Some(log_id(3, 9)),
            last_membership: membership(),
            snapshot_id: "3-9-1".into(),
        }),
    ));
    out.push(tagged(3, encode(&snapshot())));
    out.extend(rich().iter().map(|r| tagged(4, encode(r))));
    out
}

/// Decodes `body` as a `T`; what decodes must come back the same through its encoding.
fn check_as<T: Serialize + DeserializeOwned + Debug>(body: &[u8]) -> Result<(), String> {
    let (decoded, peak) = AllocMeter::peak_during(|| decode::<T>(body));
    // serde makes room for at most 1 MiB of a sequence's items ahead of them, per open sequence.
    let bound = body.len() * 256 + SEQUENCE_AHEAD * 4;
    if peak > bound {
        return Err(format!(
            "decoding {} held {peak} bytes at once for {} bytes of input (bound {bound})",
            std::any::type_name::<T>(),
            body.len()
        ));
    }
    if let Ok(value) = decoded {
        let bytes = encode(&value);
        let again =
            decode::<T>(&bytes).map_err(|e| format!("{value:?} encoded does not decode: {e}"))?;
        if encode(&again) != bytes {
            return Err(format!("{value:?} changes through its encoding: {again:?}"));
        }
    }
    Ok(())
}

fn check(input: &[u8]) -> Result<(), String> {
    let Some((&kind, body)) = input.split_first() else {
        return Ok(());
    };
    match kind % KINDS {
        0 => check_as::<Entry<ToyConfig>>(body),
        1 => check_as::<Vote<u64>>(body),
        2 => check_as::<SnapshotMeta<u64, BasicNode>>(body),
        3 => check_as::<AppliedState<ToyConfig, KvState>>(body),
        _ => check_as::<Rich>(body),
    }
}

#[test]
fn fuzz_journal_codec() {
    FuzzTarget::new("journal")
        .seeds(seeds())
        .dictionary(&[
            &[1u8][..],
            &[0],
            &[251, 0xff, 0xff],
            &[252, 0xff, 0xff, 0xff, 0x3f],
            &[253, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            &[2],
        ])
        .run(check);
}

/// `fuzz/corpus/journal/crash-snapshot-meta-string-claims`: snapshot metadata whose node
/// addresses claim 16 MiB each. bincode allocated each claimed string before reading it, so
/// 103 bytes held 16 MiB at once, and a 10-byte value could claim up to the 1 GiB cap.
#[test]
fn a_length_prefix_claims_no_more_than_the_input_could_hold() {
    let saved = std::fs::read(
        sluice_fuzz::Corpus::dir("journal").join("crash-snapshot-meta-string-claims"),
    )
    .expect("the input is in the corpus");
    let (decoded, peak) =
        AllocMeter::peak_during(|| decode::<SnapshotMeta<u64, BasicNode>>(&saved[1..]));
    assert!(decoded.is_err());
    assert!(peak < 1 << 20, "held {peak} bytes");
    // A string of 1 GiB - 1 bytes, claimed by 6 bytes.
    let claim = [crate::codec::CODEC_VERSION, 252, 0xff, 0xff, 0xff, 0x3f];
    let (decoded, peak) = AllocMeter::peak_during(|| decode::<String>(&claim));
    let err = decoded.expect_err("a claim past the input");
    assert!(err.to_string().contains("decode"), "{err}");
    assert!(peak < 1 << 20, "held {peak} bytes");
}
