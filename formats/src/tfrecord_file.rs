//! `TfRecordFile`: a TFRecord file being written, plain or compressed as a whole (GZIP, ZLIB),
//! as TensorFlow's `TFRecordWriter` writes them, so that files written here read back through a
//! files source with the same compression, and in TensorFlow. For tests and data generation.
//!
//! A compressed stream is only complete after `finish`: dropping the writer without it may leave
//! a truncated file, which readers report as corrupt.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use flate2::write::{GzEncoder, ZlibEncoder};
use sluice_element::pb;

use crate::tfrecord::TfRecordWriter;

/// A TFRecord file being written.
pub struct TfRecordFile {
    records: TfRecordWriter<Sink>,
}

enum Sink {
    Plain(BufWriter<File>),
    Gzip(GzEncoder<BufWriter<File>>),
    Zlib(ZlibEncoder<BufWriter<File>>),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Plain(w) => w.write(buf),
            Sink::Gzip(w) => w.write(buf),
            Sink::Zlib(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.flush(),
            Sink::Gzip(w) => w.flush(),
            Sink::Zlib(w) => w.flush(),
        }
    }
}

impl TfRecordFile {
    /// Creates (truncates) `path`.
    pub fn create(path: impl AsRef<Path>, compression: pb::RecordCompression) -> io::Result<Self> {
        let file = BufWriter::new(File::create(path)?);
        let level = flate2::Compression::default();
        let sink = match compression {
            pb::RecordCompression::None => Sink::Plain(file),
            pb::RecordCompression::Gzip => Sink::Gzip(GzEncoder::new(file, level)),
            pb::RecordCompression::Zlib => Sink::Zlib(ZlibEncoder::new(file, level)),
        };
        Ok(TfRecordFile {
            records: TfRecordWriter::new(sink),
        })
    }

    pub fn write_record(&mut self, data: &[u8]) -> io::Result<()> {
        self.records.write_record(data)
    }

    /// Ends the compressed stream (if any) and flushes the file.
    pub fn finish(self) -> io::Result<()> {
        match self.records.into_inner()? {
            Sink::Plain(mut w) => w.flush(),
            Sink::Gzip(w) => w.finish()?.flush(),
            Sink::Zlib(w) => w.finish()?.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_access::FileAccess;
    use crate::files::file_elements;
    use sluice_pipeline::source_rules::Reading;

    #[test]
    fn written_files_read_back_with_their_compression() {
        let dir = tempfile::tempdir().unwrap();
        for compression in [
            pb::RecordCompression::None,
            pb::RecordCompression::Gzip,
            pb::RecordCompression::Zlib,
        ] {
            let path = dir.path().join(format!("{compression:?}.tfrecord"));
            let mut f = TfRecordFile::create(&path, compression).unwrap();
            for r in [&b"a"[..], b"", b"ccc"] {
                f.write_record(r).unwrap();
            }
            f.finish().unwrap();
            let got: Vec<String> = file_elements(
                path.to_string_lossy().into_owned(),
                Reading::TfRecord(compression),
                &FileAccess::Unrestricted,
                &sluice_element::OriginCell::default(),
            )
            .map(|e| e.unwrap().to_json().as_str().unwrap().to_string())
            .collect();
            assert_eq!(got, ["a", "", "ccc"], "{compression:?}");
        }
    }
}
