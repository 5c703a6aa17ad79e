//! Object-store sources through the real binary: dispatcher, workers and `sluice read` as
//! separate processes, each with the S3 store's endpoint and credentials in its environment
//! (inherited from this test's) and nothing of them in the dataset expression.

use crate::*;
use sluice_formats::tfrecord::TfRecordWriter;
use sluice_tests::MotoServer;

const ROOT: &str = "s3://sluice-cli/data";

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
        let mut writer = TfRecordWriter::new(Vec::new());
        for r in 0..4 {
            let record = format!("file{f}-record{r}");
            writer.write_record(record.as_bytes()).expect("write");
            want.push(format!("\"{record}\""));
        }
        let bytes = writer.into_inner().expect("records");
        sluice_formats::write_object(&format!("{ROOT}/part-{f}.tfrecord"), bytes).expect("put");
    }
    sluice_formats::write_object("s3://sluice-cli/other/part-0.tfrecord", "x").expect("put");
    want.sort();

    let dir = tempfile::tempdir().expect("temp dir");
    let dispatcher = dispatcher(dir.path(), &["--data-root", ROOT]);
    let _workers = workers_with(&dispatcher.addr, 2, &["--data-root", ROOT]);
    let dataset = format!("files(\"{ROOT}/*.tfrecord\").tfrecord()");
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        &dispatcher.addr,
        "--mode",
        "distributed_epoch",
        "--dataset",
        &dataset,
    ]);
    assert!(ok, "{err}");
    let mut got: Vec<String> = out.lines().map(str::to_string).collect();
    got.sort();
    assert_eq!(got, want);

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
