//! Errors of per-element ops that name the file and record of the element, where that is exact.

use std::collections::{BTreeMap, VecDeque};
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use sluice_element::{pb, DatasetError, Element, Tensor};
use sluice_formats::{serialize_example, TfRecordFile};
use sluice_pipeline::parse;

use crate::executor::{iterate, ExecOptions};
use crate::splits::SplitSupplier;

fn png() -> Vec<u8> {
    let img = image::RgbImage::from_fn(3, 2, |x, y| image::Rgb([x as u8, y as u8, 7]));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn write(path: &Path, records: &[Vec<u8>], compression: pb::RecordCompression) -> String {
    let mut f = TfRecordFile::create(path, compression).unwrap();
    for r in records {
        f.write_record(r).unwrap();
    }
    f.finish().unwrap();
    path.to_string_lossy().into_owned()
}

fn example(feature: &str) -> Vec<u8> {
    serialize_example(&BTreeMap::from([(
        feature.to_string(),
        Tensor::scalar_i64(1),
    )]))
    .unwrap()
}

/// The first error of `expr`'s elements, as text.
fn first_error(expr: &str, opts: &ExecOptions) -> String {
    let def = parse(expr).unwrap().into_def();
    let mut def = def;
    sluice_formats::expand_files(&mut def, &opts.file_access).unwrap();
    iterate(&def, opts)
        .unwrap()
        .find_map(|r: Result<Element, DatasetError>| r.err())
        .unwrap_or_else(|| panic!("{expr}: no error"))
        .to_string()
}

#[test]
fn a_failing_op_names_the_file_and_record_only_where_that_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let good = png();
    let images = write(
        &dir.path().join("images.tfrecord"),
        &[
            good.clone(),
            good.clone(),
            b"not an image".to_vec(),
            good.clone(),
        ],
        pb::RecordCompression::None,
    );
    let zipped = write(
        &dir.path().join("images.tfrecord.gz"),
        &[good.clone(), b"not an image".to_vec()],
        pb::RecordCompression::Gzip,
    );
    let examples = write(
        &dir.path().join("examples.tfrecord"),
        &[example("label"), example("other"), example("label")],
        pb::RecordCompression::None,
    );
    let lines = dir.path().join("lines.txt");
    std::fs::write(&lines, "not\nimages\n").unwrap();
    let lines = lines.to_string_lossy().into_owned();
    let records = format!("files(\"{images}\").tfrecord()");
    let decode_failed = "decode_image failed: ";
    let at = |origin: &str| format!("{origin}: {decode_failed}");
    let rec2 = at(&format!("record 2 (0-based) of '{images}'"));
    for (expr, want) in [
        (format!("{records}.decode_image()"), rec2.clone()),
        // One in, at most one out, in order: the cell is exact.
        (
            format!("{records}.skip(1).take(3).decode_image()"),
            rec2.clone(),
        ),
        (
            format!("{records}.map(identity).shard(1, 0).decode_image()"),
            rec2.clone(),
        ),
        (format!("{records}.repeat(2).decode_image()"), rec2.clone()),
        (
            format!("{records}.prefetch(0).decode_image()"),
            rec2.clone(),
        ),
        (
            format!("{records}.decode_image().prefetch(2)"),
            rec2.clone(),
        ),
        (
            format!("{records}.decode_image().resize(1, 1)"),
            rec2.clone(),
        ),
        (
            format!("files(\"{zipped}\").tfrecord(compression=\"GZIP\").decode_image()"),
            at(&format!("record 1 (0-based) of '{zipped}'")),
        ),
        (
            format!("files(\"{lines}\").lines().decode_image()"),
            at(&format!("line 1 of '{lines}'")),
        ),
        (
            format!("files(\"{examples}\").tfrecord().parse_example(label=fixed(int64))"),
            format!(
                "record 1 (0-based) of '{examples}': parse_example: feature 'label' is missing"
            ),
        ),
        // The source runs ahead of the op: no origin rather than a wrong one.
        (
            format!("{records}.prefetch(2).decode_image()"),
            decode_failed.to_string(),
        ),
        (
            format!("{records}.shuffle(4, seed=1).decode_image()"),
            decode_failed.to_string(),
        ),
    ] {
        let got = first_error(&expr, &ExecOptions::default());
        assert!(
            got.starts_with(&want),
            "{expr}:\n got  {got}\n want {want}..."
        );
    }
}

/// Hands out the given splits of repetition 0.
struct Splits(std::sync::Mutex<VecDeque<u64>>);

impl SplitSupplier for Splits {
    fn next_split(&self, _provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
        Ok(match repetition {
            0 => self.0.lock().unwrap().pop_front(),
            _ => None,
        })
    }
}

#[test]
fn in_distributed_epoch_mode_the_record_counts_within_the_split_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = png();
    write(
        &dir.path().join("0.tfrecord"),
        &[good.clone(), good.clone()],
        pb::RecordCompression::None,
    );
    let bad = write(
        &dir.path().join("1.tfrecord"),
        &[good.clone(), b"not an image".to_vec()],
        pb::RecordCompression::None,
    );
    let opts = ExecOptions {
        splits: Some(Arc::new(Splits(std::sync::Mutex::new(VecDeque::from([
            0, 1,
        ]))))),
        ..ExecOptions::default()
    };
    let expr = format!(
        "files(\"{}/*.tfrecord\").tfrecord().decode_image()",
        dir.path().display()
    );
    let got = first_error(&expr, &opts);
    let want = format!("record 1 (0-based) of '{bad}': decode_image failed: ");
    assert!(got.starts_with(&want), "got  {got}\nwant {want}...");
}
