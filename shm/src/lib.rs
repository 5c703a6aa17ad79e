//! Memory files shared between the processes of one machine.
//!
//! A [`MemFile`] is an anonymous memory file (`memfd_create`) mapped into this process. Nothing
//! in the file system names it, so nothing is left behind when its processes die. Another
//! process reaches it by inheriting its descriptor (a worker's Python executors) or by opening
//! `/proc/<pid>/fd/<fd>` (a reader on the worker's machine), which the kernel allows only to a
//! process that may inspect the one holding it: the same user, or root.
//!
//! A file created `sealed` can never change size again. A process that opened it cannot
//! truncate it under the others' mappings, where a read or write past its new end would kill
//! them with `SIGBUS`; [`MemFile::open`] maps only files sealed so.
//!
//! The mapping ([`Mapping`]) lives as long as its file or any `Bytes` lent from it
//! ([`Mapping::lend`]), so lent bytes outlive the file and the process that made them.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bytes::Bytes;

/// A memory file and this process's mapping of all of it.
pub struct MemFile {
    fd: OwnedFd,
    map: Arc<Mapping>,
}

/// A shared mapping, unmapped when its file and everything lent from it are gone.
pub struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value. Who writes which bytes when is the
// rule of the protocol that shares it; the unsafe accessors below state what they require.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `MemFile::map` made; nothing borrows it any more
        // (borrows end with the `MemFile` or the lent `Bytes` that hold this).
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// The seals a file made `sealed` has: neither its size nor its seals can change.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

impl MemFile {
    /// A new file of `len` zero bytes, mapped; its descriptor is closed on exec. `sealed`: its
    /// size can never change (see the module's comment).
    pub fn create(name: &CStr, len: usize, sealed: bool) -> io::Result<MemFile> {
        if len == 0 {
            return Err(invalid("a memory file of 0 bytes".into()));
        }
        let flags = libc::MFD_CLOEXEC | if sealed { libc::MFD_ALLOW_SEALING } else { 0 };
        // SAFETY: memfd_create(2) with a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| invalid(format!("a memory file of {len} bytes")))?;
        // SAFETY: ftruncate(2) on the descriptor just created.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fcntl(2) adding seals to the descriptor just created.
        if sealed && unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd, len)
    }

    /// Maps the first `len` bytes of the memory file inherited as `fd`, which is then this
    /// file's. An error when the file is shorter.
    ///
    /// # Safety
    /// `fd` must be an open descriptor that nothing else in this process owns or closes.
    pub unsafe fn inherit(fd: RawFd, len: usize) -> io::Result<MemFile> {
        // SAFETY: the caller hands over an open descriptor no one else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = file_size(&fd)?;
        if len == 0 || size < len as u64 {
            return Err(invalid(format!(
                "the memory file is {size} bytes, {len} were expected"
            )));
        }
        Self::map(fd, len)
    }

    /// Opens and maps the memory file at `path` (`/proc/<pid>/fd/<fd>`), which must be a memory
    /// file created as `name`, exactly `len` bytes and sealed (see the module's comment).
    /// Nothing else is opened: not a device, a pipe or a file of another name that such a path
    /// may lead to in another PID namespace.
    pub fn open(path: &Path, name: &CStr, len: usize) -> io::Result<MemFile> {
        let target = std::fs::read_link(path)?;
        let memfd = format!("/memfd:{}", name.to_string_lossy());
        let target = target.as_os_str().as_bytes();
        if !(target == memfd.as_bytes() || target.starts_with(format!("{memfd} ").as_bytes())) {
            return Err(invalid(format!(
                "{} is not a memory file named {memfd}",
                path.display()
            )));
        }
        let mut name = path.as_os_str().as_bytes().to_vec();
        name.push(0);
        // SAFETY: open(2) with a NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::open(
                name.as_ptr().cast(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOCTTY,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: fcntl(2) reading the seals of the descriptor just opened.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & SEALS != SEALS {
            return Err(invalid(format!(
                "{} is not a sealed memory file",
                path.display()
            )));
        }
        let size = file_size(&fd)?;
        if len == 0 || size != len as u64 {
            return Err(invalid(format!(
                "{} is {size} bytes, not {len}",
                path.display()
            )));
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<MemFile> {
        // SAFETY: a shared mapping of `len` bytes of a file at least that long (checked by
        // every caller); the result is checked.
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
        Ok(MemFile {
            fd,
            map: Arc::new(Mapping {
                base: base.cast(),
                len,
            }),
        })
    }

    /// The descriptor: for a child to inherit (the caller clears its close-on-exec flag in the
    /// child only), or for another process to open as `/proc/<pid>/fd/<fd>`.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }
}

impl Mapping {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes `at..at + len`; `None` past the end.
    ///
    /// # Safety
    /// No process may write those bytes while the slice is borrowed.
    pub unsafe fn bytes(&self, at: usize, len: usize) -> Option<&[u8]> {
        self.contains(at, len)?;
        // SAFETY: within the mapping, which lives as long as `self`; the caller rules out
        // writers.
        Some(unsafe { std::slice::from_raw_parts(self.base.add(at), len) })
    }

    /// Bytes `at..at + len`, to write; `None` past the end.
    ///
    /// # Safety
    /// No other process may read or write those bytes, and nothing else in this process may
    /// borrow them, while the slice is borrowed.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, at: usize, len: usize) -> Option<&mut [u8]> {
        self.contains(at, len)?;
        // SAFETY: within the mapping, which lives as long as `self`; the caller rules out
        // every other access.
        Some(unsafe { std::slice::from_raw_parts_mut(self.base.add(at), len) })
    }

    /// The 8 bytes at `at` as an atomic word, which any process sharing the file may read and
    /// write; `None` when `at` is not a multiple of 8 or the word passes the end.
    pub fn word(&self, at: usize) -> Option<&AtomicU64> {
        if !at.is_multiple_of(8) {
            return None;
        }
        self.contains(at, 8)?;
        // SAFETY: 8 aligned bytes within the mapping (page-aligned, so `base + at` is aligned
        // too), which lives as long as `self`; every access to them is atomic.
        Some(unsafe { &*self.base.add(at).cast::<AtomicU64>() })
    }

    /// Bytes `at..at + len` as `Bytes` that borrow the mapping (slices included), keeping it
    /// mapped, and run `release` once the last of them is dropped; `None` past the end.
    ///
    /// # Safety
    /// No process may write those bytes until `release` runs.
    pub unsafe fn lend<F>(self: &Arc<Self>, at: usize, len: usize, release: F) -> Option<Bytes>
    where
        F: FnOnce() + Send + 'static,
    {
        self.contains(at, len)?;
        Some(Bytes::from_owner(Lease {
            map: self.clone(),
            at,
            len,
            release: Some(release),
        }))
    }

    fn contains(&self, at: usize, len: usize) -> Option<()> {
        (at.checked_add(len)? <= self.len).then_some(())
    }
}

/// The owner of lent bytes.
struct Lease<F: FnOnce()> {
    map: Arc<Mapping>,
    at: usize,
    len: usize,
    release: Option<F>,
}

impl<F: FnOnce()> AsRef<[u8]> for Lease<F> {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `lend` checked the range; the mapping lives while `map` does, and its caller
        // rules out writers until `release` runs, which is after the last borrow.
        unsafe { std::slice::from_raw_parts(self.map.base.add(self.at), self.len) }
    }
}

impl<F: FnOnce()> Drop for Lease<F> {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// The first `len` bytes of `file`, mapped read-only, as `Bytes` that keep the mapping: the
/// kernel's page cache is the memory, shared by every process that maps the file, and nothing
/// is copied or faulted in before it is read. An error when the file is shorter.
///
/// The file must never be truncated while mapped (a read past its new end would kill the
/// process with `SIGBUS`): it is for files that are only replaced (renamed over) or unlinked,
/// which leaves a mapping intact.
pub fn map_file(file: &std::fs::File, len: usize) -> io::Result<Bytes> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    let size = file.metadata()?.len();
    if size < len as u64 {
        return Err(invalid(format!(
            "the file is {size} bytes, {len} were expected"
        )));
    }
    // SAFETY: a read-only shared mapping of `len` bytes of a file at least that long; the
    // result is checked.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let map = Arc::new(Mapping {
        base: base.cast(),
        len,
    });
    // SAFETY: the mapping is read-only here, and the caller's files are never written in place.
    let bytes = unsafe { map.lend(0, len, || {}) };
    Ok(bytes.expect("the whole mapping"))
}

fn file_size(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: fstat(2) into a zeroed struct this function owns.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.st_size as u64)
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

#[cfg(test)]
mod tests;
