//! `sluice worker`'s limits: the memory budget fails the task whose buffers would exceed it (the
//! worker keeps serving), a cross-trainer cache larger than the budget is refused at start, and
//! a worker on every interface must say which address clients dial.

use crate::*;

/// The one line `sluice worker <args>` fails with; panics if it started.
fn refused_worker(args: &[&str]) -> String {
    let mut all = vec!["worker"];
    all.extend_from_slice(args);
    let (ok, out, err) = sluice(&all);
    assert!(!ok, "the worker started: {out}");
    assert!(out.is_empty(), "printed {out:?}");
    let err = err.trim_end().to_string();
    assert!(!err.contains('\n'), "more than one line: {err:?}");
    err
}

#[test]
fn a_task_past_the_memory_budget_fails_and_the_worker_keeps_serving() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.as_str();
    let _workers = workers_with(addr, 1, &["--memory-budget", "1MiB"]);

    for dataset in [
        "range(1000000000000).batch(1000000000000)",
        "range(1000000000000).shuffle(1000000000000)",
    ] {
        let (ok, out, err) = sluice(&["read", "--dispatcher", addr, "--dataset", dataset]);
        assert!(!ok, "{dataset}: {out}");
        let err = err.trim_end();
        assert!(!err.contains('\n'), "more than one line: {err:?}");
        let op = if dataset.contains("batch") {
            "batch"
        } else {
            "shuffle"
        };
        assert!(
            err.contains(&format!("{op} needs 72 more bytes"))
                && err.contains("memory budget of 1048576 bytes")
                && err.contains("raise --memory-budget"),
            "{dataset}: {err}"
        );
    }

    let (ok, out, err) = sluice(&["read", "--dispatcher", addr, "--dataset", "range(5)"]);
    assert!(ok, "{err}");
    assert_eq!(sorted_ints(&json_lines(&out)), vec![0, 1, 2, 3, 4]);
}

#[test]
fn a_cross_trainer_cache_larger_than_the_memory_budget_is_refused_at_start() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let err = refused_worker(&[
        "--dispatcher",
        &dispatcher.addr,
        "--memory-budget",
        "1MiB",
        "--cross-trainer-cache-size",
        "2MiB",
    ]);
    assert!(
        err.contains("--cross-trainer-cache-size") && err.contains("--memory-budget"),
        "{err}"
    );
}

#[test]
fn a_worker_on_every_interface_needs_an_advertise_address() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.as_str();
    let err = refused_worker(&["--dispatcher", addr, "--listen", "0.0.0.0:0", "--insecure"]);
    assert!(
        err.contains("an address no client can dial") && err.contains("--advertise-address"),
        "{err}"
    );
    let err = refused_worker(&["--dispatcher", addr, "--advertise-address", "worker-1:0"]);
    assert!(
        err.contains("--advertise-address worker-1:0") && err.contains("the port is 0"),
        "{err}"
    );

    let worker = SluiceProcess::spawn(
        bin(),
        &[
            "worker",
            "--dispatcher",
            addr,
            "--listen",
            "0.0.0.0:0",
            "--advertise-address",
            "127.0.0.1:%port%",
            "--insecure",
        ],
        STARTUP,
    )
    .expect("a worker with an advertise address starts");
    let (ok, out, err) = sluice(&["status", "--dispatcher", addr]);
    assert!(ok, "{err}");
    let port = worker.addr.rsplit_once(':').expect("host:port").1;
    assert!(
        out.contains(&format!("\"127.0.0.1:{port}\"")),
        "the worker is registered as 127.0.0.1:{port}: {out}"
    );
    let (ok, out, err) = sluice(&["read", "--dispatcher", addr, "--dataset", "range(3)"]);
    assert!(ok, "{err}");
    assert_eq!(sorted_ints(&json_lines(&out)), vec![0, 1, 2]);
}
