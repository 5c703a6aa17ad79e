//! The rules of a definition's sources that need no data: the length of a range, how a files
//! source's files are read (`Reading`), and whether its file list is filled in (expansion, which
//! reads directories, is `sluice-formats`' `expand_files`).

use sluice_element::{pb, DatasetError};

/// Number of elements of `range(start, stop, step)`; 0 for step 0 (rejected by `validate`).
pub fn range_len(start: i64, stop: i64, step: i64) -> u64 {
    let (start, stop, step) = (start as i128, stop as i128, step as i128);
    let n = if step > 0 && stop > start {
        (stop - start + step - 1) / step
    } else if step < 0 && stop < start {
        (start - stop - step - 1) / -step
    } else {
        0
    };
    n as u64
}

/// Whether `def` (or a dataset nested in it) has a files source whose list is filled in.
pub fn has_file_list(def: &pb::DatasetDef) -> bool {
    let mut found = false;
    crate::nested::walk(def, |d, _| {
        found |= matches!(
            d.source.as_ref().and_then(|s| s.kind.as_ref()),
            Some(pb::source::Kind::Files(fs)) if !fs.files.is_empty()
        );
    });
    found
}

/// The error for a files source whose file list is not filled in where it must be.
pub fn not_expanded(fs: &pb::FilesSource) -> DatasetError {
    DatasetError::invalid(format!(
        "files source '{}' is not expanded (expand_files runs at registration)",
        fs.pattern
    ))
}

/// How the files of a files source are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    Lines,
    TfRecord(pb::RecordCompression),
    /// Not read: each file's name is its one element.
    Names,
}

impl Reading {
    /// Refuses compression on text lines: only TFRecord files are read compressed.
    pub fn from_proto(fs: &pb::FilesSource) -> Result<Reading, DatasetError> {
        match (fs.format(), fs.compression()) {
            (pb::FileFormat::Tfrecord, c) => Ok(Reading::TfRecord(c)),
            (pb::FileFormat::Lines | pb::FileFormat::Unspecified, pb::RecordCompression::None) => {
                Ok(Reading::Lines)
            }
            (pb::FileFormat::Names, pb::RecordCompression::None) => Ok(Reading::Names),
            (_, c) => Err(DatasetError::invalid(format!(
                "files source '{}': compression {} applies to tfrecord files only",
                fs.pattern,
                c.as_str_name()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_lengths() {
        for (start, stop, step, want) in [
            (0, 10, 1, 10),
            (0, 100, 3, 34),
            (5, 0, 1, 0),
            (10, 0, -3, 4),
            (0, 0, 1, 0),
            (i64::MIN, i64::MAX, i64::MAX, 3),
        ] {
            assert_eq!(
                range_len(start, stop, step),
                want,
                "range({start}, {stop}, {step})"
            );
        }
    }
}
