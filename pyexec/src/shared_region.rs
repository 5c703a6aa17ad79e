//! `SharedRegion`: memory a worker shares with one executor process, through which batches and
//! their results travel instead of through the pipes (BATCH_SHARED and RESULTS_SHARED in
//! `protocol`). The pipes then carry only a few bytes per batch.
//!
//! Through the pipes, a result crossed from the executor to the worker in four copies: the
//! encoding into a Python `bytes`, the kernel's copy into the pipe, its copy out of the pipe,
//! and the worker's decoding. Through the region it is encoded once, in place, and read where it
//! lies: the worker hands the results on as `Bytes` that borrow their reply slot (a *lease*,
//! [`SharedRegion::take_reply`]), so an image goes from the executor's encoding to the socket
//! without another copy. The same for a batch's inputs the other way, copied once into a request
//! slot.
//!
//! The region is an anonymous memory file (`memfd_create`) that the worker creates and maps,
//! and the executor inherits as a descriptor and maps too: nothing in the file system is left
//! behind when either dies. Its layout (`SharedLayout`) is `slots` request slots, then `slots`
//! reply slots. The worker picks a free slot for each batch ([`SharedRegion::claim`]) and names
//! it in the BATCH_SHARED; the executor reads the batch from that request slot and writes its
//! results into the reply slot of the same number. A slot is free again once its batch's
//! results were copied out, or its lease's last `Bytes` is dropped: neither side writes a slot
//! the other may still read. Leases are capped so that a slot is always free for the batches
//! in flight; past the cap, results are copied out as before.
//!
//! The mapping lives as long as the region or any lease of it, so results outlive an executor
//! that died or was replaced.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use sluice_shm::MemFile;

/// Where a region's slots lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedLayout {
    /// Request slots, and as many reply slots.
    pub slots: usize,
    /// Bytes of each request slot.
    pub request_bytes: usize,
    /// Bytes of each reply slot.
    pub reply_bytes: usize,
}

/// The variable in which an executor finds its region: `FD:SLOTS:REQUEST_BYTES:REPLY_BYTES`.
pub const SHARED_REGION_ENV: &str = "SLUICE_EXECUTOR_REGION";

impl SharedLayout {
    /// A worker's executors' regions: eight slots each way, for the two batches a worker keeps
    /// in flight per executor and up to six leased (see `take_reply`). A request slot holds
    /// 4 MiB of inputs and a reply slot 16 MiB of results; a larger batch or result travels
    /// through the pipes. Only the pages a batch touches take memory, and the lowest free slot
    /// is used first, so a worker whose results are read promptly touches two or three.
    pub const DEFAULT: SharedLayout = SharedLayout {
        slots: 8,
        request_bytes: 4 << 20,
        reply_bytes: 16 << 20,
    };

    /// The region's size in bytes; `None` when it overflows.
    pub fn total(&self) -> Option<usize> {
        self.request_bytes
            .checked_add(self.reply_bytes)?
            .checked_mul(self.slots)
    }

    fn request_at(&self, slot: usize) -> usize {
        slot * self.request_bytes
    }

    fn reply_at(&self, slot: usize) -> usize {
        self.slots * self.request_bytes + slot * self.reply_bytes
    }

    /// The value of `SHARED_REGION_ENV` for a region mapped from `fd`.
    pub fn to_env(&self, fd: RawFd) -> String {
        format!(
            "{fd}:{}:{}:{}",
            self.slots, self.request_bytes, self.reply_bytes
        )
    }

    /// Parses `SHARED_REGION_ENV`'s value: the descriptor and the layout.
    pub fn from_env(value: &str) -> Result<(RawFd, SharedLayout), String> {
        let fields: Vec<&str> = value.split(':').collect();
        let [fd, slots, request, reply] = fields[..] else {
            return Err(format!(
                "{SHARED_REGION_ENV}={value:?} is not FD:SLOTS:REQUEST_BYTES:REPLY_BYTES"
            ));
        };
        let number = |what: &str, text: &str| {
            text.parse::<usize>()
                .map_err(|_| format!("{SHARED_REGION_ENV}: {what} {text:?} is not a number"))
        };
        let fd = RawFd::try_from(number("descriptor", fd)?)
            .map_err(|_| format!("{SHARED_REGION_ENV}: descriptor {fd} is out of range"))?;
        let layout = SharedLayout {
            slots: number("slots", slots)?,
            request_bytes: number("request bytes", request)?,
            reply_bytes: number("reply bytes", reply)?,
        };
        if layout.slots == 0 || layout.slots > 16 || layout.total().is_none() {
            return Err(format!(
                "{SHARED_REGION_ENV}: {} slots of {} and {} bytes is not a region",
                layout.slots, layout.request_bytes, layout.reply_bytes
            ));
        }
        Ok((fd, layout))
    }
}

/// A slot the worker may write a batch to.
const FREE: u8 = 0;
/// A slot holding a batch sent to the executor, whose results are due.
const IN_FLIGHT: u8 = 1;
/// A slot whose results are still read through a lease.
const LEASED: u8 = 2;

/// A mapped region: the worker's (which created it) or the executor's (which inherited it).
pub struct SharedRegion {
    file: MemFile,
    layout: SharedLayout,
    /// Each slot's state (`FREE`, `IN_FLIGHT`, `LEASED`): the worker's account of which slots
    /// it may write. A lease's last `Bytes` sets its slot `FREE` from whichever thread drops it.
    states: Arc<[AtomicU8]>,
}

impl SharedRegion {
    /// Creates a region of `layout` (the worker's side). Its descriptor is closed on exec;
    /// `raw_fd` gives the one an executor is started with.
    pub fn create(layout: SharedLayout) -> io::Result<SharedRegion> {
        let len = layout
            .total()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        let file = MemFile::create(c"sluice-executor", len, false)?;
        Ok(Self::with(file, layout))
    }

    /// Maps the region inherited as `fd` (the executor's side); `fd` is then this region's.
    ///
    /// # Safety
    /// `fd` must be an open descriptor that nothing else in this process owns or closes.
    pub unsafe fn inherit(fd: RawFd, layout: SharedLayout) -> io::Result<SharedRegion> {
        let len = layout
            .total()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        // SAFETY: the caller hands over an open descriptor no one else owns.
        let file = unsafe { MemFile::inherit(fd, len) }
            .map_err(|e| io::Error::new(e.kind(), format!("the region's layout: {e}")))?;
        Ok(Self::with(file, layout))
    }

    fn with(file: MemFile, layout: SharedLayout) -> SharedRegion {
        SharedRegion {
            file,
            layout,
            states: (0..layout.slots).map(|_| AtomicU8::new(FREE)).collect(),
        }
    }

    pub fn layout(&self) -> SharedLayout {
        self.layout
    }

    /// The descriptor, for the executor to inherit (the caller clears its close-on-exec flag in
    /// the child only).
    pub fn raw_fd(&self) -> RawFd {
        self.file.raw_fd()
    }

    /// Request slot `slot`; `None` past the last.
    pub fn request(&self, slot: usize) -> Option<&[u8]> {
        let at = self.slot_at(slot, true)?;
        Some(self.bytes(at, self.layout.request_bytes))
    }

    pub fn request_mut(&mut self, slot: usize) -> Option<&mut [u8]> {
        let at = self.slot_at(slot, true)?;
        Some(self.bytes_mut(at, self.layout.request_bytes))
    }

    /// Reply slot `slot`; `None` past the last.
    pub fn reply(&self, slot: usize) -> Option<&[u8]> {
        let at = self.slot_at(slot, false)?;
        Some(self.bytes(at, self.layout.reply_bytes))
    }

    pub fn reply_mut(&mut self, slot: usize) -> Option<&mut [u8]> {
        let at = self.slot_at(slot, false)?;
        Some(self.bytes_mut(at, self.layout.reply_bytes))
    }

    /// The lowest free slot, now in flight: the caller writes a batch into its request slot and
    /// has the executor answer into its reply slot, then gives it back with `take_reply` or
    /// `release`. `None` when every slot is in flight or leased.
    pub fn claim(&self) -> Option<usize> {
        // Acquire: pairs with a lease's release, so its reads are over before the slot is
        // written again.
        self.states.iter().position(|state| {
            state
                .compare_exchange(FREE, IN_FLIGHT, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Frees in-flight slot `slot` whose batch was answered without its reply slot (through
    /// the pipe, or with an error).
    pub fn release(&self, slot: usize) {
        if let Some(state) = self.states.get(slot) {
            let _ = state.compare_exchange(IN_FLIGHT, FREE, Ordering::Release, Ordering::Relaxed);
        }
    }

    /// The first `len` bytes of in-flight reply slot `slot`, the slot then given back. While
    /// fewer than `max_leased` slots are leased, the bytes are lent: they borrow the slot, which
    /// stays leased until the last of them (slices included) is dropped. Otherwise they are
    /// copied out and the slot is free at once. An error when the slot is not in flight or
    /// `len` passes its end.
    pub fn take_reply(&self, slot: usize, len: usize, max_leased: usize) -> Result<Bytes, String> {
        let state = self
            .states
            .get(slot)
            .filter(|s| s.load(Ordering::Relaxed) == IN_FLIGHT)
            .ok_or_else(|| format!("results in reply slot {slot}, which has no batch"))?;
        let at = self
            .slot_at(slot, false)
            .expect("a slot with a state is in the layout");
        if len > self.layout.reply_bytes {
            return Err(format!(
                "results of {len} bytes in reply slot {slot} of {}",
                self.layout.reply_bytes
            ));
        }
        if self.leased() >= max_leased {
            let copy = Bytes::copy_from_slice(self.bytes(at, len));
            state.store(FREE, Ordering::Release);
            return Ok(copy);
        }
        state.store(LEASED, Ordering::Relaxed);
        let states = self.states.clone();
        // SAFETY: the slot is `LEASED` until the release runs, so the worker sends no batch
        // that would have the executor write it.
        let lent = unsafe {
            self.file.mapping().lend(at, len, move || {
                // Release: every read through the lease comes before a later `claim`.
                states[slot].store(FREE, Ordering::Release);
            })
        };
        Ok(lent.expect("a reply slot lies within the region"))
    }

    /// Slots leased now.
    pub fn leased(&self) -> usize {
        self.states
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) == LEASED)
            .count()
    }

    fn slot_at(&self, slot: usize, request: bool) -> Option<usize> {
        (slot < self.layout.slots).then(|| {
            if request {
                self.layout.request_at(slot)
            } else {
                self.layout.reply_at(slot)
            }
        })
    }

    fn bytes(&self, at: usize, len: usize) -> &[u8] {
        // SAFETY: the worker writes a slot only while it is in flight, before the executor
        // answers, and the executor only a slot whose batch it serves (see the module's
        // comment); `at + len` lies within the layout, whose total is the mapping's length.
        unsafe { self.file.mapping().bytes(at, len) }.expect("a slot lies within the region")
    }

    fn bytes_mut(&mut self, at: usize, len: usize) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` keeps this process from aliasing it (a lease reads
        // only a reply slot the worker does not write).
        unsafe { self.file.mapping().bytes_mut(at, len) }.expect("a slot lies within the region")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: SharedLayout = SharedLayout {
        slots: 2,
        request_bytes: 4096,
        reply_bytes: 8192,
    };

    #[test]
    fn what_one_mapping_writes_the_other_reads() {
        let mut worker = SharedRegion::create(SMALL).unwrap();
        // SAFETY: a duplicate of the worker's descriptor, owned by the second mapping only.
        let fd = unsafe { libc::dup(worker.raw_fd()) };
        let mut executor = unsafe { SharedRegion::inherit(fd, SMALL) }.unwrap();
        worker.request_mut(1).unwrap()[..5].copy_from_slice(b"hello");
        assert_eq!(&executor.request(1).unwrap()[..5], b"hello");
        executor.reply_mut(0).unwrap()[8191] = 7;
        assert_eq!(worker.reply(0).unwrap()[8191], 7);
        // Slots do not overlap.
        assert_eq!(worker.request(0).unwrap()[..5], [0; 5]);
        assert_eq!(worker.reply(1).unwrap()[8191], 0);
        assert!(worker.request(2).is_none() && worker.reply(2).is_none());
    }

    /// A worker's region and the executor's mapping of it.
    fn pair(layout: SharedLayout) -> (SharedRegion, SharedRegion) {
        let worker = SharedRegion::create(layout).unwrap();
        // SAFETY: a duplicate of the worker's descriptor, owned by the second mapping only.
        let fd = unsafe { libc::dup(worker.raw_fd()) };
        let executor = unsafe { SharedRegion::inherit(fd, layout) }.unwrap();
        (worker, executor)
    }

    const FOUR: SharedLayout = SharedLayout {
        slots: 4,
        request_bytes: 4096,
        reply_bytes: 8192,
    };

    #[test]
    fn a_leased_slot_is_not_claimed_until_its_last_bytes_are_dropped() {
        let (worker, mut executor) = pair(FOUR);
        assert_eq!(worker.claim(), Some(0));
        executor.reply_mut(0).unwrap()[..6].copy_from_slice(b"images");
        let lent = worker.take_reply(0, 6, 2).unwrap();
        assert_eq!(&lent[..], b"images");
        assert_eq!(worker.leased(), 1);
        // A slice of the lent bytes keeps the slot leased as well.
        let tail = lent.slice(3..);
        drop(lent);
        assert_eq!(worker.claim(), Some(1));
        assert_eq!(worker.leased(), 1);
        drop(tail);
        assert_eq!(worker.leased(), 0);
        assert_eq!(worker.claim(), Some(0));
    }

    #[test]
    fn past_the_lease_cap_results_are_copied_and_their_slot_freed_at_once() {
        let (worker, mut executor) = pair(FOUR);
        let mut kept = Vec::new();
        for expected in 0..2 {
            let slot = worker.claim().unwrap();
            assert_eq!(slot, expected);
            executor.reply_mut(slot).unwrap()[0] = slot as u8 + 1;
            kept.push(worker.take_reply(slot, 1, 2).unwrap());
        }
        assert_eq!(worker.leased(), 2);
        let slot = worker.claim().unwrap();
        assert_eq!(slot, 2);
        executor.reply_mut(slot).unwrap()[0] = 9;
        let copied = worker.take_reply(slot, 1, 2).unwrap();
        assert_eq!(worker.leased(), 2);
        // The copy does not change when the executor writes its slot again.
        assert_eq!(worker.claim(), Some(2));
        executor.reply_mut(2).unwrap()[0] = 10;
        assert_eq!(&copied[..], &[9]);
        assert_eq!(&kept[0][..], &[1]);
        assert_eq!(&kept[1][..], &[2]);
    }

    #[test]
    fn replies_of_slots_without_a_batch_or_past_their_end_are_refused() {
        let (worker, _executor) = pair(FOUR);
        // Never claimed, and past the last slot.
        assert!(worker.take_reply(0, 1, 2).is_err());
        assert!(worker.take_reply(4, 1, 2).is_err());
        let slot = worker.claim().unwrap();
        assert!(worker.take_reply(slot, 8193, 2).is_err());
        // Still in flight after a refusal; a release frees it.
        assert_eq!(worker.claim(), Some(1));
        worker.release(slot);
        worker.release(1);
        assert_eq!(worker.claim(), Some(0));
        // Releasing a leased slot does not free it.
        let lent = worker.take_reply(0, 8192, 2).unwrap();
        worker.release(0);
        assert_eq!(worker.claim(), Some(1));
        drop(lent);
        assert_eq!(worker.claim(), Some(0));
    }

    #[test]
    fn lent_results_outlive_the_region() {
        let (worker, mut executor) = pair(FOUR);
        let slot = worker.claim().unwrap();
        executor.reply_mut(slot).unwrap()[..5].copy_from_slice(b"still");
        let lent = worker.take_reply(slot, 5, 2).unwrap();
        drop(worker);
        drop(executor);
        assert_eq!(&lent[..], b"still");
    }

    #[test]
    fn every_slot_in_flight_or_leased_leaves_none_to_claim() {
        let (worker, _executor) = pair(FOUR);
        let lent: Vec<Bytes> = (0..2)
            .map(|_| {
                let slot = worker.claim().unwrap();
                worker.take_reply(slot, 1, 2).unwrap()
            })
            .collect();
        assert_eq!((worker.claim(), worker.claim()), (Some(2), Some(3)));
        assert_eq!(worker.claim(), None);
        drop(lent);
        assert_eq!(worker.claim(), Some(0));
    }

    #[test]
    fn the_environment_value_round_trips_and_nonsense_is_refused() {
        let env = SMALL.to_env(9);
        assert_eq!(SharedLayout::from_env(&env), Ok((9, SMALL)));
        for bad in [
            "",
            "9:2:4096",
            "x:2:4096:8192",
            "9:0:4096:8192",
            "9:99:4096:8192",
            "9:2:18446744073709551615:8192",
        ] {
            assert!(SharedLayout::from_env(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_region_shorter_than_its_layout_is_refused() {
        let worker = SharedRegion::create(SMALL).unwrap();
        let larger = SharedLayout {
            reply_bytes: 1 << 20,
            ..SMALL
        };
        // SAFETY: a duplicate descriptor, owned by the attempted mapping only.
        let fd = unsafe { libc::dup(worker.raw_fd()) };
        assert!(unsafe { SharedRegion::inherit(fd, larger) }.is_err());
    }
}
