//! The fuzz target of this crate's decoders of outside input (see `sluice-fuzz`): the TFRecord
//! reader (plain, GZIP and ZLIB). It checks that the reader returns records or a clean error,
//! never panics, and holds at most a bounded multiple of its input in memory at once.
//!
//! A long session: `SLUICE_FUZZ_CASES=100000 cargo nextest run -p sluice-formats --profile fuzz
//! -E 'test(fuzz_)'`.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use bytes::Bytes;
use sluice_element::{pb, Element, OriginCell, Tensor};
use sluice_fuzz::{within, AllocMeter, FuzzTarget};

use crate::files::{inflated, records};
use crate::tfrecord::TfRecordWriter;

#[global_allocator]
static METER: AllocMeter = AllocMeter;

// ---------------------------------------------------------------- TFRecord reader

/// How a TFRecord input's bytes (after its first byte) are read: the file as given, or given
/// plain and compressed here before it is read (so the records inside a compressed stream are
/// fuzzed, not only the compressed bytes).
const TFRECORD_MODES: [(pb::RecordCompression, bool); 5] = [
    (pb::RecordCompression::None, false),
    (pb::RecordCompression::Gzip, false),
    (pb::RecordCompression::Zlib, false),
    (pb::RecordCompression::Gzip, true),
    (pb::RecordCompression::Zlib, true),
];

fn compress(data: &[u8], compression: pb::RecordCompression) -> Vec<u8> {
    let level = flate2::Compression::fast();
    match compression {
        pb::RecordCompression::None => data.to_vec(),
        pb::RecordCompression::Gzip => {
            let mut w = flate2::write::GzEncoder::new(Vec::new(), level);
            w.write_all(data).expect("writes to a Vec");
            w.finish().expect("writes to a Vec")
        }
        pb::RecordCompression::Zlib => {
            let mut w = flate2::write::ZlibEncoder::new(Vec::new(), level);
            w.write_all(data).expect("writes to a Vec");
            w.finish().expect("writes to a Vec")
        }
    }
}

/// How many bytes `file` inflates to (at most `cap`), as the reader would see them.
fn inflated_len(file: &[u8], compression: pb::RecordCompression, cap: u64) -> usize {
    let mut out = Vec::new();
    let _ = inflated(std::io::Cursor::new(file.to_vec()), compression)
        .take(cap)
        .read_to_end(&mut out);
    out.len()
}

fn tfrecord_file(records: &[&[u8]]) -> Vec<u8> {
    let mut w = TfRecordWriter::new(Vec::new());
    for r in records {
        w.write_record(r).expect("writes to a Vec");
    }
    w.into_inner().expect("writes to a Vec")
}

fn tfrecord_seeds() -> Vec<Vec<u8>> {
    let example = crate::serialize_example(&BTreeMap::from([(
        "label".to_string(),
        Tensor::scalar_i64(7),
    )]))
    .unwrap_or_default();
    let sets: [&[&[u8]]; 4] = [
        &[b"hello", b"", b"world!"],
        &[&example, &example],
        &[&[0u8; 300], b"\xff\xfe"],
        &[],
    ];
    let mut seeds = Vec::new();
    for (mode, &(compression, wrap)) in TFRECORD_MODES.iter().enumerate() {
        for set in sets {
            let plain = tfrecord_file(set);
            let body = if wrap {
                plain
            } else {
                compress(&plain, compression)
            };
            seeds.push([&[mode as u8][..], &body].concat());
        }
    }
    seeds
}

fn check_tfrecord(input: &[u8]) -> Result<(), String> {
    let Some((&mode, body)) = input.split_first() else {
        return Ok(());
    };
    let (compression, wrap) = TFRECORD_MODES[usize::from(mode) % TFRECORD_MODES.len()];
    let file = if wrap {
        compress(body, compression)
    } else {
        body.to_vec()
    };
    // A compressed stream may hold more than its own size: the bound follows what it inflates to.
    let stream_len = inflated_len(&file, compression, 64 << 20);
    let (read, peak) = AllocMeter::peak_during(|| {
        let stream = inflated(std::io::Cursor::new(file.clone()), compression);
        records(stream, "fuzz.tfrecord", &OriginCell::default()).collect::<Vec<_>>()
    });
    within(
        "the TFRecord reader",
        peak,
        file.len() + stream_len,
        4,
        2 << 20,
    )?;
    // A stream that read whole is its records written again, byte for byte.
    if read.iter().all(Result::is_ok) && compression == pb::RecordCompression::None {
        let records: Vec<Bytes> = read
            .into_iter()
            .map(|r| match r {
                Ok(Element::Tensor(t)) => t.strings().map(|s| s[0].clone()).unwrap_or_default(),
                _ => Bytes::new(),
            })
            .collect();
        let again = tfrecord_file(&records.iter().map(|r| &r[..]).collect::<Vec<_>>());
        if again != file {
            return Err(format!(
                "{} records read, written again they differ",
                records.len()
            ));
        }
    }
    Ok(())
}

#[test]
fn fuzz_tfrecord_reader() {
    FuzzTarget::new("tfrecord")
        .seeds(tfrecord_seeds())
        .dictionary(&[
            &[0u8; 8][..],
            &[0xff; 8],
            &[0x1f, 0x8b, 0x08, 0x00],
            &[0x78, 0x9c],
            &[0x03, 0x00],
        ])
        .run(check_tfrecord);
}
