//! Pipelines over files sources, run: data roots checked when a file is opened, compressed
//! TFRecords read back, corrupt ones named.

use sluice_element::{pb, DatasetError, Element};
use sluice_formats::{DataRoots, FileAccess};
use sluice_pipeline::Dataset;

use crate::executor::{iterate, ExecOptions};

struct Rooted {
    _dir: tempfile::TempDir,
    base: std::path::PathBuf,
    access: FileAccess,
}

impl Rooted {
    fn new() -> Rooted {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(base.join("data")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        for file in ["data/a.txt", "data/b.txt", "outside/secret.txt"] {
            std::fs::write(base.join(file), "x\n").unwrap();
        }
        let roots = DataRoots::new([base.join("data")]).unwrap();
        Rooted {
            _dir: dir,
            base,
            access: FileAccess::Roots(roots),
        }
    }

    fn path(&self, rel: &str) -> String {
        self.base.join(rel).to_string_lossy().into_owned()
    }
}

fn with_files(files: Vec<String>) -> pb::DatasetDef {
    let mut def = Dataset::files("ignored").lines().into_def();
    let Some(pb::source::Kind::Files(fs)) = def.source.as_mut().unwrap().kind.as_mut() else {
        panic!("files source")
    };
    fs.files = files;
    def
}

#[test]
fn a_worker_pipeline_reads_allowed_files_and_fails_where_it_reaches_a_refused_one() {
    let rooted = Rooted::new();
    let secret = rooted.path("outside/secret.txt");
    let def = with_files(vec![rooted.path("data/a.txt"), secret.clone()]);
    let opts = ExecOptions {
        file_access: rooted.access.clone(),
        ..Default::default()
    };
    let got: Vec<_> = iterate(&def, &opts)
        .unwrap()
        .map(|e| {
            e.map(|e| e.to_json().to_string())
                .map_err(|e| e.to_string())
        })
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0], Ok("\"x\"".to_string()));
    let err = got[1].clone().unwrap_err();
    assert!(
        err.starts_with(&format!(
            "refused to read '{secret}': outside the data roots"
        )),
        "{err}"
    );
    // The user's own process reads both.
    let all: Vec<_> = iterate(&def, &Default::default()).unwrap().collect();
    assert!(all.iter().all(Result::is_ok), "{all:?}");
}

/// Writes `records` as one TFRecord stream, compressed as `compression` says.
fn write_tfrecords(
    path: &std::path::Path,
    records: &[Vec<u8>],
    compression: pb::RecordCompression,
) {
    use std::io::Write as _;
    let mut framed = sluice_formats::tfrecord::TfRecordWriter::new(Vec::new());
    for r in records {
        framed.write_record(r).unwrap();
    }
    let framed = framed.into_inner().unwrap();
    let bytes = match compression {
        pb::RecordCompression::None => framed,
        pb::RecordCompression::Gzip => {
            let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            z.write_all(&framed).unwrap();
            z.finish().unwrap()
        }
        pb::RecordCompression::Zlib => {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            z.write_all(&framed).unwrap();
            z.finish().unwrap()
        }
    };
    std::fs::write(path, bytes).unwrap();
}

fn read_all(def: &pb::DatasetDef) -> Vec<Result<Element, DatasetError>> {
    iterate(def, &ExecOptions::default()).unwrap().collect()
}

#[test]
fn compressed_tfrecords_read_back_in_file_order() {
    for compression in [
        pb::RecordCompression::None,
        pb::RecordCompression::Gzip,
        pb::RecordCompression::Zlib,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let records = |f: usize| -> Vec<Vec<u8>> {
            (0..300)
                .map(|i| format!("file {f} record {i}").into_bytes())
                .collect()
        };
        for f in 0..2 {
            write_tfrecords(
                &dir.path().join(format!("{f}.tfrecord")),
                &records(f),
                compression,
            );
        }
        let pattern = format!("{}/*.tfrecord", dir.path().display());
        let def = Dataset::files(&pattern)
            .tfrecord_compressed(compression)
            .into_def();
        let got: Vec<String> = read_all(&def)
            .into_iter()
            .map(|e| e.unwrap().to_json().as_str().unwrap().to_string())
            .collect();
        let want: Vec<String> = (0..2)
            .flat_map(records)
            .map(|r| String::from_utf8(r).unwrap())
            .collect();
        assert_eq!(got, want, "{compression:?}");
    }
}

#[test]
fn a_corrupt_compressed_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.tfrecord.gz");
    let name = path.to_string_lossy().into_owned();
    let records: Vec<Vec<u8>> = (0..50).map(|i| vec![i as u8; 100]).collect();

    // Plain records read as GZIP: not a gzip stream.
    write_tfrecords(&path, &records, pb::RecordCompression::None);
    let def = Dataset::files(&name)
        .tfrecord_compressed(pb::RecordCompression::Gzip)
        .into_def();
    let got = read_all(&def);
    assert_eq!(got.len(), 1);
    let err = got[0].as_ref().unwrap_err().to_string();
    assert!(err.starts_with(&format!("cannot read '{name}'")), "{err}");

    // GZIP records read without compression: the framing checksums catch it.
    write_tfrecords(&path, &records, pb::RecordCompression::Gzip);
    let def = Dataset::files(&name).tfrecord().into_def();
    let got = read_all(&def);
    assert!(matches!(
        got.last().unwrap(),
        Err(DatasetError::CorruptRecord { .. })
    ));

    // A truncated GZIP file: the records before the cut, then an error naming the file.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let def = Dataset::files(&name)
        .tfrecord_compressed(pb::RecordCompression::Gzip)
        .into_def();
    let got = read_all(&def);
    let err = got.last().unwrap().as_ref().unwrap_err().to_string();
    assert!(err.contains(&name), "{err}");
    assert!(got[..got.len() - 1].iter().all(Result::is_ok));
}
