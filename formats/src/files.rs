//! File sources: reading one file's elements as text lines or TFRecords, the latter optionally
//! GZIP- or ZLIB-compressed as TensorFlow writes them (the whole file is one compressed stream
//! around the record framing, so the record checksums still guard every record and byte offsets
//! in errors count decompressed bytes). The list of files is `expand`'s.
//!
//! Files are opened lazily, so a missing file is an `Err` element (naming the file) at the point
//! the pipeline reaches it. On a server (`FileAccess::Roots`) every path passes the data roots
//! again just before the file is opened (it passed them at expansion too), since a worker must
//! not trust that the dispatcher's roots are its own. A text line is at most `MAX_LINE_BYTES`
//! long: the bound protects a server from its clients.
//!
//! A file named by an object-store URL (`s3://bucket/key`) is checked against the URL roots and
//! streamed from its store (see `objstore`); its records and lines read as a local file's.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use bytes::Bytes;
use flate2::read::{MultiGzDecoder, ZlibDecoder};
use sluice_element::{pb, DatasetError, Element, ElementIter, OriginCell, RecordPosition, Tensor};
use sluice_pipeline::source_rules::Reading;

use crate::file_access::FileAccess;
use crate::tfrecord::TfRecordReader;

/// The longest text line `lines()` yields, in bytes without its newline. A longer line (or a
/// file without newlines, such as `/dev/zero`) is an error rather than a buffer that grows
/// until the process runs out of memory.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// The elements of one file, opened on first use, after `access` allowed it. Each element's
/// position is written to `origin` just before it is yielded.
pub fn file_elements(
    path: String,
    reading: Reading,
    access: &FileAccess,
    origin: &OriginCell,
) -> ElementIter {
    let Some(open) = opener(reading) else {
        return name_element(path, access, origin);
    };
    Box::new(Lazy::Pending(path, open, access.clone(), origin.clone()))
}

/// The elements of one file, as `file_elements` yields them, with an object's stream started
/// now: its request is sent and its first bytes read ahead while the files before it are read,
/// so they are there when its turn comes. Anything that refuses or fails the file (a path outside
/// the data roots, a missing object) is still its first element, at its turn, with the same
/// text. A local file is opened at its turn, as `file_elements` opens it (opening it early gains
/// nothing: the system reads ahead on its own). Dropping the iterator stops the object's stream.
pub fn file_elements_started(
    path: String,
    reading: Reading,
    access: &FileAccess,
    origin: &OriginCell,
) -> ElementIter {
    let Some(open) = opener(reading) else {
        return name_element(path, access, origin);
    };
    if !crate::object_url::is_object_url(&path) {
        return Box::new(Lazy::Pending(path, open, access.clone(), origin.clone()));
    }
    let opening = access
        .resolve_url(&path)
        .and_then(|url| start_object(&url, &path));
    Box::new(Lazy::Started(path, open, opening, origin.clone()))
}

/// How a file read as `reading` is opened; `None` for names, which are not opened.
fn opener(reading: Reading) -> Option<Opener> {
    Some(match reading {
        Reading::TfRecord(pb::RecordCompression::None) => open_tfrecord,
        Reading::TfRecord(pb::RecordCompression::Gzip) => open_tfrecord_gzip,
        Reading::TfRecord(pb::RecordCompression::Zlib) => open_tfrecord_zlib,
        Reading::Lines => open_lines,
        Reading::Names => return None,
    })
}

/// Reads `path` (as named to the user) from `file`, opened after the access check allowed it.
type Opener = fn(&str, Box<dyn Read + Send>, &OriginCell) -> Result<ElementIter, DatasetError>;

/// An object whose stream was started ahead of its turn; calling it waits for the store's first
/// answer.
type Opening = Box<dyn FnOnce() -> Result<Box<dyn Read + Send>, DatasetError> + Send>;

/// Opens `path` as `access` allows: a local file at its checked path, or an object's stream.
fn open_checked(path: &str, access: &FileAccess) -> Result<Box<dyn Read + Send>, DatasetError> {
    if crate::object_url::is_object_url(path) {
        let url = access.resolve_url(path)?;
        return start_object(&url, path)?();
    }
    let resolved = access.resolve(path)?;
    let f = File::open(resolved).map_err(|e| DatasetError::io(path, &e))?;
    Ok(Box::new(f))
}

/// Starts the object's stream; the returned call waits for the store's first answer.
#[cfg(feature = "object-store")]
fn start_object(url: &crate::object_url::ObjectUrl, path: &str) -> Result<Opening, DatasetError> {
    let started = crate::objstore::start(url, path)?;
    Ok(Box::new(move || {
        Ok(Box::new(started.wait()?) as Box<dyn Read + Send>)
    }))
}

#[cfg(not(feature = "object-store"))]
fn start_object(_url: &crate::object_url::ObjectUrl, path: &str) -> Result<Opening, DatasetError> {
    Err(DatasetError::invalid(format!(
        "this process reads no object stores (built without the object-store feature), so it \
         cannot read '{path}'"
    )))
}

const READ_BUFFER: usize = 256 * 1024;

fn open_tfrecord(
    path: &str,
    file: Box<dyn Read + Send>,
    origin: &OriginCell,
) -> Result<ElementIter, DatasetError> {
    open_tfrecord_as(path, file, origin, pb::RecordCompression::None)
}

fn open_tfrecord_gzip(
    path: &str,
    file: Box<dyn Read + Send>,
    origin: &OriginCell,
) -> Result<ElementIter, DatasetError> {
    open_tfrecord_as(path, file, origin, pb::RecordCompression::Gzip)
}

fn open_tfrecord_zlib(
    path: &str,
    file: Box<dyn Read + Send>,
    origin: &OriginCell,
) -> Result<ElementIter, DatasetError> {
    open_tfrecord_as(path, file, origin, pb::RecordCompression::Zlib)
}

fn open_tfrecord_as(
    path: &str,
    file: Box<dyn Read + Send>,
    origin: &OriginCell,
    compression: pb::RecordCompression,
) -> Result<ElementIter, DatasetError> {
    Ok(records(inflated(file, compression), path, origin))
}

/// A TFRecord file's record stream, buffered: the file's bytes as they are, or inflated. A gzip
/// file's concatenated members read as one stream, as gzip itself reads them.
pub(crate) fn inflated(
    file: impl Read + Send + 'static,
    compression: pb::RecordCompression,
) -> BufReader<Box<dyn Read + Send>> {
    let stream: Box<dyn Read + Send> = match compression {
        pb::RecordCompression::None => Box::new(file),
        pb::RecordCompression::Gzip => Box::new(MultiGzDecoder::new(BufReader::with_capacity(
            READ_BUFFER,
            file,
        ))),
        pb::RecordCompression::Zlib => Box::new(ZlibDecoder::new(BufReader::with_capacity(
            READ_BUFFER,
            file,
        ))),
    };
    BufReader::with_capacity(READ_BUFFER, stream)
}

/// The records of a (decompressed) stream as scalar strings. A decompression error surfaces
/// as a read error naming the file.
pub(crate) fn records(
    stream: impl Read + Send + 'static,
    path: &str,
    origin: &OriginCell,
) -> ElementIter {
    let reader = TfRecordReader::new(stream, path);
    let elements = reader.map(|r| r.map(|b| Element::Tensor(Tensor::scalar_string(b))));
    tracked(elements, path, origin, RecordPosition::Record)
}

/// A file's name as its one element (the file is not opened; `access` allowed its path).
/// A file's name as its one element, once `access` allowed the path (the file or object is
/// not opened: an op after it reads it).
fn name_element(path: String, access: &FileAccess, origin: &OriginCell) -> ElementIter {
    let access = access.clone();
    let checked = std::iter::once(()).map(move |()| {
        if crate::object_url::is_object_url(&path) {
            access.resolve_url(&path)?;
        } else {
            access.resolve(&path)?;
        }
        Ok((
            path.clone(),
            Element::Tensor(Tensor::scalar_string(Bytes::from(path.clone()))),
        ))
    });
    let origin = origin.clone();
    Box::new(
        checked.map(move |r: Result<(String, Element), DatasetError>| {
            r.map(|(path, name)| {
                origin.set(&Arc::from(path.as_str()), RecordPosition::Record(0));
                name
            })
        }),
    )
}

fn open_lines(
    path: &str,
    file: Box<dyn Read + Send>,
    origin: &OriginCell,
) -> Result<ElementIter, DatasetError> {
    let lines = Lines::new(file, path.to_string(), MAX_LINE_BYTES);
    Ok(tracked(lines, path, origin, |i| {
        RecordPosition::Line(i + 1)
    }))
}

/// `elements`, writing the position of each to `origin` as it is yielded. The i-th element
/// (from 0) is at `position(i)`: both readers end at their first error, so every item before
/// it is an element.
fn tracked(
    elements: impl Iterator<Item = Result<Element, DatasetError>> + Send + 'static,
    path: &str,
    origin: &OriginCell,
    position: fn(u64) -> RecordPosition,
) -> ElementIter {
    let (file, origin): (Arc<str>, _) = (Arc::from(path), origin.clone());
    Box::new((0u64..).zip(elements).map(move |(i, r)| {
        if r.is_ok() {
            origin.set(&file, position(i));
        }
        r
    }))
}

/// Opens on the first `next`, then delegates; a refusal or open error is yielded once.
enum Lazy {
    Pending(String, Opener, FileAccess, OriginCell),
    /// Its object's stream already started (or refused: the error waits for the first `next`).
    Started(String, Opener, Result<Opening, DatasetError>, OriginCell),
    Open(ElementIter),
    Done,
}

impl Iterator for Lazy {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Lazy::Open(it) = self {
            return it.next();
        }
        let opened = match std::mem::replace(self, Lazy::Done) {
            Lazy::Pending(path, open, access, origin) => {
                Some(open_checked(&path, &access).and_then(|file| open(&path, file, &origin)))
            }
            Lazy::Started(path, open, opening, origin) => Some(
                opening
                    .and_then(|wait| wait())
                    .and_then(|file| open(&path, file, &origin)),
            ),
            other => {
                *self = other;
                None
            }
        };
        match opened {
            Some(Ok(it)) => *self = Lazy::Open(it),
            Some(Err(e)) => return Some(Err(e)),
            None => {}
        }
        match self {
            Lazy::Open(it) => it.next(),
            Lazy::Pending(..) | Lazy::Started(..) | Lazy::Done => None,
        }
    }
}

/// Lines without their `\n` or `\r\n`; a last line without a newline counts. A line longer
/// than `max_len` ends the file with an error.
struct Lines<R> {
    reader: BufReader<R>,
    path: String,
    max_len: usize,
    /// Lines read so far (the 1-based number of the last one).
    line: u64,
    done: bool,
}

impl<R: Read> Lines<R> {
    fn new(file: R, path: String, max_len: usize) -> Self {
        Lines {
            reader: BufReader::with_capacity(256 * 1024, file),
            path,
            max_len,
            line: 0,
            done: false,
        }
    }
}

impl<R: Read> Iterator for Lines<R> {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut line = Vec::new();
        // At most the longest allowed line and its `\r\n`: a longer line is known to be too
        // long without reading it whole.
        let bound = self.max_len as u64 + 2;
        match (&mut self.reader).take(bound).read_until(b'\n', &mut line) {
            Ok(0) => {
                self.done = true;
                None
            }
            Ok(_) => {
                self.line += 1;
                if line.last() == Some(&b'\n') {
                    line.pop();
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                }
                if line.len() > self.max_len {
                    self.done = true;
                    return Some(Err(DatasetError::LineTooLong {
                        path: self.path.clone(),
                        line: self.line,
                        limit: self.max_len,
                    }));
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
#[path = "files_tests.rs"]
mod tests;
