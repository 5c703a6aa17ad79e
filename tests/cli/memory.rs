//! `max_outstanding_requests` bounds the client's memory: a `sluice read` of 2 MiB elements,
//! throttled so that elements pile up on its side, stays within element size × the bound plus
//! a constant, and a larger bound uses visibly more (the measurement can tell them apart).

use crate::*;
use sluice_formats::tfrecord::TfRecordWriter;

const RECORD: usize = 2 << 20;

/// Reads with at most `outstanding` elements requested or buffered while the caller consumes
/// two per second; returns the reader's peak RSS once it has printed three elements.
fn peak_with(addr: &str, pattern: &str, outstanding: u32) -> f64 {
    let dataset = format!("files(\"{pattern}\").tfrecord()");
    let outstanding = outstanding.to_string();
    let reader = Reader::start(&[
        "--dispatcher",
        addr,
        "--dataset",
        &dataset,
        "--compression",
        "none",
        "--max-outstanding-requests",
        &outstanding,
        "--rate",
        "2",
    ]);
    for _ in 0..3 {
        reader
            .lines
            .recv_timeout(STARTUP)
            .expect("the reader prints elements");
    }
    proc_status_mib(reader.pid(), "VmHWM")
}

#[test]
fn max_outstanding_requests_bounds_client_memory() {
    let data = tempfile::tempdir().expect("temp dir");
    // Letters, so each element prints as a 2 MiB JSON string; 40 of them (80 MiB).
    let path = data.path().join("big.tfrecord");
    let mut writer = TfRecordWriter::create(&path).expect("create tfrecord");
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut record = vec![0u8; RECORD];
    for _ in 0..40 {
        for b in record.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = b'a' + (state % 26) as u8;
        }
        writer.write_record(&record).expect("write record");
    }
    drop(writer);
    let root = data.path().to_str().expect("utf-8");
    let dispatcher = dispatcher(data.path(), &["--data-root", root]);
    let _workers = workers_with(&dispatcher.addr, 1, &["--data-root", root]);
    let pattern = path.to_str().expect("utf-8");

    let small = peak_with(&dispatcher.addr, pattern, 2);
    let large = peak_with(&dispatcher.addr, pattern, 24);
    eprintln!("peak client RSS: {small:.1} MiB with 2 outstanding, {large:.1} MiB with 24");
    // 2 elements of 2 MiB, each held at most twice (wire message and decoded tensor), plus the
    // printed JSON of one element and the process's own footprint.
    let bound = 2.0 * 2.0 * 2.0 + 6.0 + 40.0;
    assert!(
        small < bound,
        "peak {small:.1} MiB > {bound} MiB with 2 outstanding"
    );
    // 22 more elements of 2 MiB must show.
    assert!(
        large > small + 30.0,
        "peak {large:.1} MiB with 24 outstanding vs {small:.1} MiB with 2: the bound is not what limits memory"
    );
}
