//! Large payloads through shared memory, for a raw fetch stream whose reader runs on the
//! worker's machine. Over loopback TCP, each payload is copied into the kernel by the worker
//! and out of it by the reader, and the TCP stack runs for every segment in between: for a
//! stream of 48 KiB images, most of what the worker and the reader spend per element. Through
//! a region, the worker copies it in and the reader copies it out, and no TCP segment is made.
//!
//! How a stream comes to use one:
//! 1. The reader asks in its first request (`FetchRequest.shared_memory`).
//! 2. A worker that lets local readers share memory, to a reader connected from its own
//!    machine, answers with a frame that only offers a region (`ElementBatch.region`): a sealed
//!    memory file of its own ([`sluice_shm::MemFile`]) with its process id and descriptor,
//!    whose first bytes hold a random nonce.
//! 3. The reader opens `/proc/<pid>/fd/<fd>` and maps it. The kernel allows that only to a
//!    process of the worker's user, and the nonce, which only the stream's connection carried,
//!    shows it is the file the worker meant (another process in another PID namespace may have
//!    that id). It then says so in a request of its own (`FetchRequest.region_mapped`). A reader
//!    that cannot goes on reading over the socket, and says nothing.
//! 4. From then on, the worker puts payloads of [`MIN_PAYLOAD`] to [`MAX_PAYLOAD`] bytes into the
//!    region when it has room, and a frame names each payload's place
//!    (`ElementBatch.payload_offsets`; 0 for one whose bytes follow the header as before).
//!
//! Each stream has a region of its own, holding only that stream's elements, and drops it when
//! the stream ends.
//!
//! The region is a ring: after its header, each payload has a [`SLOT_HEAD`] of its own whose
//! first word is its state (`LENT`, then `FREE`), then its bytes. The worker writes a payload
//! where the last one ended, or back at the start when there is room before the oldest one still
//! lent, and never moves past a payload the reader has not freed; it frees the oldest payloads
//! whose words say `FREE` before each placement. The reader copies each payload out into a
//! buffer of its own as it reads its frame (its arrays are then its own, and writable, as
//! over the socket) and sets its word `FREE` at once. A ring with no room (more payloads in
//! flight than it holds) sends the next payloads over the socket until there is.
//!
//! The worker trusts nothing in the region: it only ever writes payload bytes and reads state
//! words, at places it chose itself. A reader that scribbles over the region spoils only its own
//! elements, and one whose words never say `FREE` gets its elements over the socket.

use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use sluice_proto::worker::RegionOffer;
use sluice_shm::{Mapping, MemFile};
use tonic::Status;

/// A region's size. Only the pages its payloads touch take memory, and placements go back to
/// the start whenever they fit there, so a reader that keeps up touches about twice what it
/// holds at once.
pub const REGION_BYTES: usize = 64 << 20;
/// The largest region a reader maps: a worker that offers more is not believed.
pub const MAX_OFFERED_BYTES: usize = 1 << 30;
/// Payloads smaller than this follow their header on the socket: copying them costs less than
/// their slot's round trip through the ring.
pub const MIN_PAYLOAD: usize = 4 << 10;
/// Payloads larger than this follow their header on the socket, so that a region holds several
/// of the largest it takes.
pub const MAX_PAYLOAD: usize = REGION_BYTES / 4;
/// The region's header (its magic and nonce), and each payload's head (its state word), are
/// this long, so that every payload starts on a cache line of its own.
pub const SLOT_HEAD: usize = 64;
/// The memory file's name, as `/proc/<pid>/fd/<fd>` links to it (`/memfd:sluice-fetch`).
const REGION_NAME: &std::ffi::CStr = c"sluice-fetch";
/// The region's first bytes, before its nonce.
const MAGIC: &[u8; 8] = b"SLUICERG";
const NONCE_BYTES: usize = 16;
/// A payload's state word while the reader may read it.
const LENT: u64 = 1;
/// A payload's state word once the reader is done with it.
const FREE: u64 = 0;

/// The worker's side: the region of one stream, and what of it the reader still holds.
pub struct RegionWriter {
    file: MemFile,
    nonce: [u8; NONCE_BYTES],
    /// Where the next payload goes when there is room after the newest one.
    next: usize,
    /// Where the slots of the payloads placed and not yet seen freed start, oldest first.
    live: VecDeque<usize>,
}

impl RegionWriter {
    pub fn create() -> io::Result<RegionWriter> {
        Self::with_size(REGION_BYTES)
    }

    /// A region of `size` bytes (tests use small ones).
    pub fn with_size(size: usize) -> io::Result<RegionWriter> {
        let file = MemFile::create(REGION_NAME, size, true)?;
        let nonce: [u8; NONCE_BYTES] = rand::random();
        // SAFETY: the file was just made; no other process has it yet.
        let header = unsafe { file.mapping().bytes_mut(0, MAGIC.len() + NONCE_BYTES) }
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "region too small"))?;
        header[..MAGIC.len()].copy_from_slice(MAGIC);
        header[MAGIC.len()..].copy_from_slice(&nonce);
        Ok(RegionWriter {
            file,
            nonce,
            next: SLOT_HEAD,
            live: VecDeque::new(),
        })
    }

    /// What the offering frame tells the reader.
    pub fn offer(&self) -> RegionOffer {
        RegionOffer {
            pid: std::process::id(),
            fd: self.file.raw_fd(),
            size: self.size() as u64,
            nonce: self.nonce.to_vec(),
        }
    }

    fn size(&self) -> usize {
        self.file.mapping().len()
    }

    /// Copies `payload` into the region and returns where its bytes start, for the frame to
    /// name; `None` when it is not the size the region takes or there is no room for it now.
    pub fn place(&mut self, payload: &[u8]) -> Option<u64> {
        if !(MIN_PAYLOAD..=MAX_PAYLOAD).contains(&payload.len()) {
            return None;
        }
        self.reclaim();
        let need = SLOT_HEAD + payload.len().next_multiple_of(SLOT_HEAD);
        let start = self.room_for(need)?;
        let map = self.file.mapping();
        map.word(start)?.store(LENT, Ordering::Relaxed);
        // SAFETY: the slot is past every payload the reader may still read (`room_for`), and
        // this process writes the region only here. A reader that writes it anyway spoils only
        // its own element.
        unsafe { map.bytes_mut(start + SLOT_HEAD, payload.len()) }?.copy_from_slice(payload);
        self.live.push_back(start);
        self.next = start + need;
        Some((start + SLOT_HEAD) as u64)
    }

    /// Forgets the oldest payloads the reader freed.
    fn reclaim(&mut self) {
        while let Some(&start) = self.live.front() {
            // Acquire: the reader's reads of the payload come before it is written again.
            let freed = self
                .file
                .mapping()
                .word(start)
                .is_some_and(|word| word.load(Ordering::Acquire) == FREE);
            if !freed {
                return;
            }
            self.live.pop_front();
        }
        if self.live.is_empty() {
            self.next = SLOT_HEAD;
        }
    }

    /// Where a slot of `need` bytes fits without passing a payload still lent: back at the
    /// start if it fits before the oldest, else after the newest.
    fn room_for(&self, need: usize) -> Option<usize> {
        let Some(&oldest) = self.live.front() else {
            return (SLOT_HEAD + need <= self.size()).then_some(SLOT_HEAD);
        };
        if self.next > oldest {
            // Live slots run from `oldest` to `next`: free space lies after them and before.
            if SLOT_HEAD + need <= oldest {
                Some(SLOT_HEAD)
            } else {
                (self.next + need <= self.size()).then_some(self.next)
            }
        } else {
            // Wrapped: the free space lies between the newest and the oldest.
            (self.next + need <= oldest).then_some(self.next)
        }
    }

    /// Payloads placed and not yet seen freed.
    pub fn lent(&self) -> usize {
        self.live.len()
    }
}

/// The reader's side: its mapping of the region a worker offered.
pub struct RegionReader {
    file: MemFile,
}

impl RegionReader {
    /// Maps the region `offer` names, if this process can open it and it is the one the worker
    /// made for this stream.
    pub fn open(offer: &RegionOffer) -> io::Result<RegionReader> {
        let size = usize::try_from(offer.size)
            .ok()
            .filter(|&size| (2 * SLOT_HEAD..=MAX_OFFERED_BYTES).contains(&size))
            .ok_or_else(|| invalid(format!("a region of {} bytes", offer.size)))?;
        let path = PathBuf::from(format!("/proc/{}/fd/{}", offer.pid, offer.fd));
        let file = MemFile::open(&path, REGION_NAME, size)?;
        // SAFETY: the worker wrote the header before it offered the region and never again.
        let header = unsafe { file.mapping().bytes(0, MAGIC.len() + NONCE_BYTES) }
            .expect("the region is at least two heads long");
        if &header[..MAGIC.len()] != MAGIC || header[MAGIC.len()..] != offer.nonce[..] {
            return Err(invalid(format!(
                "{} is not the region this stream was offered",
                path.display()
            )));
        }
        Ok(RegionReader { file })
    }

    /// The payload of `len` bytes at `offset`, copied out into a buffer of its own (as a
    /// payload read off the socket is, so an array over it is the caller's alone and writable),
    /// its place freed at once. An error for a place that is not a payload's.
    pub fn payload(&self, offset: u64, len: u64) -> Result<Bytes, Status> {
        let bad = || {
            Status::internal(format!(
                "a raw fetch payload of {len} bytes at {offset} of a region of {}",
                self.map().len()
            ))
        };
        let at = usize::try_from(offset).map_err(|_| bad())?;
        let len = usize::try_from(len).map_err(|_| bad())?;
        // The worker places only payloads of `MIN_PAYLOAD` bytes or more.
        if at < 2 * SLOT_HEAD || !at.is_multiple_of(SLOT_HEAD) || len == 0 {
            return Err(bad());
        }
        let word = self.map().word(at - SLOT_HEAD).ok_or_else(bad)?;
        // SAFETY: the worker writes a payload's bytes only before it names them in a frame,
        // and not again until its word says free, below.
        let bytes = unsafe { self.map().bytes(at, len) }.ok_or_else(bad)?;
        let copy = BytesMut::from(bytes).freeze();
        // Release: the copy is made before the worker writes the place again.
        word.store(FREE, Ordering::Release);
        Ok(copy)
    }

    fn map(&self) -> &Mapping {
        self.file.mapping()
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

#[cfg(test)]
#[path = "raw_region_tests.rs"]
mod tests;
