//! `cache`: the first complete pass over the upstream is kept, and every later pass (a `repeat`
//! after the cache re-creates it) replays it instead of running the upstream again.
//!
//! - In memory (`filename` empty): the elements are held against the memory budget (op
//!   `cache`) for as long as the pipeline lives; a cache larger than the budget fails with
//!   `ResourceExhausted`.
//! - In a file: the pass is written to a temporary file beside `filename`, renamed to it only
//!   once the pass ended, so an interrupted or failed pass never leaves a partial cache; a pass
//!   that finds the file (this run's or an earlier one's) reads it instead of the upstream. On a
//!   worker the file must lie inside its data roots, like any file a pipeline names.
//!
//! A pass that is dropped before its end, or that met an error, completes nothing: the next
//! pass runs the upstream again, as tf.data discards an incomplete cache.
//!
//! The file format (Sluice's own): the magic `SLUICE-CACHE` and a version byte, then each
//! element as a little-endian u64 length and its `encode_element` bytes, then `u64::MAX` and
//! the number of elements.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sluice_element::{
    decode_element, encode_element, pb, Compression, DatasetError, Element, ElementIter,
};

use super::Factory;
use crate::executor::ExecOptions;
use crate::memory_budget::{element_bytes, Reservation};

const MAGIC: &[u8] = b"SLUICE-CACHE\x01";
/// The largest element a cache file may claim to hold (what a reader allocates at most).
const MAX_RECORD_BYTES: u64 = 1 << 32;

/// A `snapshot` op as the `cache` it runs: its file in the snapshot directory, named by the
/// fingerprint of `upstream`, the definition the op applies to (the SHA-256 of its encoding),
/// so each pipeline finds its own snapshot and no other's.
pub(crate) fn snapshot_as_cache(op: &pb::CacheOp, upstream: &pb::DatasetDef) -> pb::CacheOp {
    use prost::Message;
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(upstream.encode_to_vec());
    let name: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    pb::CacheOp {
        filename: Path::new(&op.filename)
            .join(format!("{name}.snapshot"))
            .to_string_lossy()
            .into_owned(),
        snapshot: false,
    }
}

/// The factory of a `cache` op over `upstream`.
pub(crate) fn cache_factory(
    upstream: Factory,
    op: &pb::CacheOp,
    opts: &ExecOptions,
) -> Result<Factory, DatasetError> {
    if op.filename.is_empty() {
        let filled: Arc<Mutex<Option<Filled>>> = Arc::default();
        let memory = opts.memory.clone();
        return Ok(Arc::new(move || {
            if let Some(f) = lock(&filled)?.as_ref() {
                return Ok(replay(f.elements.clone()));
            }
            Ok(Box::new(MemoryFill {
                input: upstream()?,
                buffer: Vec::new(),
                held: Some(Reservation::new(memory.clone(), "cache")),
                slot: filled.clone(),
                failed: false,
            }) as ElementIter)
        }));
    }
    let path = opts.file_access.resolve_writable(&op.filename)?;
    let shown = op.filename.clone();
    Ok(Arc::new(move || {
        if path.exists() {
            return Ok(Box::new(FileReplay::open(&path, &shown)?) as ElementIter);
        }
        Ok(Box::new(FileFill::create(upstream()?, &path, &shown)?) as ElementIter)
    }))
}

/// A completed memory cache and what it holds against the budget.
struct Filled {
    elements: Arc<Vec<Element>>,
    _held: Reservation,
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>, DatasetError> {
    m.lock()
        .map_err(|_| DatasetError::invalid("cache state lock poisoned"))
}

fn replay(elements: Arc<Vec<Element>>) -> ElementIter {
    Box::new((0..elements.len()).map(move |i| Ok(elements[i].clone())))
}

/// The first pass of a memory cache: passes elements on and keeps a copy.
struct MemoryFill {
    input: ElementIter,
    buffer: Vec<Element>,
    held: Option<Reservation>,
    slot: Arc<Mutex<Option<Filled>>>,
    failed: bool,
}

impl Iterator for MemoryFill {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.input.next() {
            Some(Ok(e)) => {
                if !self.failed {
                    if let Some(held) = &self.held {
                        if let Err(err) = held.grow(element_bytes(&e)) {
                            self.failed = true;
                            self.buffer = Vec::new();
                            held.clear();
                            return Some(Err(err));
                        }
                    }
                    self.buffer.push(e.clone());
                }
                Some(Ok(e))
            }
            Some(Err(err)) => {
                self.failed = true;
                self.buffer = Vec::new();
                if let Some(held) = &self.held {
                    held.clear();
                }
                Some(Err(err))
            }
            None => {
                if !self.failed {
                    if let (Some(held), Ok(mut slot)) = (self.held.take(), self.slot.lock()) {
                        if slot.is_none() {
                            *slot = Some(Filled {
                                elements: Arc::new(std::mem::take(&mut self.buffer)),
                                _held: held,
                            });
                        }
                    }
                }
                None
            }
        }
    }
}

/// The first pass of a file cache: passes elements on and writes them to a temporary file,
/// renamed to the cache's name at the end of a pass without errors; removed otherwise.
struct FileFill {
    input: ElementIter,
    out: Option<BufWriter<File>>,
    temp: PathBuf,
    path: PathBuf,
    shown: String,
    count: u64,
}

impl FileFill {
    fn create(input: ElementIter, path: &Path, shown: &str) -> Result<FileFill, DatasetError> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temp = path.with_file_name(format!(
            ".{name}.partial-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| DatasetError::io(shown, &e))?;
        let mut out = BufWriter::new(file);
        out.write_all(MAGIC)
            .map_err(|e| DatasetError::io(shown, &e))?;
        Ok(FileFill {
            input,
            out: Some(out),
            temp,
            path: path.to_path_buf(),
            shown: shown.to_string(),
            count: 0,
        })
    }

    fn abandon(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }

    fn write(&mut self, e: &Element) -> Result<(), std::io::Error> {
        if let Some(out) = self.out.as_mut() {
            let bytes = encode_element(e, Compression::None);
            out.write_all(&(bytes.len() as u64).to_le_bytes())?;
            out.write_all(&bytes)?;
            self.count += 1;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), std::io::Error> {
        let Some(mut out) = self.out.take() else {
            return Ok(());
        };
        out.write_all(&u64::MAX.to_le_bytes())?;
        out.write_all(&self.count.to_le_bytes())?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        // Another pass may have completed the same cache meanwhile: either file is whole.
        std::fs::rename(&self.temp, &self.path)
    }
}

impl Iterator for FileFill {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.input.next() {
            Some(Ok(e)) => {
                if let Err(err) = self.write(&e) {
                    self.abandon();
                    return Some(Err(DatasetError::io(&self.shown, &err)));
                }
                Some(Ok(e))
            }
            Some(Err(err)) => {
                self.abandon();
                Some(Err(err))
            }
            None => {
                if let Err(err) = self.finish() {
                    let _ = std::fs::remove_file(&self.temp);
                    return Some(Err(DatasetError::io(&self.shown, &err)));
                }
                None
            }
        }
    }
}

impl Drop for FileFill {
    fn drop(&mut self) {
        self.abandon();
    }
}

/// A later pass of a file cache: the file's elements, checked as they are read.
struct FileReplay {
    input: BufReader<File>,
    shown: String,
    count: u64,
    done: bool,
}

impl FileReplay {
    fn open(path: &Path, shown: &str) -> Result<FileReplay, DatasetError> {
        let file = File::open(path).map_err(|e| DatasetError::io(shown, &e))?;
        let mut input = BufReader::new(file);
        let mut magic = [0u8; MAGIC.len()];
        input
            .read_exact(&mut magic)
            .map_err(|_| corrupt(shown, "it is not a Sluice cache file"))?;
        if magic != MAGIC {
            return Err(corrupt(shown, "it is not a Sluice cache file"));
        }
        Ok(FileReplay {
            input,
            shown: shown.to_string(),
            count: 0,
            done: false,
        })
    }

    fn read_u64(&mut self) -> Result<u64, DatasetError> {
        let mut b = [0u8; 8];
        self.input
            .read_exact(&mut b)
            .map_err(|_| corrupt(&self.shown, "it ends early"))?;
        Ok(u64::from_le_bytes(b))
    }

    fn read_next(&mut self) -> Result<Option<Element>, DatasetError> {
        let len = self.read_u64()?;
        if len == u64::MAX {
            let count = self.read_u64()?;
            if count != self.count {
                return Err(corrupt(
                    &self.shown,
                    &format!("it says {count} elements but holds {}", self.count),
                ));
            }
            return Ok(None);
        }
        if len > MAX_RECORD_BYTES {
            return Err(corrupt(&self.shown, &format!("an element of {len} bytes")));
        }
        let mut buf = vec![0u8; len as usize];
        self.input
            .read_exact(&mut buf)
            .map_err(|_| corrupt(&self.shown, "it ends early"))?;
        self.count += 1;
        decode_element(&buf).map(Some)
    }
}

impl Iterator for FileReplay {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.read_next() {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(err) => {
                self.done = true;
                Some(Err(err))
            }
        }
    }
}

fn corrupt(shown: &str, why: &str) -> DatasetError {
    DatasetError::invalid(format!("cache file '{shown}' cannot be read: {why}"))
}
