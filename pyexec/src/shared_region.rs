//! `SharedRegion`: memory a worker shares with one executor process, through which batches and
//! their results travel instead of through the pipes (BATCH_SHARED and RESULTS_SHARED in
//! `protocol`). The pipes then carry only a few bytes per batch.
//!
//! Through the pipes, a result crossed from the executor to the worker in four copies: the
//! encoding into a Python `bytes`, the kernel's copy into the pipe, its copy out of the pipe,
//! and the worker's decoding. Through the region it is encoded once, in place, and copied once
//! out of it by the worker (which must own its results: the region is written again two
//! batches later). The same for a batch's inputs the other way.
//!
//! The region is an anonymous memory file (`memfd_create`) that the worker creates and maps,
//! and the executor inherits as a descriptor and maps too: nothing in the file system is left
//! behind when either dies. Its layout (`SharedLayout`) is `slots` request slots, then `slots`
//! reply slots. Batch `n` of an executor (counted from its start) goes in request slot
//! `n % slots` and its results in reply slot `n % slots`; the worker keeps at most `slots`
//! batches in flight and reads a batch's results before it sends the one that reuses its slots,
//! so neither side writes a slot the other still reads.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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
    /// A worker's executors' regions: two slots each way (the batches a worker keeps in
    /// flight per executor). A request slot holds 4 MiB of inputs and a reply slot 16 MiB of
    /// results; a larger batch or result travels through the pipes. Only the pages a batch
    /// touches take memory.
    pub const DEFAULT: SharedLayout = SharedLayout {
        slots: 2,
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

/// A mapped region: the worker's (which created it) or the executor's (which inherited it).
pub struct SharedRegion {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
    layout: SharedLayout,
}

// SAFETY: the mapping is plain memory owned by this value; which side writes which slot when is
// the protocol's rule (see the module's comment), and `&mut self` guards writes in this process.
unsafe impl Send for SharedRegion {}
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Creates a region of `layout` (the worker's side). Its descriptor is closed on exec;
    /// `inheritable_fd` gives the one an executor is started with.
    pub fn create(layout: SharedLayout) -> io::Result<SharedRegion> {
        let len = layout
            .total()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        // SAFETY: memfd_create(2) with a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"sluice-executor".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate(2) on the descriptor just created.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd, len, layout)
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
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: fstat(2) into a zeroed struct this function owns.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if (stat.st_size as u64) < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the region is {} bytes, its layout needs {len}",
                    stat.st_size
                ),
            ));
        }
        Self::map(fd, len, layout)
    }

    fn map(fd: OwnedFd, len: usize, layout: SharedLayout) -> io::Result<SharedRegion> {
        // SAFETY: a shared mapping of `len` bytes of a file at least that long; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedRegion {
            fd,
            base: base.cast(),
            len,
            layout,
        })
    }

    pub fn layout(&self) -> SharedLayout {
        self.layout
    }

    /// The descriptor, for the executor to inherit (the caller clears its close-on-exec flag in
    /// the child only).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
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
        debug_assert!(at + len <= self.len);
        // SAFETY: `at + len` lies within the mapping (the layout's total is its length), which
        // lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base.add(at), len) }
    }

    fn bytes_mut(&mut self, at: usize, len: usize) -> &mut [u8] {
        debug_assert!(at + len <= self.len);
        // SAFETY: as in `bytes`; `&mut self` keeps this process from aliasing it.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(at), len) }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; no slice of it outlives `self`.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
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
