//! `sluice worker` beyond loopback: refused without TLS and authentication, naming why and the
//! way out; served with `--insecure`.

use crate::*;

#[test]
fn a_worker_beyond_loopback_needs_tls_and_a_token_or_insecure() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.as_str();

    let (ok, out, err) = sluice(&["worker", "--dispatcher", addr, "--listen", "0.0.0.0:0"]);
    assert!(!ok, "an unprotected worker on 0.0.0.0 started: {out}");
    assert!(out.is_empty(), "printed {out:?}");
    let err = err.trim_end();
    assert!(!err.contains('\n'), "more than one line: {err:?}");
    assert!(
        err.contains("refusing to serve the worker port on 0.0.0.0:")
            && err.contains("without TLS and authentication")
            && err.contains("--insecure"),
        "{err}"
    );

    let _worker = SluiceProcess::spawn(
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
    .expect("an --insecure worker starts");
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        addr,
        "--dataset",
        "range(10)",
        "--mode",
        "distributed_epoch",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    assert_exactly_once(&lines, 10);
}
