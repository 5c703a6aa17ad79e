//! `parse_example` on GZIP-compressed TFRecord files of `tf.train.Example` records, through the
//! binary: the expression syntax, the workers' native parsing, and an error naming the feature
//! and the file and record it is missing from.

use std::collections::BTreeMap;

use crate::*;
use sluice_element::{pb, Tensor};
use sluice_formats::{serialize_example, TfRecordFile};

fn example(label: Option<i64>, tags: &[i64]) -> Vec<u8> {
    let mut features = BTreeMap::new();
    if let Some(label) = label {
        features.insert("label".to_string(), Tensor::scalar_i64(label));
    }
    let tags = Tensor::from_i64s(vec![tags.len()], tags).expect("a 1-D tensor");
    features.insert("tags".to_string(), tags);
    serialize_example(&features).expect("an example")
}

fn write(path: &std::path::Path, records: &[Vec<u8>]) {
    let mut f = TfRecordFile::create(path, pb::RecordCompression::Gzip).expect("create file");
    for r in records {
        f.write_record(r).expect("write record");
    }
    f.finish().expect("finish file");
}

#[test]
fn parse_example_reads_gzip_tfrecords_through_the_workers() {
    let data = tempfile::tempdir().expect("temp dir");
    for f in 0..2i64 {
        let records: Vec<Vec<u8>> = (0..3)
            .map(|i| example(Some(3 * f + i), &vec![f; i as usize]))
            .collect();
        write(&data.path().join(format!("{f}.tfrecord.gz")), &records);
    }
    let bad = data.path().join("bad.gz");
    write(&bad, &[example(Some(9), &[]), example(None, &[1])]);
    let root = data.path().to_str().expect("utf-8");
    let dispatcher = dispatcher(data.path(), &["--data-root", root]);
    let _workers = workers_with(&dispatcher.addr, 1, &["--data-root", root]);

    let features = ".parse_example(label=fixed(int64), tags=var(int64))";
    let dataset =
        format!("files(\"{root}/*.tfrecord.gz\").tfrecord(compression=\"GZIP\"){features}");
    let (ok, out, err) = sluice(&[
        "read",
        "--dispatcher",
        &dispatcher.addr,
        "--dataset",
        &dataset,
        "--mode",
        "distributed_epoch",
    ]);
    assert!(ok, "{err}");
    let mut got: Vec<String> = out.lines().map(str::to_string).collect();
    got.sort();
    assert_eq!(
        got,
        [
            r#"{"label":0,"tags":[]}"#,
            r#"{"label":1,"tags":[0]}"#,
            r#"{"label":2,"tags":[0,0]}"#,
            r#"{"label":3,"tags":[]}"#,
            r#"{"label":4,"tags":[1]}"#,
            r#"{"label":5,"tags":[1,1]}"#,
        ]
    );

    let dataset = format!("files(\"{root}/bad.gz\").tfrecord(compression=\"GZIP\"){features}");
    let (ok, _, err) = sluice(&[
        "read",
        "--dispatcher",
        &dispatcher.addr,
        "--dataset",
        &dataset,
    ]);
    assert!(!ok);
    // The worker names the file by its canonical path, as its data roots resolve it.
    let bad = std::fs::canonicalize(&bad).expect("canonical path");
    let want = format!(
        "record 1 (0-based) of '{}': parse_example: feature 'label' is missing from the record \
         and has no default value",
        bad.display()
    );
    assert!(err.contains(&want), "{err}");
}
