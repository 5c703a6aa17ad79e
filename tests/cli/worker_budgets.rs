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
        // Alone on the worker, the task may hold the budget less its reserve (an eighth).
        assert!(
            err.contains(&format!("{op} of task "))
                && err.contains("needs 72 more bytes")
                && err.contains("memory budget of 1048576 bytes (917504: the budget less 131072")
                && err.contains("raise --memory-budget"),
            "{dataset}: {err}"
        );
    }

    let (ok, out, err) = sluice(&["read", "--dispatcher", addr, "--dataset", "range(5)"]);
    assert!(ok, "{err}");
    assert_eq!(sorted_ints(&json_lines(&out)), vec![0, 1, 2, 3, 4]);
}

/// One job's buffers cannot fail another's small ones: while a job holds all a task may hold of
/// an 8 MiB budget (7 MiB: the budget less its reserve) in a shuffle buffer, a small job's batches
/// succeed. A second big job then finds the budget full: it is refused naming the first job's
/// task, which is past its fair share of two, and that task is failed to give its bytes back,
/// after which the second job reads.
#[test]
fn a_small_jobs_batch_succeeds_while_another_job_holds_all_its_share() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.as_str();
    let _workers = workers_with(
        addr,
        1,
        &["--memory-budget", "8MiB", "--memory-reserve", "1MiB"],
    );
    // 100,000 int64 scalars at 72 bytes each: 7.2 MB, within the 7 MiB (7,340,032 bytes).
    let big = "range(1000000000000).shuffle(100000, seed=1)";

    let holder = Reader::start(&["--dispatcher", addr, "--dataset", big, "--rate", "1"]);
    // The shuffle yields its first element once its buffer is full.
    holder
        .lines
        .recv_timeout(STARTUP)
        .expect("the big job yields once its buffer is full");

    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        addr,
        "--dataset",
        "range(10).batch(2)",
    ]);
    assert!(ok, "the small job failed: {err}");
    assert_eq!(json_lines(&out).len(), 5, "{out}");

    // A second big job: its first element, once its shuffle buffer is full.
    let read_big = || {
        sluice(&[
            "read",
            "--dispatcher",
            addr,
            "--dataset",
            big,
            "--take",
            "1",
        ])
    };
    let (ok, out, err) = read_big();
    assert!(!ok, "a second big job fit beside the first: {out}");
    assert!(
        err.contains("the memory budget of 8388608 bytes is full, and task ")
            && err.contains("more than its fair share of 3670016 (2 holders)"),
        "{err}"
    );
    // The first job's task is failed for it, and its pipeline drops its buffer: the second job
    // reads once that has happened (its reader, slowed to an element a second, still prints
    // what it had received before).
    sluice_tests::wait_until_blocking("the second big job to read", sluice_tests::HANG, || {
        read_big().0
    })
    .expect("the first job gave its memory back");
    drop(holder);
}

/// A task that filled the budget and failed gives its memory back to the system, not only to
/// the budget: the worker's resident size falls back near where it started.
#[test]
fn a_worker_gives_back_the_memory_of_a_failed_task() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.as_str();
    let workers = workers_with(addr, 1, &["--memory-budget", "256MiB"]);
    let pid = workers[0].pid().expect("a running worker");
    let before = proc_status_mib(pid, "VmRSS");
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        addr,
        "--dataset",
        "range(1000000000000).batch(1000000000000)",
    ]);
    assert!(!ok, "{out}");
    assert!(err.contains("raise --memory-budget"), "{err}");
    let peak = proc_status_mib(pid, "VmHWM");
    assert!(
        peak > before + 150.0,
        "the batch held {peak:.0} MiB at most"
    );
    sluice_tests::wait_until_blocking(
        "the worker to give the batch back",
        sluice_tests::HANG,
        || proc_status_mib(pid, "VmRSS") < before + 50.0,
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {:.0} MiB resident, {before:.0} before",
            proc_status_mib(pid, "VmRSS")
        )
    });
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
