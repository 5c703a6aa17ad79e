//! A dispatcher's data dir through the binary: a missing or empty one is refused unless the
//! start says `--init` or `--join`, and a journal is refused to any other node or cluster;
//! each refusal is one line naming the dir (and the `IDENTITY` file) and saying what to do.

use crate::*;

/// `sluice <args>` fails with one line on stderr and prints nothing on stdout; returns it.
fn refusal(args: &[&str]) -> String {
    let (ok, out, err) = sluice(args);
    assert!(!ok, "expected a refusal: {args:?}");
    assert!(out.is_empty(), "printed {out:?}");
    let err = err.trim_end();
    assert!(!err.contains('\n'), "more than one line: {err:?}");
    err.to_string()
}

#[test]
fn a_missing_or_empty_data_dir_is_refused_without_init_or_join() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let missing = tmp.path().join("lost");
    let missing_dir = missing.to_str().expect("utf-8");
    let err = refusal(&["dispatcher", "--data-dir", missing_dir]);
    assert_eq!(
        err,
        format!(
            "error: data dir {missing_dir} holds no journal: it does not exist; pass --init on \
             the first start of a new quorum, or --join to wait to be added with `sluice admin \
             add-node`; a replica that lost its data dir may rejoin only as a new member: \
             remove it with `sluice admin remove-node`, then start it with --join and add it"
        )
    );
    assert!(!missing.exists(), "a refused start made the data dir");

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let empty_dir = empty.to_str().expect("utf-8");
    let err = refusal(&["dispatcher", "--id", "2", "--data-dir", empty_dir]);
    assert!(
        err.starts_with(&format!(
            "error: data dir {empty_dir} holds no journal: it is empty; pass --init"
        )),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&empty).expect("dir").count(), 0);

    // A usage error: clap's several lines, with the usage.
    let (ok, _, err) = sluice(&["dispatcher", "--data-dir", empty_dir, "--init", "--join"]);
    assert!(!ok);
    assert!(
        err.contains("'--init' cannot be used with '--join'"),
        "{err}"
    );
    let err = refusal(&[
        "dispatcher",
        "--data-dir",
        empty_dir,
        "--init",
        "--cluster-id",
        "my cluster",
    ]);
    assert!(
        err.contains("cluster id \"my cluster\" may only hold letters, digits"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&empty).expect("dir").count(), 0);
}

#[test]
fn a_journal_serves_only_its_own_node_and_cluster() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let data = tmp.path().join("n1");
    let data_dir = data.to_str().expect("utf-8");
    let first = [
        "dispatcher",
        "--init",
        "--cluster-id",
        "prod",
        "--data-dir",
        data_dir,
    ];
    let mut node = SluiceProcess::spawn(bin(), &first, STARTUP).expect("first start");
    let (ok, out, err) = sluice(&[
        "register",
        "--dispatcher",
        &node.addr,
        "--dataset",
        "range(3)",
    ]);
    assert!(ok, "{out} {err}");
    // A restart needs no flag; its journal still has the dataset.
    node.restart(STARTUP).expect("a restart without --init");
    let (ok, out, err) = sluice(&["status", "--dispatcher", &node.addr]);
    assert!(ok, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        status["datasets"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );
    node.kill();

    let identity = data.join("IDENTITY");
    for (extra, who) in [
        (
            &["--id", "2", "--cluster-id", "prod"][..],
            "cluster 'prod' node 2",
        ),
        (&["--cluster-id", "staging"][..], "cluster 'staging' node 1"),
        (
            &["--cluster-id", "staging", "--init"][..],
            "cluster 'staging' node 1",
        ),
        (&["--id", "3", "--join"][..], "cluster 'sluice' node 3"),
    ] {
        let mut args = vec!["dispatcher", "--data-dir", data_dir];
        args.extend_from_slice(extra);
        let err = refusal(&args);
        assert_eq!(
            err,
            format!(
                "error: data dir {data_dir} belongs to cluster 'prod' node 1 (recorded in {}), \
                 not to {who}; start each replica with its own data dir and the --id and \
                 --cluster-id its journal was created with",
                identity.display()
            ),
            "{extra:?}"
        );
    }
}
