//! Object-store sources through the real binary: dispatcher, workers and `sluice read` as
//! separate processes, with the S3 store's endpoint and credentials either in each one's
//! environment (inherited from this test's) or only in a settings file
//! (`--object-store-config`), and nothing of them in the dataset expression.

use crate::*;
use sluice_tests::{http, MotoServer, S3sFs};

const ROOT: &str = "s3://sluice-cli/data";

/// Reads `ROOT`'s TFRecord objects with `sluice read` as one distributed_epoch through the
/// dispatcher at `addr`, checks it gives `want` (sorted), and returns what it printed on stderr.
fn assert_reads_every_record(addr: &str, want: &[String]) -> String {
    let dataset = format!("files(\"{ROOT}/*.tfrecord\").tfrecord()");
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        addr,
        "--mode",
        "distributed_epoch",
        "--dataset",
        &dataset,
    ]);
    assert!(ok, "{err}");
    let mut got: Vec<String> = out.lines().map(str::to_string).collect();
    got.sort();
    assert_eq!(got, want);
    err
}

#[test]
fn a_glob_in_a_bucket_reads_with_credentials_from_the_environment_only() {
    let moto = MotoServer::start().expect("the moto S3 server");
    // This test's own process (nextest runs each test in one): the servers inherit it.
    for (name, value) in moto.env() {
        std::env::set_var(name, value);
    }
    moto.create_bucket("sluice-cli").expect("create the bucket");
    let mut want = Vec::new();
    for f in 0..3 {
        let records: Vec<String> = (0..4).map(|r| format!("file{f}-record{r}")).collect();
        want.extend(records.iter().map(|r| format!("\"{r}\"")));
        let bytes = sluice_tests::tfrecord_bytes(&records).expect("records");
        sluice_formats::write_object(&format!("{ROOT}/part-{f}.tfrecord"), bytes).expect("put");
    }
    sluice_formats::write_object("s3://sluice-cli/other/part-0.tfrecord", "x").expect("put");
    want.sort();

    let dir = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(dir.path(), &["--data-root", ROOT]);
    let _workers = workers_with(&dispatcher.addr, 2, &["--data-root", ROOT]);
    assert_reads_every_record(&dispatcher.addr, &want);

    let outside = "s3://sluice-cli/other/part-0.tfrecord";
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        &dispatcher.addr,
        "--dataset",
        &format!("files(\"{outside}\").tfrecord()"),
    ]);
    assert!(!ok, "{out}");
    assert!(
        err.contains(&format!(
            "refused to read '{outside}': outside the data roots ({ROOT})"
        )),
        "{err}"
    );
    assert!(!err.contains("testing-secret-key"), "{err}");
}

#[test]
fn workers_and_dispatcher_read_a_bucket_with_credentials_only_in_their_settings_file() {
    // No AWS variable in this process, so none in the servers it starts: s3s-fs checks every
    // request's signature, which only the settings file's key pair makes.
    for (name, _) in std::env::vars() {
        if name.starts_with("AWS_") {
            std::env::remove_var(name);
        }
    }
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let server = S3sFs::start().expect("the s3s-fs S3 server");
    server
        .create_bucket("sluice-cli")
        .expect("create the bucket");
    let dir = tempfile::tempdir().expect("temp dir");
    let (key_id, secret) = server.key_pair();
    std::fs::write(dir.path().join("s3-secret"), secret).expect("write the secret");
    let settings = dir.path().join("object-stores.json");
    let stores = serde_json::json!({"stores": {"s3://sluice-cli": {
        "endpoint": server.endpoint(),
        "allow_http": true,
        "region": "us-east-1",
        "access_key_id": key_id,
        "secret_access_key": {"file": "s3-secret"},
    }}});
    std::fs::write(&settings, stores.to_string()).expect("write the settings");
    // This process writes the objects with the same settings.
    sluice_formats::load_object_store_settings(&settings).expect("settings load");
    let mut want = Vec::new();
    for f in 0..8 {
        let records: Vec<String> = (0..5).map(|r| format!("file{f}-record{r}")).collect();
        let url = format!("{ROOT}/part-{f}.tfrecord");
        let bytes = sluice_tests::tfrecord_bytes(&records).expect("records");
        sluice_formats::write_object(&url, bytes).expect("put");
        want.extend(records.iter().map(|r| format!("\"{r}\"")));
    }
    want.sort();

    let config = settings.to_str().expect("utf-8 path");
    let common = ["--data-root", ROOT, "--object-store-config", config];
    let mut args = common.to_vec();
    args.extend(["--metrics-listen", "127.0.0.1:0"]);
    let dispatcher = dispatcher(dir.path(), &args);
    let _workers = workers_with(&dispatcher.addr, 2, &common);
    // `sluice read` lists the pattern itself (a client expands its patterns), from the same
    // file, named by the variable a client reads: the servers above started without it.
    std::env::set_var(sluice_formats::SETTINGS_ENV, config);
    let err = assert_reads_every_record(&dispatcher.addr, &want);

    assert!(!err.contains(secret), "{err}");

    let metrics = dispatcher
        .metrics_addr
        .as_deref()
        .expect("a metrics listener");
    for page in ["/status.json", "/"] {
        let (status, body) = http::get(metrics, page).expect("the status page");
        assert_eq!(status, 200, "{page}");
        assert!(!body.contains(secret), "{page}: {body}");
    }
}
