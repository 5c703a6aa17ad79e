//! One dispatcher process and two worker processes.

use crate::*;
use std::time::Duration;

#[test]
fn read_register_status_and_a_restart_mid_epoch() {
    let data = tempfile::tempdir().expect("temp dir");
    let data_dir = data.path().join("dispatcher");
    let data_dir = data_dir.to_str().expect("utf-8 path");
    let mut dispatcher = SluiceProcess::spawn(
        bin(),
        &[
            "dispatcher",
            "--init",
            "--id",
            "1",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir,
        ],
        STARTUP,
    )
    .expect("dispatcher started");
    let addr = dispatcher.addr.clone();
    let _workers = workers(&addr, 2);

    // parallel_epochs: every element once per worker, as JSON numbers.
    let (ok, out, err) = sluice(&["read", "--dispatcher", &addr, "--dataset", "range(10)"]);
    assert!(ok, "{err}");
    assert_eq!(
        sorted_ints(&json_lines(&out)),
        (0..10).flat_map(|i| [i, i]).collect::<Vec<_>>()
    );

    // Ops in the expression run on the workers, --local ones in the reader.
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        &addr,
        "--dataset",
        "range(5).map(square)",
        "--local",
        "map(square)",
        "--mode",
        "distributed_epoch",
    ]);
    assert!(ok, "{err}");
    assert_eq!(sorted_ints(&json_lines(&out)), vec![0, 1, 16, 81, 256]);

    // Batches print as arrays. In distributed_epoch each worker batches the splits it got, so
    // batches may be short; together they hold every element once.
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        &addr,
        "--dataset",
        "range(5).batch(2)",
        "--mode",
        "distributed_epoch",
    ]);
    assert!(ok, "{err}");
    let batches = json_lines(&out);
    assert!(
        batches.len() >= 3
            && batches
                .iter()
                .all(|b| b.as_array().is_some_and(|b| (1..=2).contains(&b.len()))),
        "{batches:?}"
    );
    let elements: Vec<serde_json::Value> = batches
        .iter()
        .flat_map(|b| b.as_array().expect("an array").clone())
        .collect();
    assert_eq!(sorted_ints(&elements), (0..5).collect::<Vec<_>>());

    // enumerate(): (index, element) pairs; in distributed_epoch the index is the element's
    // position in the dataset whichever worker made it, so sorting by it restores the order.
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        &addr,
        "--dataset",
        "range(9).map(square).enumerate()",
        "--mode",
        "distributed_epoch",
    ]);
    assert!(ok, "{err}");
    let mut pairs = json_lines(&out);
    pairs.sort_by_key(|p| p[0].as_i64());
    let want: Vec<serde_json::Value> = (0..9).map(|i| serde_json::json!([i, i * i])).collect();
    assert_eq!(pairs, want);
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        &addr,
        "--dataset",
        "range(9).enumerate()",
    ]);
    assert!(ok, "{err}");
    let mut pairs = json_lines(&out);
    pairs.sort_by_key(|p| p[0].as_i64());
    let want: Vec<serde_json::Value> = (0..9)
        .flat_map(|i| [serde_json::json!([i, i]), serde_json::json!([i, i])])
        .collect();
    assert_eq!(pairs, want, "parallel_epochs: once per worker");

    // register, then read by id; status names the leader and the dataset.
    let (ok, out, err) = sluice(&[
        "register",
        "--dispatcher",
        &addr,
        "--dataset",
        "range(3)",
        "--dataset-id",
        "three",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "three");
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        &addr,
        "--dataset-id",
        "three",
        "--mode",
        "distributed_epoch",
    ]);
    assert!(ok, "{err}");
    assert_eq!(sorted_ints(&json_lines(&out)), vec![0, 1, 2]);
    let (ok, out, err) = sluice(&["status", "--dispatcher", &addr]);
    assert!(ok, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).expect("status is JSON");
    assert_eq!(status["leader"], 1);
    assert!(status["datasets"]
        .as_array()
        .expect("datasets")
        .iter()
        .any(|d| d == "three"));
    assert_eq!(status["workers"].as_array().expect("workers").len(), 2);

    // SIGKILL the dispatcher mid-epoch and restart it from its data dir at the same address:
    // the reader and the workers reconnect by themselves; nothing is duplicated or lost.
    let n = 4000;
    let range = format!("range({n})");
    let reader = Reader::start(&[
        "--dispatcher",
        &addr,
        "--dataset",
        &range,
        "--mode",
        "distributed_epoch",
        "--rate",
        "4000",
        "--max-outstanding-requests",
        "8",
    ]);
    let mut got = Vec::new();
    while got.len() < 800 {
        got.push(
            reader
                .lines
                .recv_timeout(Duration::from_secs(30))
                .expect("elements before the kill"),
        );
    }
    dispatcher.kill();
    let restart_args = [
        "dispatcher",
        "--id",
        "1",
        "--listen",
        addr.as_str(),
        "--data-dir",
        data_dir,
    ];
    let mut dispatcher =
        SluiceProcess::spawn(bin(), &restart_args, STARTUP).expect("dispatcher restarted");
    let (ok, got) = reader.finish(got, Duration::from_secs(60));
    assert!(ok, "the reader failed");
    assert_exactly_once(&got, n);
    dispatcher.kill();
}
