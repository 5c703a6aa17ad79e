//! `AllocMeter`: the system allocator, counting the bytes each thread holds, so a fuzz target
//! can check that a decoder's peak heap use stays in proportion to its input (a length field
//! must never be trusted for an allocation).
//!
//! Install it in a test binary with `#[global_allocator]`; without that, `peak_during` measures
//! nothing and reports 0. Counts are per thread (a decoder under test runs on the test's
//! thread, async ones on a current-thread runtime), so tests running in parallel do not disturb
//! each other. Memory freed by another thread than the one that allocated it makes a count
//! drift, which only ever lowers a peak measured later on that thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator with per-thread accounting.
pub struct AllocMeter;

thread_local! {
    /// Bytes this thread holds now (may go below 0 after frees of other threads' memory).
    static HELD: Cell<isize> = const { Cell::new(0) };
    /// The highest `HELD` since the last reset.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // `try_with`: a thread being torn down frees memory after its locals are gone.
    let _ = HELD.try_with(|held| {
        let now = held.get().saturating_add(delta);
        held.set(now);
        let _ = PEAK.try_with(|peak| {
            if now > peak.get() {
                peak.set(now);
            }
        });
    });
}

// SAFETY: every call is forwarded to `System` unchanged; the accounting allocates nothing.
unsafe impl GlobalAlloc for AllocMeter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

impl AllocMeter {
    /// Runs `f` and returns its result with the most bytes this thread held at once during it,
    /// beyond what it held before.
    pub fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
        let start = HELD.with(Cell::get);
        PEAK.with(|peak| peak.set(start));
        let r = f();
        let peak = PEAK.with(Cell::get);
        (r, usize::try_from(peak - start).unwrap_or(0))
    }
}

/// Checks a decoder's peak heap use against its bound: at most `per_byte` bytes per byte of
/// its `input`, plus `slack`. The error names `what` and the three figures.
pub fn within(
    what: &str,
    peak: usize,
    input: usize,
    per_byte: usize,
    slack: usize,
) -> Result<(), String> {
    let bound = input.saturating_mul(per_byte).saturating_add(slack);
    if peak > bound {
        return Err(format!(
            "{what} held {peak} bytes at once for {input} bytes of input (bound {bound})"
        ));
    }
    Ok(())
}
