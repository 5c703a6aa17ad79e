//! File sources: glob expansion at registration (`expand_files`) and reading one file's elements
//! as text lines or TFRecords.
//!
//! The expansion is done once, where the definition is registered, and stored in the definition
//! (`FilesSource.files`) so every worker and dispatcher replica sees the same sorted list; split
//! `i` of a files source is file `i`. Files are opened lazily, so a missing file is an `Err`
//! element (naming the file) at the point the pipeline reaches it.

use std::fs::File;
use std::io::{BufRead, BufReader};

use bytes::Bytes;

use crate::element::Element;
use crate::error::DatasetError;
use crate::executor::ElementIter;
use crate::pb;
use crate::tensor::Tensor;
use crate::tfrecord::TfRecordReader;

/// Fills `files` of a files source from its glob `pattern`, sorted, as absolute paths (workers
/// may run in another directory). A no-op for other sources or an already expanded list.
pub fn expand_files(def: &mut pb::DatasetDef) -> Result<(), DatasetError> {
    let Some(pb::Source {
        kind: Some(pb::source::Kind::Files(fs)),
    }) = def.source.as_mut()
    else {
        return Ok(());
    };
    if !fs.files.is_empty() {
        return Ok(());
    }
    let entries = glob::glob(&fs.pattern).map_err(|e| {
        DatasetError::invalid(format!("invalid file pattern '{}': {}", fs.pattern, e.msg))
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| DatasetError::io(&e.path().to_string_lossy(), e.error()))?;
        if path.is_dir() {
            continue;
        }
        let path = std::path::absolute(&path).unwrap_or(path);
        files.push(path.to_string_lossy().into_owned());
    }
    if files.is_empty() {
        return Err(DatasetError::invalid(format!(
            "no files match pattern '{}'",
            fs.pattern
        )));
    }
    files.sort();
    fs.files = files;
    Ok(())
}

/// The elements of one file, opened on first use.
pub(crate) fn file_elements(path: String, format: pb::FileFormat) -> ElementIter {
    match format {
        pb::FileFormat::Tfrecord => Box::new(Lazy::Pending(path, open_tfrecord)),
        pb::FileFormat::Lines | pb::FileFormat::Unspecified => {
            Box::new(Lazy::Pending(path, open_lines))
        }
    }
}

fn open_tfrecord(path: &str) -> Result<ElementIter, DatasetError> {
    let reader = TfRecordReader::open(path)?;
    Ok(Box::new(reader.map(|r| {
        r.map(|b| Element::Tensor(Tensor::scalar_string(b)))
    })))
}

fn open_lines(path: &str) -> Result<ElementIter, DatasetError> {
    let f = File::open(path).map_err(|e| DatasetError::io(path, &e))?;
    Ok(Box::new(Lines {
        reader: BufReader::with_capacity(256 * 1024, f),
        path: path.to_string(),
        done: false,
    }))
}

/// Opens on the first `next`, then delegates; an open error is yielded once.
enum Lazy {
    Pending(String, fn(&str) -> Result<ElementIter, DatasetError>),
    Open(ElementIter),
    Done,
}

impl Iterator for Lazy {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Lazy::Pending(path, open) = self {
            match open(path) {
                Ok(it) => *self = Lazy::Open(it),
                Err(e) => {
                    *self = Lazy::Done;
                    return Some(Err(e));
                }
            }
        }
        match self {
            Lazy::Open(it) => it.next(),
            Lazy::Pending(..) | Lazy::Done => None,
        }
    }
}

/// Lines without their `\n` or `\r\n`; a last line without a newline counts.
struct Lines {
    reader: BufReader<File>,
    path: String,
    done: bool,
}

impl Iterator for Lines {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut line = Vec::new();
        match self.reader.read_until(b'\n', &mut line) {
            Ok(0) => {
                self.done = true;
                None
            }
            Ok(_) => {
                if line.last() == Some(&b'\n') {
                    line.pop();
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                }
                Some(Ok(Element::Tensor(Tensor::scalar_string(Bytes::from(
                    line,
                )))))
            }
            Err(e) => {
                self.done = true;
                Some(Err(DatasetError::io(&self.path, &e)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Dataset;

    #[test]
    fn expansion_is_sorted_and_skips_directories() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.txt", "a.txt", "c.csv"] {
            std::fs::write(dir.path().join(name), "x\n").unwrap();
        }
        std::fs::create_dir(dir.path().join("d.txt")).unwrap();
        let pattern = format!("{}/*.txt", dir.path().display());
        let mut def = Dataset::files(&pattern).lines().into_def();
        expand_files(&mut def).unwrap();
        let Some(pb::source::Kind::Files(fs)) = def.source.unwrap().kind else {
            panic!("files source")
        };
        let names: Vec<_> = fs
            .files
            .iter()
            .map(|f| f.rsplit('/').next().unwrap().to_string())
            .collect();
        assert_eq!(names, ["a.txt", "b.txt"]);
        assert!(fs
            .files
            .iter()
            .all(|f| std::path::Path::new(f).is_absolute()));
    }

    #[test]
    fn expansion_errors() {
        let dir = tempfile::tempdir().unwrap();
        let pattern = format!("{}/*.none", dir.path().display());
        let mut def = Dataset::files(&pattern).lines().into_def();
        assert_eq!(
            expand_files(&mut def).unwrap_err().to_string(),
            format!("no files match pattern '{pattern}'")
        );
        let mut def = Dataset::files("a/***/b").lines().into_def();
        assert!(expand_files(&mut def)
            .unwrap_err()
            .to_string()
            .starts_with("invalid file pattern 'a/***/b'"));
    }

    #[test]
    fn lines_strip_newlines_and_missing_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, "one\r\ntwo\n\nthree").unwrap();
        let got: Vec<_> = file_elements(path.to_string_lossy().into_owned(), pb::FileFormat::Lines)
            .map(|e| e.unwrap().to_json())
            .collect();
        assert_eq!(got, ["one", "two", "", "three"]);
        let missing = dir
            .path()
            .join("missing.txt")
            .to_string_lossy()
            .into_owned();
        let got: Vec<_> = file_elements(missing.clone(), pb::FileFormat::Lines).collect();
        assert_eq!(got.len(), 1);
        let err = got[0].as_ref().unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("cannot read '{missing}'")),
            "{err}"
        );
    }
}
