//! One request must not kill the workers: long pipelines are refused at registration or run
//! (never overflow a worker's stack), and a task that crashes its worker fails its iteration
//! once instead of being handed to the next worker.

use crate::{bin, dispatcher, sluice, workers, workers_with, STARTUP};
use sluice_client::{ClientError, DispatcherClient, DispatcherClientExt, RegisterOptions};
use sluice_pipeline::{Dataset, Transform};
use sluice_tests::process::SluiceProcess;
use sluice_tests::{wait_until_blocking, HANG};

/// `range(10)` followed by `n` identity maps, as a dataset expression.
fn maps(n: usize) -> String {
    format!("range(10){}", ".map(identity)".repeat(n))
}

fn assert_running(workers: &mut [SluiceProcess]) {
    for (i, worker) in workers.iter_mut().enumerate() {
        assert_eq!(worker.exit_status(), None, "worker {i} died");
    }
}

#[test]
fn a_100000_op_pipeline_is_refused_and_a_9000_op_one_runs_with_every_worker_alive() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.as_str();
    let mut workers = workers(addr, 2);

    // Through the Rust API: 1.4 MB of expression is more than one command-line argument may be.
    let long = (0..100_000).fold(Dataset::range(10), |ds, _| ds.map("identity"));
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let refused = runtime.block_on(async {
        let client = DispatcherClient::new(addr).expect("a client");
        client
            .register_dataset(&long, &RegisterOptions::default())
            .await
    });
    match refused {
        Err(ClientError::InvalidArgument(message)) => assert_eq!(
            message,
            "the dataset definition has 100000 ops, more than the limit of 10000 \
             (--max-pipeline-ops)"
        ),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }

    // Parallel epochs: every element once per worker, through 9,000 ops on each.
    let (ok, out, err) = sluice(&["read", "--dispatcher", addr, "--dataset", &maps(9_000)]);
    assert!(ok, "{err}");
    let mut got = crate::sorted_ints(&crate::json_lines(&out));
    got.dedup();
    assert_eq!(got, (0..10).collect::<Vec<i64>>());
    assert_eq!(
        out.lines().count(),
        20,
        "ten elements from each of two workers"
    );
    assert_running(&mut workers);
}

#[test]
fn a_worker_configured_lower_than_the_dispatcher_fails_the_task_naming_its_limit() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.as_str();
    let mut workers = workers_with(addr, 1, &["--max-pipeline-ops", "100"]);
    let (ok, _, err) = sluice(&["read", "--dispatcher", addr, "--dataset", &maps(101)]);
    assert!(!ok);
    assert!(
        err.contains("101 ops, more than the limit of 100 (--max-pipeline-ops)"),
        "{err}"
    );
    assert_running(&mut workers);
}

/// The dispatcher's status as JSON.
fn status(addr: &str) -> serde_json::Value {
    let (ok, out, err) = sluice(&["status", "--dispatcher", addr]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).expect("status is JSON")
}

#[test]
fn a_task_that_aborts_its_worker_fails_its_iteration_once_instead_of_killing_the_next_worker() {
    // Only this test's processes (nextest runs each test in its own) know `abort_worker`.
    std::env::set_var("SLUICE_TEST_ABORT_FUNCTION", "1");
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.clone();
    let state_1 = data.path().join("worker-1");
    let state_2 = data.path().join("worker-2");
    let worker = |state: &std::path::Path| {
        let args = [
            "worker",
            "--dispatcher",
            &addr,
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            state.to_str().expect("utf-8 path"),
        ];
        SluiceProcess::spawn(bin(), &args, STARTUP).expect("worker started")
    };
    let mut w1 = worker(&state_1);

    tracing::info!("--- the task aborts the worker; the reader waits for the task to go on");
    let reader_addr = addr.clone();
    let reader = std::thread::spawn(move || {
        sluice(&[
            "read",
            "--dispatcher",
            &reader_addr,
            "--job-name",
            "crash",
            "--dataset",
            "range(10).map(abort_worker)",
        ])
    });
    wait_until_blocking("the worker to abort", HANG, || w1.exit_status().is_some()).unwrap();
    let crash = std::fs::read_to_string(state_1.join("crash")).expect("a crash record");
    assert!(crash.contains("signal SIGABRT"), "{crash}");

    tracing::info!("--- its restart reports the crash: the iteration fails, the reader says why");
    w1.restart(STARTUP).expect("worker restarted");
    let (ok, out, err) = reader.join().expect("reader thread");
    assert!(!ok, "the read ended without an error: {out}");
    assert!(err.contains("crashed worker"), "{err}");
    assert!(err.contains("(signal SIGABRT)"), "{err}");
    assert!(
        err.contains("the iteration is failed rather than run on another worker"),
        "{err}"
    );
    let failure = status(&addr)["iterations"][0]["failure"].clone();
    assert!(
        failure.as_str().is_some_and(|f| f.starts_with("task ")),
        "{failure}"
    );
    assert!(
        !state_1.join("crash").exists(),
        "the record is removed once reported"
    );

    tracing::info!("--- a worker that joins later gets no task of it; the same job fails again");
    let mut w2 = worker(&state_2);
    let (ok, _, err) = sluice(&[
        "read",
        "--dispatcher",
        &addr,
        "--job-name",
        "crash",
        "--dataset",
        "range(10).map(abort_worker)",
    ]);
    assert!(!ok);
    assert!(err.contains("crashed worker"), "{err}");
    let workers = status(&addr)["workers"].clone();
    let active: Vec<&serde_json::Value> = workers
        .as_array()
        .expect("a worker list")
        .iter()
        .flat_map(|w| w["active_tasks"].as_array().expect("active tasks"))
        .collect();
    assert!(active.is_empty(), "{workers}");

    tracing::info!("--- both workers are alive and serve other datasets");
    let (ok, out, err) = sluice(&["read", "--dispatcher", &addr, "--dataset", "range(5)"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 10);
    assert_eq!(w1.exit_status(), None, "the restarted worker died");
    assert_eq!(w2.exit_status(), None, "the worker that joined later died");
}
