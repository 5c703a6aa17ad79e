//! Exactly-once delivery through real processes: a worker SIGKILLed or restarted mid-epoch
//! while it holds half-read files loses none of them, and repeats none.

use crate::{assert_exactly_once, bin, dispatcher, workers, workers_with, Reader, STARTUP};
use sluice_tests::process::SluiceProcess;
use std::path::Path;
use std::time::Duration;

/// `files` text files of `lines` lines each under `dir`, numbered across files: file `f` holds
/// `f * lines .. (f + 1) * lines`, one number per line.
fn number_files(dir: &Path, files: usize, lines: usize) {
    for f in 0..files {
        let text: String = (f * lines..(f + 1) * lines)
            .map(|i| format!("{i}\n"))
            .collect();
        std::fs::write(dir.join(format!("part-{f:03}.txt")), text).expect("write a data file");
    }
}

/// Reads `dataset` (distributed_epoch) slowly enough that the epoch is under way when a worker
/// is hurt: `hurt` runs after `after` elements arrived; returns every element.
fn read_hurting(addr: &str, dataset: &str, after: usize, hurt: impl FnOnce()) -> Vec<String> {
    read_hurting_in(addr, dataset, "distributed_epoch", after, hurt)
}

/// [`read_hurting`] in processing mode `mode`.
fn read_hurting_in(
    addr: &str,
    dataset: &str,
    mode: &str,
    after: usize,
    hurt: impl FnOnce(),
) -> Vec<String> {
    let reader = Reader::start(&[
        "--dispatcher",
        addr,
        "--dataset",
        dataset,
        "--mode",
        mode,
        "--rate",
        "4000",
        "--max-outstanding-requests",
        "8",
    ]);
    let mut got = Vec::new();
    while got.len() < after {
        let line = reader
            .lines
            .recv_timeout(Duration::from_secs(60))
            .expect("elements keep coming");
        got.push(line);
    }
    hurt();
    let (ok, got) = reader.finish(got, Duration::from_secs(120));
    assert!(ok, "the reader failed");
    got
}

/// Lines read as `files(...).lines()` print as JSON strings: the numbers in them.
fn as_numbers(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            v.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string())
        })
        .collect()
}

#[test]
fn a_worker_killed_mid_epoch_holding_half_read_files_loses_and_repeats_nothing() {
    let data = tempfile::tempdir().expect("temp dir");
    let files = data.path().join("files");
    std::fs::create_dir(&files).expect("a data dir");
    let (n_files, per_file) = (12, 1500);
    number_files(&files, n_files, per_file);
    let root = files.to_str().expect("utf-8 path");
    let dispatcher = dispatcher(
        data.path(),
        &["--worker-timeout", "2s", "--data-root", root],
    );
    let addr = dispatcher.addr.clone();
    let mut workers = workers_with(&addr, 3, &["--data-root", root]);
    let dataset = format!("files(\"{}/*.txt\").lines()", files.display());
    let got = read_hurting(&addr, &dataset, 3000, || {
        // A worker that has read part of its files, and holds leases of more.
        workers[0].kill();
    });
    let n = (n_files * per_file) as i64;
    assert_exactly_once(&as_numbers(&got), n);
    assert_eq!(workers[1].exit_status(), None);
}

#[test]
fn a_worker_restarted_mid_epoch_at_its_address_loses_and_repeats_nothing() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.clone();
    // A fixed port, so the restarted worker is the same worker to the dispatcher.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let args = ["worker", "--dispatcher", &addr, "--listen", &listen];
    let mut restarted = SluiceProcess::spawn(bin(), &args, STARTUP).expect("worker started");
    let _others = workers(&addr, 1);
    let n = 12_000i64;
    let got = read_hurting(&addr, &format!("range({n})"), 2000, || {
        restarted.kill();
        restarted = SluiceProcess::spawn(bin(), &args, STARTUP).expect("worker restarted");
    });
    assert_exactly_once(&got, n);
}

#[test]
fn a_static_shard_whose_worker_is_killed_moves_to_the_other_worker_and_is_read_once() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(
        data.path(),
        &[
            "--worker-timeout",
            "2s",
            "--worker-addresses",
            "127.0.0.1:%port%,127.0.0.1:%port%",
        ],
    );
    let addr = dispatcher.addr.clone();
    let mut workers = workers(&addr, 2);
    let n = 12_000i64;
    let got = read_hurting_in(&addr, &format!("range({n})"), "data", 2000, || {
        workers[0].kill();
    });
    assert_exactly_once(&got, n);
}
