//! `sluice read` options through the binary: epochs, counting, the `service` address forms, and
//! two coordinated consumers in lockstep.

use crate::*;

#[test]
fn epochs_count_addresses_and_coordinated_consumers() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.clone();
    let _workers = workers(&addr, 1);

    // Each epoch is a new iteration; `grpc://` is the default protocol spelled out.
    let service = format!("grpc://{addr}");
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        &service,
        "--dataset",
        "range(3)",
        "--epochs",
        "2",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, "0\n1\n2\n0\n1\n2\n");
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        &addr,
        "--dataset",
        "range(1000)",
        "--count",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, "{\"elements\":1000}\n");

    for (service, want) in [
        (
            format!("grp://{addr}"),
            "No credentials factory has been registered for protocol grp",
        ),
        (
            format!("grpc://grpc://{addr}"),
            "Malformed `service` string has multiple '://'",
        ),
        (" ".to_string(), "`service` must not be empty"),
    ] {
        let (ok, _, err) = sluice(&["read", "--dispatcher", &service, "--dataset", "range(3)"]);
        assert!(!ok);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "{service}: {err}");
    }

    // Two coordinated consumers: at every step they read consecutive elements of one round.
    let readers: Vec<Reader> = (0..2)
        .map(|c| {
            Reader::start(&[
                "--dispatcher",
                &addr,
                "--dataset",
                "range(1000000).repeat()",
                "--job-name",
                "rr",
                "--consumer-index",
                &c.to_string(),
                "--num-consumers",
                "2",
                "--take",
                "20",
            ])
        })
        .collect();
    let mut outputs = Vec::new();
    for reader in readers {
        let (ok, lines) = reader.finish(Vec::new(), STARTUP * 2);
        assert!(ok);
        outputs.push(
            lines
                .iter()
                .map(|l| l.parse::<i64>().expect("an integer"))
                .collect::<Vec<_>>(),
        );
    }
    for step in 0..20 {
        assert_eq!(outputs[0][step] % 2, 0, "step {step}: {outputs:?}");
        assert_eq!(
            outputs[1][step],
            outputs[0][step] + 1,
            "step {step}: {outputs:?}"
        );
    }
}

/// Runs `sluice <args>` with stdout a pipe whose reading end is already closed, as when the
/// command's output goes to `head` that has exited: (success, stderr).
fn with_stdout_closed(args: &[&str]) -> (bool, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let output = std::process::Command::new(bin())
        .args(args)
        .stdout(writer)
        .output()
        .expect("run sluice");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_ends_read_status_and_register_quietly() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.clone();
    let _workers = workers(&addr, 1);
    for args in [
        vec!["read", "--dispatcher", &addr, "--dataset", "range(1000000)"],
        vec!["status", "--dispatcher", &addr],
        vec!["register", "--dispatcher", &addr, "--dataset", "range(3)"],
    ] {
        let (ok, err) = with_stdout_closed(&args);
        assert!(ok, "sluice {} failed: {err}", args[0]);
        assert_eq!(err, "", "sluice {} printed on stderr", args[0]);
    }
}
