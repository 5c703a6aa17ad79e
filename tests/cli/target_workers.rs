//! Target workers and the cross-trainer cache through the CLI: a dispatcher, a worker tagged
//! COLOCATED and a plain worker, each its own process, so every worker is remote to the reader.

use crate::*;

fn worker(dispatcher: &str, extra: &[&str]) -> SluiceProcess {
    workers_with(dispatcher, 1, extra).remove(0)
}

/// The one-line error of `sluice read --dispatcher addr extra...`.
fn read_failure(addr: &str, extra: &[&str]) -> String {
    let mut args = vec!["read", "--dispatcher", addr];
    args.extend_from_slice(extra);
    failure(&args)
}

fn failure(args: &[&str]) -> String {
    let (ok, out, err) = sluice(args);
    assert!(!ok && out.is_empty(), "expected a failure: {args:?}: {out}");
    err.trim_end().to_string()
}

#[test]
fn remote_colocated_workers_are_skipped_and_trainers_share_a_cache() {
    let data = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(data.path(), &[]);
    let addr = dispatcher.addr.as_str();
    let _colocated = worker(addr, &["--tag", "COLOCATED"]);
    let _plain = worker(addr, &["--cross-trainer-cache-size", "64MiB"]);
    let read = |extra: &[&str]| {
        let mut args = vec!["read", "--dispatcher", addr];
        args.extend_from_slice(extra);
        let (ok, out, err) = sluice(&args);
        assert!(ok, "{args:?}: {err}");
        json_lines(&out)
    };

    // AUTO: the other host's colocated worker serves its own trainer; the epoch ends without it.
    let auto = read(&["--dataset", "range(10)"]);
    assert_eq!(sorted_ints(&auto), (0..10).collect::<Vec<_>>());
    let any = read(&["--dataset", "range(10)", "--target-workers", "ANY"]);
    assert_eq!(
        sorted_ints(&any),
        (0..10).flat_map(|i| [i, i]).collect::<Vec<_>>()
    );
    assert_eq!(
        read_failure(
            addr,
            &["--dataset", "range(10)", "--target-workers", "local"]
        ),
        "error: Local reads require local tf.data workers, but no local worker is found. You \
         need to run local tf.data service workers in your training workers."
    );
    assert_eq!(
        read_failure(
            addr,
            &["--dataset", "range(10)", "--target-workers", "sideways"]
        ),
        "error: Unrecognized target workers: sideways"
    );

    // Two trainers of one job read the same elements (from the plain worker: AUTO).
    for trainer in ["a", "b"] {
        let got = read(&[
            "--dataset",
            "range(1000000).repeat()",
            "--job-name",
            "cached",
            "--trainer-id",
            trainer,
            "--take",
            "5",
        ]);
        let got: Vec<i64> = got.iter().filter_map(|v| v.as_i64()).collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4], "trainer {trainer}");
    }
    assert_eq!(
        read_failure(
            addr,
            &[
                "--dataset",
                "range(1000000).repeat()",
                "--job-name",
                "cached",
                "--cross-trainer-cache"
            ]
        ),
        "error: tf.data service cross-trainer cache requires a non-empty trainer ID."
    );
    assert_eq!(
        read_failure(
            addr,
            &[
                "--dataset",
                "range(10)",
                "--job-name",
                "finite",
                "--trainer-id",
                "a"
            ]
        ),
        "error: Cross-trainer caching requires the input dataset to be infinite. Got input with \
         cardinality 10"
    );
}
