//! Crash records: which tasks a worker was running when a fatal signal killed it.
//!
//! A task whose pipeline crashes the worker process (an abort, a stack overflow, a segfault in
//! native code) would otherwise be handed to the next worker, and the next, crash-looping the
//! fleet. With a state directory (`--state-dir`), the worker keeps the ids of its running
//! tasks in preallocated slots, and handlers of SIGABRT, SIGSEGV, SIGBUS and SIGILL write
//! them, with the signal, to the file `crash` there before the previous handler runs (Rust's
//! own, which prints "has overflowed its stack", or the default). The handlers only use
//! async-signal-safe calls (`open`, `write`, `fsync`, `close`, `sigaction`, `raise`) on
//! memory prepared before they were installed. The next run of the worker reads the file and
//! reports it with its first heartbeats (see `Heartbeat`), and the dispatcher fails those
//! tasks' iterations.
//!
//! The tasks named are the one whose pipeline runs on the crashing thread, or, when the
//! crashing thread runs no task's pipeline (a prefetch thread of one, a server thread), every
//! task running then. SIGKILL and SIGSTOP cannot be caught: a worker killed or paused from
//! outside leaves no record, and its tasks go on elsewhere as before.

use std::cell::Cell;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use sluice_proto::dispatcher::CrashReport;

/// The file, in the state directory, that a crash writes and the next run reads.
pub const CRASH_FILE: &str = "crash";

/// Tasks recorded at once; a worker running more names only these in a record.
const SLOTS: usize = 256;

/// The signals recorded, in the order of `PREVIOUS`.
const SIGNALS: [libc::c_int; 4] = [libc::SIGABRT, libc::SIGSEGV, libc::SIGBUS, libc::SIGILL];

static RUNNING: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// The record's path, NUL-terminated, set once before the handlers are installed.
static PATH: OnceLock<CString> = OnceLock::new();
/// This run's registered address, for the record.
static ADDRESS: OnceLock<String> = OnceLock::new();
/// The handlers installed before ours, chained to after the record is written.
static PREVIOUS: OnceLock<[libc::sigaction; 4]> = OnceLock::new();
/// Set by the first fatal signal: an abort after a stack overflow does not overwrite it.
static WRITTEN: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The task whose pipeline runs on this thread (0: none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

/// Marks a task's pipeline as running on this thread until dropped.
pub struct RunningTask {
    slot: Option<usize>,
}

/// Records `task_id` as running on the calling thread (the task's pipeline thread).
pub fn running(task_id: u64) -> RunningTask {
    CURRENT.with(|c| c.set(task_id));
    let slot = RUNNING.iter().position(|s| {
        s.compare_exchange(0, task_id, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    });
    RunningTask { slot }
}

impl Drop for RunningTask {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(0));
        if let Some(slot) = self.slot {
            RUNNING[slot].store(0, Ordering::SeqCst);
        }
    }
}

/// Prepares crash records in `dir` for a worker registered as `address`: returns what a
/// previous run's crash left there (the file stays until [`forget`] after it is reported),
/// and installs the handlers. Only one worker per process may do this.
pub fn arm(dir: &Path, address: &str) -> Result<Option<CrashReport>, String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("state directory '{}': {e}", dir.display()))?;
    let path = dir.join(CRASH_FILE);
    let previous = match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("reading '{}': {e}", path.display())),
    };
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("state directory '{}' has a NUL byte", dir.display()))?;
    if PATH.set(c_path).is_err() || ADDRESS.set(address.to_string()).is_err() {
        return Err(
            "another worker in this process already keeps crash records (--state-dir): one \
             worker per process may have a state directory"
                .into(),
        );
    }
    install_handlers();
    Ok(previous)
}

/// Removes the crash file once its report was delivered, unless a new crash wrote it since
/// (it then holds a different report).
pub fn forget(dir: &Path, reported: &CrashReport) {
    let path: PathBuf = dir.join(CRASH_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        if parse(&text).as_ref() == Some(reported) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The record's text: `signal NAME`, `address ADDR` and `tasks ID ...` lines.
fn parse(text: &str) -> Option<CrashReport> {
    let mut report = CrashReport::default();
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("signal", name)) => report.signal = name.to_string(),
            Some(("address", address)) => report.worker_address = address.to_string(),
            Some(("tasks", ids)) => {
                report.task_ids = ids
                    .split_whitespace()
                    .filter_map(|id| id.parse().ok())
                    .collect()
            }
            _ => {}
        }
    }
    let complete = !report.signal.is_empty()
        && !report.worker_address.is_empty()
        && !report.task_ids.is_empty();
    complete.then_some(report)
}

fn install_handlers() {
    let mut previous: [libc::sigaction; 4] = unsafe { std::mem::zeroed() };
    for (i, signal) in SIGNALS.iter().enumerate() {
        // SAFETY: reading the current disposition into a zeroed struct.
        unsafe { libc::sigaction(*signal, std::ptr::null(), &mut previous[i]) };
    }
    if PREVIOUS.set(previous).is_err() {
        return;
    }
    for signal in SIGNALS {
        // SAFETY: `on_fatal` only makes async-signal-safe calls; SA_ONSTACK lets it run on the
        // alternate stack Rust gives its threads, which a stack overflow needs.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fatal as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

extern "C" fn on_fatal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    if !WRITTEN.swap(true, Ordering::SeqCst) {
        write_record(signal);
    }
    chain(signal, info, context);
}

/// Runs the handler that was installed before ours, or the default action.
fn chain(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let index = SIGNALS.iter().position(|s| *s == signal);
    let previous = index.and_then(|i| PREVIOUS.get().map(|p| p[i]));
    match previous {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            // SAFETY: the handler the process had installed, called as it was installed.
            unsafe {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(p.sa_sigaction);
                    f(signal, info, context);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
                    f(signal);
                }
            }
        }
        _ => {
            // The default action: restored, then the signal raised again. It is blocked while
            // this handler runs, so it is delivered (and kills) as the handler returns; a fault
            // would repeat anyway.
            // SAFETY: sigaction and raise are async-signal-safe.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut());
                libc::raise(signal);
            }
        }
    }
}

/// The bytes of one record: 256 tasks of 20 digits, the address and the signal fit.
const RECORD_BYTES: usize = 8192;

/// A fixed buffer the record is formatted into, without allocating.
struct Record {
    bytes: [u8; RECORD_BYTES],
    len: usize,
}

/// The one record a process writes. Static, not on the stack: the handler runs on the small
/// alternate signal stack (a stack overflow leaves no other), which a buffer this size would
/// overflow.
struct RecordCell(std::cell::UnsafeCell<Record>);

// SAFETY: only the handler that set `WRITTEN` first touches it, once.
unsafe impl Sync for RecordCell {}

static RECORD: RecordCell = RecordCell(std::cell::UnsafeCell::new(Record {
    bytes: [0; RECORD_BYTES],
    len: 0,
}));

impl Record {
    fn push(&mut self, text: &[u8]) {
        let n = text.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&text[..n]);
        self.len += n;
    }

    fn push_number(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

fn signal_name(signal: libc::c_int) -> &'static [u8] {
    match signal {
        libc::SIGABRT => b"SIGABRT",
        libc::SIGSEGV => b"SIGSEGV",
        libc::SIGBUS => b"SIGBUS",
        libc::SIGILL => b"SIGILL",
        _ => b"SIGNAL",
    }
}

fn write_record(signal: libc::c_int) {
    let (Some(path), Some(address)) = (PATH.get(), ADDRESS.get()) else {
        return;
    };
    // SAFETY: the caller set `WRITTEN` first; no other code touches `RECORD`.
    let record = unsafe { &mut *RECORD.0.get() };
    record.push(b"signal ");
    record.push(signal_name(signal));
    record.push(b"\naddress ");
    record.push(address.as_bytes());
    record.push(b"\ntasks");
    let current = CURRENT.try_with(Cell::get).unwrap_or(0);
    if current != 0 {
        record.push(b" ");
        record.push_number(current);
    } else {
        for slot in &RUNNING {
            let task = slot.load(Ordering::SeqCst);
            if task != 0 {
                record.push(b" ");
                record.push_number(task);
            }
        }
    }
    record.push(b"\n");
    // SAFETY: open, write, fsync and close are async-signal-safe; `path` is NUL-terminated.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o600,
        );
        if fd < 0 {
            return;
        }
        let mut written = 0;
        while written < record.len {
            let n = libc::write(
                fd,
                record.bytes[written..].as_ptr().cast(),
                record.len - written,
            );
            if n <= 0 {
                break;
            }
            written += n as usize;
        }
        libc::fsync(fd);
        libc::close(fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_back_and_incomplete_ones_are_none() {
        let cases: Vec<(&str, Option<CrashReport>)> = vec![
            (
                "signal SIGABRT\naddress 127.0.0.1:7\ntasks 4001 4002\n",
                Some(CrashReport {
                    worker_address: "127.0.0.1:7".into(),
                    task_ids: vec![4001, 4002],
                    signal: "SIGABRT".into(),
                }),
            ),
            ("signal SIGSEGV\naddress 127.0.0.1:7\ntasks\n", None),
            ("signal SIGSEGV\ntasks 1\n", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), want, "{text:?}");
        }
    }

    #[test]
    fn a_record_formats_numbers_without_allocating() {
        let mut record = Record {
            bytes: [0; RECORD_BYTES],
            len: 0,
        };
        for v in [0, 7, 4001, u64::MAX] {
            record.push_number(v);
            record.push(b" ");
        }
        assert_eq!(
            std::str::from_utf8(&record.bytes[..record.len]).unwrap(),
            "0 7 4001 18446744073709551615 "
        );
    }
}
