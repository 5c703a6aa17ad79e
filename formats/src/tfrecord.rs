//! The TFRecord file format, byte-compatible with TensorFlow's:
//!
//! ```text
//! u64 length (little-endian) | u32 masked crc32c(length bytes) | data | u32 masked crc32c(data)
//! ```
//!
//! with `mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`. The reader never trusts a length
//! before its checksum matched, and reads data incrementally, so a garbage length cannot make it
//! allocate gigabytes. Every framing error is `CorruptRecord` naming the file and the byte offset
//! of the record it was reading.

use std::fs::File;
use std::io::{self, Read, Write};

use bytes::Bytes;
use sluice_element::DatasetError;

const MASK_DELTA: u32 = 0xa282_ead8;
const HEADER_LEN: usize = 12;

/// The longest record a reader yields, in bytes: a larger length is refused before any of its
/// data is read. Far above a serialized `tf.train.Example` of images.
pub(crate) const MAX_RECORD_BYTES: u64 = 256 << 20;

/// TensorFlow's masked crc32c.
pub(crate) fn masked_crc32c(data: &[u8]) -> u32 {
    // `rotate_right(15)` is the format's `(crc >> 15) | (crc << 17)`.
    crc32c::crc32c(data)
        .rotate_right(15)
        .wrapping_add(MASK_DELTA)
}

/// Writes records in the TFRecord framing (for tests and data generation).
pub struct TfRecordWriter<W: Write> {
    inner: W,
}

impl TfRecordWriter<BufWriterFile> {
    /// Creates (truncates) `path`.
    pub fn create(path: impl AsRef<std::path::Path>) -> io::Result<Self> {
        Ok(TfRecordWriter::new(io::BufWriter::new(File::create(path)?)))
    }
}

/// The buffered file a `TfRecordWriter::create` writes to.
pub(crate) type BufWriterFile = io::BufWriter<File>;

impl<W: Write> TfRecordWriter<W> {
    pub fn new(inner: W) -> Self {
        TfRecordWriter { inner }
    }

    pub fn write_record(&mut self, data: &[u8]) -> io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.inner.write_all(&len)?;
        self.inner.write_all(&masked_crc32c(&len).to_le_bytes())?;
        self.inner.write_all(data)?;
        self.inner.write_all(&masked_crc32c(data).to_le_bytes())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// Flushes and returns the underlying writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.inner.flush()?;
        Ok(self.inner)
    }
}

/// Iterates the records of one TFRecord stream. Ends after the first error.
pub(crate) struct TfRecordReader<R: Read> {
    inner: R,
    /// The file name errors report.
    file: String,
    /// Byte offset of the next record.
    offset: u64,
    /// The longest record yielded.
    max_record: u64,
    done: bool,
}

impl<R: Read> TfRecordReader<R> {
    pub fn new(inner: R, file: &str) -> Self {
        TfRecordReader {
            inner,
            file: file.to_string(),
            offset: 0,
            max_record: MAX_RECORD_BYTES,
            done: false,
        }
    }

    /// The same reader with another bound on a record's length than [`MAX_RECORD_BYTES`].
    #[cfg(test)]
    pub fn with_max_record_bytes(mut self, max: u64) -> Self {
        self.max_record = max;
        self
    }

    fn corrupt(&self, reason: String) -> DatasetError {
        DatasetError::CorruptRecord {
            file: self.file.clone(),
            offset: self.offset,
            reason,
        }
    }

    /// Fills `buf` as far as the stream allows; returns how many bytes were read.
    fn read_full(&mut self, buf: &mut [u8]) -> Result<usize, DatasetError> {
        let mut n = 0;
        while n < buf.len() {
            match self.inner.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(DatasetError::io(&self.file, &e)),
            }
        }
        Ok(n)
    }

    fn read_record(&mut self) -> Result<Option<Bytes>, DatasetError> {
        let mut header = [0u8; HEADER_LEN];
        let n = self.read_full(&mut header)?;
        if n == 0 {
            return Ok(None);
        }
        if n < HEADER_LEN {
            return Err(self.corrupt(format!(
                "truncated record header: {n} of {HEADER_LEN} bytes"
            )));
        }
        let (len_bytes, crc_bytes) = header.split_at(8);
        let len_crc = u32::from_le_bytes(
            crc_bytes
                .try_into()
                .expect("split at 8 of 12 leaves 4 bytes"),
        );
        if masked_crc32c(len_bytes) != len_crc {
            return Err(self.corrupt("length checksum mismatch".to_string()));
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("split at 8 leaves 8 bytes"));
        if len > self.max_record {
            return Err(self.corrupt(format!(
                "a record of {len} bytes, more than the limit of {} bytes",
                self.max_record
            )));
        }
        let mut data = Vec::with_capacity(usize::try_from(len).unwrap_or(usize::MAX).min(1 << 20));
        let got = (&mut self.inner)
            .take(len)
            .read_to_end(&mut data)
            .map_err(|e| DatasetError::io(&self.file, &e))?;
        if (got as u64) < len {
            return Err(self.corrupt(format!("truncated record data: {got} of {len} bytes")));
        }
        let mut footer = [0u8; 4];
        let n = self.read_full(&mut footer)?;
        if n < 4 {
            return Err(self.corrupt(format!("truncated record checksum: {n} of 4 bytes")));
        }
        if masked_crc32c(&data) != u32::from_le_bytes(footer) {
            return Err(self.corrupt("data checksum mismatch".to_string()));
        }
        self.offset += HEADER_LEN as u64 + len + 4;
        Ok(Some(Bytes::from(data)))
    }
}

impl<R: Read> Iterator for TfRecordReader<R> {
    type Item = Result<Bytes, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.read_record() {
            Ok(Some(b)) => Some(Ok(b)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(records: &[&[u8]]) -> Vec<u8> {
        let mut w = TfRecordWriter::new(Vec::new());
        for r in records {
            w.write_record(r).unwrap();
        }
        w.into_inner().unwrap()
    }

    fn read(buf: &[u8]) -> Vec<Result<Bytes, DatasetError>> {
        TfRecordReader::new(buf, "f.tfrecord").collect()
    }

    #[test]
    fn known_crc_value() {
        // crc32c("123456789") = 0xe3069283 (the standard check value); masked by hand.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn round_trip() {
        let buf = encode(&[b"hello", b"", b"world!"]);
        assert_eq!(buf.len(), 3 * 16 + 11);
        let got: Vec<Bytes> = read(&buf).into_iter().map(Result::unwrap).collect();
        assert_eq!(
            got,
            vec![Bytes::from("hello"), Bytes::new(), Bytes::from("world!")]
        );
        assert!(read(&[]).is_empty());
    }

    #[test]
    fn corruption_names_the_record_offset() {
        let mut buf = encode(&[b"hello", b"world"]);
        let second = 16 + 5;
        buf[second + 12] ^= 0xff; // first data byte of record 2
        let got = read(&buf);
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[1].as_ref().unwrap_err().to_string(),
            "corrupt record in 'f.tfrecord' at byte offset 21: data checksum mismatch"
        );

        let mut buf = encode(&[b"hello"]);
        buf[0] = 0xff; // length no longer matches its checksum
        let err = read(&buf).remove(0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "corrupt record in 'f.tfrecord' at byte offset 0: length checksum mismatch"
        );
    }

    #[test]
    fn truncation_is_corruption() {
        let buf = encode(&[b"hello", b"world"]);
        for cut in [buf.len() - 1, buf.len() - 6, 21 + 5] {
            let got = read(&buf[..cut]);
            assert_eq!(got.len(), 2, "cut at {cut}");
            match &got[1] {
                Err(DatasetError::CorruptRecord { offset, reason, .. }) => {
                    assert_eq!(*offset, 21);
                    assert!(reason.starts_with("truncated"), "{reason}");
                }
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    /// A header with a valid checksum whose length is past the limit.
    fn header(len: u64) -> Vec<u8> {
        let len = len.to_le_bytes();
        [&len[..], &masked_crc32c(&len).to_le_bytes()].concat()
    }

    #[test]
    fn a_record_past_the_limit_is_refused_before_its_data_is_read() {
        let err = read(&header(MAX_RECORD_BYTES + 1)).remove(0).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "corrupt record in 'f.tfrecord' at byte offset 0: a record of {} bytes, more than \
                 the limit of {MAX_RECORD_BYTES} bytes",
                MAX_RECORD_BYTES + 1
            )
        );
    }

    /// A compressed stream inflates to far more than its size: a record's length is checked
    /// before the reader keeps what it inflates to.
    #[test]
    fn a_compressed_record_past_the_limit_is_not_inflated() {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&header(1 << 20)).unwrap();
        gz.write_all(&vec![0u8; 1 << 20]).unwrap();
        let file = gz.finish().unwrap();
        let inflating = flate2::read::MultiGzDecoder::new(&file[..]);
        let mut reader =
            TfRecordReader::new(inflating, "f.tfrecord.gz").with_max_record_bytes(4096);
        let err = reader.next().unwrap().unwrap_err();
        assert!(
            err.to_string()
                .contains("more than the limit of 4096 bytes"),
            "{err}"
        );
        assert!(reader.next().is_none());
    }
}
