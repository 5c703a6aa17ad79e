//! `sluice worker --python`: a worker whose Python executors cannot start does not start.

use crate::sluice;

#[test]
fn a_worker_with_a_missing_interpreter_refuses_to_start_naming_it() {
    let (ok, _, err) = sluice(&[
        "worker",
        "--dispatcher",
        "127.0.0.1:1",
        "--python",
        "/nonexistent/python3",
        "--python-executors",
        "1",
    ]);
    assert!(!ok);
    assert!(
        err.contains("cannot start Python executor `/nonexistent/python3 -m sluice._executor`"),
        "{err}"
    );
}

#[test]
fn python_executors_need_an_interpreter() {
    let (ok, _, err) = sluice(&[
        "worker",
        "--dispatcher",
        "127.0.0.1:1",
        "--python-executors",
        "2",
    ]);
    assert!(!ok);
    assert!(err.contains("--python <PATH>"), "{err}");
}
