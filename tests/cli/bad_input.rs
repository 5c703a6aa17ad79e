//! Bad input: a non-zero exit and one line on stderr naming the problem.

use crate::*;

fn one_line_error(args: &[&str]) -> String {
    let (ok, out, err) = sluice(args);
    assert!(!ok, "expected a failure: {args:?}");
    assert!(out.is_empty(), "printed {out:?}");
    let err = err.trim_end();
    assert!(!err.contains('\n'), "more than one line: {err:?}");
    err.to_string()
}

#[test]
fn bad_input_gets_a_one_line_error() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.as_str();

    let err = one_line_error(&[
        "read",
        "--dispatcher",
        addr,
        "--dataset",
        "range(10).batch(4",
    ]);
    assert_eq!(
        err,
        "error: invalid dataset expression at column 18: expected ')' or ',', found end of input"
    );
    let err = one_line_error(&[
        "read",
        "--dispatcher",
        addr,
        "--dataset",
        "range(10).map(cube)",
    ]);
    assert!(
        err.starts_with("error: unknown function 'cube' in map"),
        "{err}"
    );
    let err = one_line_error(&["read", "--dispatcher", addr, "--dataset-id", "404"]);
    assert!(err.starts_with("error: Dataset id 404 not found."), "{err}");
    let err = one_line_error(&[
        "read",
        "--dispatcher",
        addr,
        "--dataset",
        "range(3)",
        "--mode",
        "sideways",
    ]);
    assert!(err.contains("processing mode should be"), "{err}");
    let err = one_line_error(&[
        "read",
        "--dispatcher",
        addr,
        "--dataset",
        "range(3)",
        "--max-outstanding-requests",
        "0",
    ]);
    assert_eq!(
        err,
        "error: max_outstanding_requests must be positive or -1"
    );

    // Nothing was registered by any of it.
    let (ok, out, _) = sluice(&["status", "--dispatcher", addr]);
    assert!(ok);
    let status: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(status["datasets"], serde_json::json!([]));

    // A foreign data dir: refused, named, untouched.
    let foreign = tempfile::tempdir().expect("temp dir");
    std::fs::write(foreign.path().join("thesis.tex"), "mine").expect("write");
    let err = one_line_error(&[
        "dispatcher",
        "--data-dir",
        foreign.path().to_str().expect("utf-8"),
    ]);
    assert!(
        err.contains("is not a sluice journal") && err.contains("FORMAT"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(foreign.path()).expect("dir").count(), 1);

    // The peer port serves Raft only: an admin's or client's request there is refused.
    let peer_addr = dispatcher
        .peer_addr
        .as_deref()
        .expect("READY names the peer port");
    let err = one_line_error(&["status", "--dispatcher", peer_addr]);
    assert!(err.contains("not implemented"), "{err}");
    let err = one_line_error(&[
        "admin",
        "add-node",
        "--dispatcher",
        peer_addr,
        "--id",
        "2",
        "--peer-addr",
        "127.0.0.1:1",
    ]);
    assert!(err.contains("not implemented"), "{err}");

    // Bad listener settings name the address.
    let fresh = tempfile::tempdir().expect("temp dir");
    let fresh_dir = fresh.path().to_str().expect("utf-8");
    let err = one_line_error(&[
        "dispatcher",
        "--data-dir",
        fresh_dir,
        "--advertise-address",
        "nowhere",
    ]);
    assert_eq!(err, "error: advertise address 'nowhere' is not HOST:PORT");
    let err = one_line_error(&[
        "dispatcher",
        "--data-dir",
        fresh_dir,
        "--peer-listen",
        peer_addr,
    ]);
    assert!(
        err.contains(&format!("bind peer address {peer_addr}")),
        "{err}"
    );
}

#[test]
fn a_definition_over_max_definition_size_is_refused_naming_the_flag() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &["--max-definition-size", "200"]);
    let addr = dispatcher.addr.as_str();
    let values: Vec<String> = (0..100).map(|i| i.to_string()).collect();
    let large = format!("from_slices([{}])", values.join(", "));
    let err = one_line_error(&["register", "--dispatcher", addr, "--dataset", &large]);
    assert!(err.contains("limit of 200 bytes"), "{err}");
    assert!(err.contains("--max-definition-size"), "{err}");
    let (ok, out, err) = sluice(&["register", "--dispatcher", addr, "--dataset", "range(10)"]);
    assert!(ok, "{err}");
    assert!(!out.trim().is_empty());
}
