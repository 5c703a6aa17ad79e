//! Tests of reading lines and records of one file, with and without data roots, and the limit on
//! line length.

use sluice_pipeline::Dataset;

use super::*;
use crate::rooted::Rooted;

#[test]
fn lines_strip_newlines_and_missing_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.txt");
    std::fs::write(&path, "one\r\ntwo\n\nthree").unwrap();
    let got: Vec<_> = file_elements(
        path.to_string_lossy().into_owned(),
        Reading::Lines,
        &FileAccess::Unrestricted,
        &OriginCell::default(),
    )
    .map(|e| e.unwrap().to_json())
    .collect();
    assert_eq!(got, ["one", "two", "", "three"]);
    let missing = dir
        .path()
        .join("missing.txt")
        .to_string_lossy()
        .into_owned();
    let got: Vec<_> = file_elements(
        missing.clone(),
        Reading::Lines,
        &FileAccess::Unrestricted,
        &OriginCell::default(),
    )
    .collect();
    assert_eq!(got.len(), 1);
    let err = got[0].as_ref().unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("cannot read '{missing}'")),
        "{err}"
    );
}

#[test]
fn a_file_is_checked_again_when_it_is_opened() {
    let rooted = Rooted::new();
    let read = |path: String| -> Vec<Result<String, String>> {
        file_elements(path, Reading::Lines, &rooted.access, &OriginCell::default())
            .map(|e| {
                e.map(|e| e.to_json().to_string())
                    .map_err(|e| e.to_string())
            })
            .collect()
    };
    assert_eq!(read(rooted.path("data/a.txt")), [Ok("\"x\"".to_string())]);
    let secret = rooted.path("outside/secret.txt");
    let got = read(secret.clone());
    assert_eq!(got.len(), 1);
    let err = got[0].clone().unwrap_err();
    assert!(
        err.starts_with(&format!(
            "refused to read '{secret}': outside the data roots"
        )),
        "{err}"
    );
    let got: Vec<_> = file_elements(
        secret,
        Reading::TfRecord(pb::RecordCompression::None),
        &rooted.access,
        &OriginCell::default(),
    )
    .collect();
    assert!(
        matches!(&got[..], [Err(DatasetError::FileRefused { .. })]),
        "{got:?}"
    );
}

#[test]
fn a_line_longer_than_the_limit_is_an_error_naming_file_line_and_limit() {
    // Every line at the limit passes, with either newline; the first longer one stops the file.
    let text = b"abcd\nabcd\r\nab\nabcde\nnever\n".to_vec();
    let got: Vec<_> = Lines::new(&text[..], "f.txt".into(), 4)
        .map(|e| {
            e.map(|e| e.to_json().to_string())
                .map_err(|e| e.to_string())
        })
        .collect();
    assert_eq!(
        got,
        [
            Ok("\"abcd\"".to_string()),
            Ok("\"abcd\"".to_string()),
            Ok("\"ab\"".to_string()),
            Err("line 4 of 'f.txt' is longer than 4 bytes, the maximum line length".to_string()),
        ]
    );
    // A last line without a newline, at the limit and past it.
    let got: Vec<_> = Lines::new(&b"abcd"[..], "f.txt".into(), 4).collect();
    assert!(matches!(&got[..], [Ok(_)]), "{got:?}");
    let got: Vec<_> = Lines::new(&b"abcdef"[..], "f.txt".into(), 4).collect();
    assert!(
        matches!(
            &got[..],
            [Err(DatasetError::LineTooLong {
                line: 1,
                limit: 4,
                ..
            })]
        ),
        "{got:?}"
    );
}

#[test]
fn dev_zero_read_as_lines_ends_with_an_error_not_an_endless_line() {
    let got: Vec<_> = file_elements(
        "/dev/zero".into(),
        Reading::Lines,
        &FileAccess::Unrestricted,
        &OriginCell::default(),
    )
    .collect();
    assert_eq!(
        got.last().unwrap().as_ref().unwrap_err().to_string(),
        format!(
            "line 1 of '/dev/zero' is longer than {MAX_LINE_BYTES} bytes, the maximum line length"
        )
    );
}

#[test]
fn compression_applies_to_tfrecord_files_only() {
    let mut def = Dataset::files("x/*.txt").lines().into_def();
    if let Some(pb::source::Kind::Files(fs)) = def.source.as_mut().and_then(|s| s.kind.as_mut()) {
        fs.compression = pb::RecordCompression::Gzip as i32;
    }
    assert_eq!(
        sluice_pipeline::validate(&def, &sluice_pipeline::FunctionRegistry::new())
            .unwrap_err()
            .to_string(),
        "files source 'x/*.txt': compression GZIP applies to tfrecord files only"
    );
}
