//! Datasets: registration, definitions staged in parts, and how a definition is encoded.

use super::*;
use std::collections::{BTreeMap, BTreeSet};

#[test]
fn staged_definitions_table() {
    let redo = "register the dataset again";
    let cases: Vec<(&str, Vec<(Update, Outcome)>)> = vec![
        (
            "parts in order, then the registration",
            vec![
                (stage(b"abcde", 0, b"ab"), staged(2)),
                (stage(b"abcde", 2, b"cd"), staged(4)),
                (stage(b"abcde", 4, b"e"), staged(5)),
                (register_staged(None, b"abcde", 5), registered("1000")),
            ],
        ),
        (
            "a part already in place, or overlapping the end, is taken again",
            vec![
                (stage(b"abcde", 0, b"abc"), staged(3)),
                (stage(b"abcde", 0, b"abc"), staged(3)),
                (stage(b"abcde", 1, b"bcde"), staged(5)),
                (register_staged(Some("d"), b"abcde", 5), registered("d")),
            ],
        ),
        (
            "a gap is refused and changes nothing",
            vec![
                (stage(b"abcde", 0, b"ab"), staged(2)),
                (
                    stage(b"abcde", 3, b"de"),
                    precondition(&format!(
                        "a definition part at offset 3, but only 2 bytes of it are staged: {redo}"
                    )),
                ),
                (stage(b"abcde", 2, b"cde"), staged(5)),
            ],
        ),
        (
            "a registration before every byte is staged is refused",
            vec![
                (stage(b"abcde", 0, b"ab"), staged(2)),
                (
                    register_staged(None, b"abcde", 5),
                    precondition(&format!("2 of the definition's 5 bytes are staged: {redo}")),
                ),
                (
                    register_staged(None, b"xyz", 3),
                    precondition(&format!(
                        "the definition is not staged (another upload replaced it): {redo}"
                    )),
                ),
            ],
        ),
        (
            "a later part of a definition never started is refused",
            vec![(
                stage(b"abcde", 2, b"cd"),
                precondition(&format!(
                    "no part of the definition before offset 2 is staged (another upload \
                     replaced it): {redo}"
                )),
            )],
        ),
        (
            "another definition's first part drops the one in staging",
            vec![
                (stage(b"abcde", 0, b"ab"), staged(2)),
                (stage(b"xyz", 0, b"xy"), staged(2)),
                (
                    stage(b"abcde", 2, b"cd"),
                    precondition(&format!(
                        "no part of the definition before offset 2 is staged (another upload \
                         replaced it): {redo}"
                    )),
                ),
                (stage(b"xyz", 2, b"z"), staged(3)),
                (register_staged(None, b"xyz", 3), registered("1000")),
            ],
        ),
        (
            "parts of a registered definition change nothing; its registration is a new dataset",
            vec![
                (register(None, b"abcde"), registered("1000")),
                (stage(b"abcde", 0, b"ab"), staged(5)),
                (stage(b"abcde", 4, b"e"), staged(5)),
                (register_staged(None, b"abcde", 5), registered("1001")),
            ],
        ),
        (
            "a whole registration of a definition in staging stores it whole",
            vec![
                (stage(b"abcde", 0, b"ab"), staged(2)),
                (register(None, b"abcde"), registered("1000")),
                (register_staged(None, b"abcde", 5), registered("1001")),
            ],
        ),
        (
            "a part past the largest definition, or whose end overflows, is refused",
            vec![
                (
                    stage(b"abcde", MAX_DEFINITION_BYTES, b"a"),
                    invalid(&format!(
                        "a definition part of 1 bytes at offset {MAX_DEFINITION_BYTES} reaches \
                         past the largest definition, {MAX_DEFINITION_BYTES} bytes"
                    )),
                ),
                (
                    stage(b"abcde", u64::MAX, b"a"),
                    invalid(&format!(
                        "a definition part of 1 bytes at offset {} reaches past the largest \
                         definition, {MAX_DEFINITION_BYTES} bytes",
                        u64::MAX
                    )),
                ),
            ],
        ),
    ];
    for (name, steps) in cases {
        let state = run(name, steps);
        if let Err(e) = state.check_invariants() {
            panic!("case {name:?}: {e}");
        }
    }
    // The staged definition is the one registered.
    let state = run(
        "parts",
        vec![
            (stage(b"abcde", 0, b"abc"), staged(3)),
            (stage(b"abcde", 3, b"de"), staged(5)),
            (register_staged(None, b"abcde", 5), registered("1000")),
        ],
    );
    let dataset = state
        .dataset(&DatasetId("1000".into()))
        .expect("registered");
    assert_eq!(state.dataset_def(dataset), Some(&b"abcde"[..]));
}

/// Definitions are encoded as one byte string; the bytes in the journal are the same as a
/// sequence of bytes would give, so journals written before decode unchanged.
#[test]
fn a_definition_encodes_as_the_same_bytes_as_a_sequence_of_bytes() {
    #[derive(serde::Serialize)]
    struct AsSequence {
        dataset_id: Option<DatasetId>,
        def: Vec<u8>,
    }
    let def: Vec<u8> = (0..=255).collect();
    let update = register(None, &def);
    let Update::RegisterDataset { dataset_id, .. } = &update else {
        unreachable!()
    };
    let sequence = sluice_journal::codec::encode(&AsSequence {
        dataset_id: dataset_id.clone(),
        def: def.clone(),
    });
    let encoded = sluice_journal::codec::encode(&update);
    // The codec's version byte, the variant's index (one byte), then the fields in order.
    assert_eq!(encoded[0], sequence[0]);
    assert!(encoded[2..].starts_with(&sequence[1..]));
}

/// The encoded definition of a `from_slices` source whose tensors are blobs named by
/// `digests` (one byte repeated, each 64 bytes long); none: an inline tensor.
fn def_naming(digests: &[u8]) -> Vec<u8> {
    use prost::Message;
    use sluice_element::pb;
    let tensor = |d: Option<u8>| pb::SlicesStructure {
        kind: Some(pb::slices_structure::Kind::Tensor(pb::TensorProto {
            dtype: pb::DType::Float32 as i32,
            shape: vec![16],
            data: if d.is_none() {
                vec![0; 64].into()
            } else {
                Default::default()
            },
            blob_digest: d.map(|d| vec![d; 32]).unwrap_or_default(),
            blob_len: if d.is_some() { 64 } else { 0 },
            ..Default::default()
        })),
    };
    let items = if digests.is_empty() {
        vec![tensor(None)]
    } else {
        digests.iter().map(|d| tensor(Some(*d))).collect()
    };
    pb::DatasetDef {
        source: Some(pb::Source {
            kind: Some(pb::source::Kind::Slices(pb::SlicesSource {
                tensor: None,
                structure: Some(pb::SlicesStructure {
                    kind: Some(pb::slices_structure::Kind::Tuple(pb::SlicesList { items })),
                }),
            })),
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// The blobs the registered definitions name: what every replica keeps. A blob stays while
/// any dataset of any definition naming it stays, and leaves with the last.
#[test]
fn live_blobs_table() {
    let forget = |ids: &[&str]| Update::RemoveIdle {
        iterations_before: 0,
        datasets_before: u64::MAX,
        iterations: vec![],
        jobs: vec![],
        datasets: ids.iter().map(|d| DatasetId(d.to_string())).collect(),
    };
    let removed = |datasets| Outcome::IdleRemoved {
        iterations: 0,
        jobs: 0,
        datasets,
    };
    let blobs = |ds: &[u8]| -> BTreeSet<[u8; 32]> { ds.iter().map(|d| [*d; 32]).collect() };
    type Case = (&'static str, Vec<(Update, Outcome)>, BTreeSet<[u8; 32]>);
    let cases: Vec<Case> = vec![
        ("nothing registered", vec![], blobs(&[])),
        (
            "an inline definition names none",
            vec![(register(None, &def_naming(&[])), registered("1000"))],
            blobs(&[]),
        ),
        (
            "a definition's blobs, each once",
            vec![(register(None, &def_naming(&[1, 2, 1])), registered("1000"))],
            blobs(&[1, 2]),
        ),
        (
            "two definitions sharing a blob: it stays while either does",
            vec![
                (register(None, &def_naming(&[1, 2])), registered("1000")),
                (register(None, &def_naming(&[2, 3])), registered("1001")),
                (forget(&["1000"]), removed(1)),
            ],
            blobs(&[2, 3]),
        ),
        (
            "two datasets of one definition: its blobs go with the last",
            vec![
                (register(None, &def_naming(&[4])), registered("1000")),
                (
                    register(Some("mine"), &def_naming(&[4])),
                    registered("mine"),
                ),
                (forget(&["1000"]), removed(1)),
            ],
            blobs(&[4]),
        ),
        (
            "every dataset collected: no blob is live",
            vec![
                (register(None, &def_naming(&[4])), registered("1000")),
                (
                    register(Some("mine"), &def_naming(&[5])),
                    registered("mine"),
                ),
                (forget(&["1000", "mine"]), removed(2)),
            ],
            blobs(&[]),
        ),
        (
            "a definition only staged names none yet",
            vec![(
                stage(&def_naming(&[6]), 0, &def_naming(&[6])),
                staged(def_naming(&[6]).len() as u64),
            )],
            blobs(&[]),
        ),
        (
            "bytes that are no definition name none",
            vec![(register(None, b"\xff\xff\xff"), registered("1000"))],
            blobs(&[]),
        ),
    ];
    // One cache carried through every case's steps, as a replica's maintenance carries it:
    // after each step it gives what decoding every definition gives.
    let mut known = BTreeMap::new();
    for (name, steps, want) in cases {
        for n in 0..=steps.len() {
            let state = run(name, steps[..n].to_vec());
            assert_eq!(
                state.live_blobs_cached(&mut known),
                state.live_blobs(),
                "case {name:?} after {n} steps"
            );
        }
        let state = run(name, steps);
        assert_eq!(state.live_blobs(), want, "case {name:?}");
        assert_eq!(state.live_blobs_cached(&mut known), want, "case {name:?}");
    }
}
