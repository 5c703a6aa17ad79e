//! A process-wide memory barrier: a fast path that pays only a compiler fence (`light`) against
//! a rare slow path that pays a system call (`heavy`), for `task_buffer`'s handshake between
//! the pipeline thread and a reader taking the open chunk back.
//!
//! The guarantee: if thread A runs `light()` between a store and a load, and thread B runs
//! `heavy()` between a store and a load, then A's load sees B's store or B's load sees A's
//! store (as if both had run `fence(SeqCst)`).
//!
//! On Linux, `heavy` is `membarrier(2)` with `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, which runs a
//! full fence on every CPU running a thread of this process (a thread not running passes
//! through one when it is switched out); the process registers for it once. Where that is
//! missing (another OS, a kernel before 4.14, a seccomp filter), both sides use
//! `fence(SeqCst)`. The `membarrier` crate does the same, but it does not link on Linux any
//! more (it names `windows-sys` 0.45 unconditionally).

use std::sync::atomic::{compiler_fence, fence, Ordering};
use std::sync::OnceLock;

#[cfg(target_os = "linux")]
mod sys {
    use libc::{c_long, syscall, SYS_membarrier};

    const QUERY: c_long = 0;
    const PRIVATE_EXPEDITED: c_long = 1 << 3;
    const REGISTER_PRIVATE_EXPEDITED: c_long = 1 << 4;

    fn membarrier(cmd: c_long) -> c_long {
        // SAFETY: membarrier(cmd, flags = 0, cpu_id = 0) reads and writes no user memory.
        unsafe { syscall(SYS_membarrier, cmd, 0, 0) }
    }

    /// Whether expedited barriers are available; registers this process for them.
    pub fn register() -> bool {
        let supported = membarrier(QUERY);
        let wanted = PRIVATE_EXPEDITED | REGISTER_PRIVATE_EXPEDITED;
        supported >= 0
            && supported & wanted == wanted
            && membarrier(REGISTER_PRIVATE_EXPEDITED) == 0
    }

    pub fn barrier() {
        // Registered, it fails only on arguments this call does not pass; were it to fail,
        // `light` would have left out a fence it relies on.
        assert_eq!(
            membarrier(PRIVATE_EXPEDITED),
            0,
            "membarrier after registration"
        );
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    pub fn register() -> bool {
        false
    }

    pub fn barrier() {}
}

/// Whether `heavy` is a process-wide barrier (else both sides fence).
fn expedited() -> bool {
    static EXPEDITED: OnceLock<bool> = OnceLock::new();
    *EXPEDITED.get_or_init(sys::register)
}

/// The fast side: orders this thread's earlier stores before its later loads against any
/// `heavy` call.
#[inline]
pub fn light() {
    if expedited() {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The slow side: a full fence here and on every other running thread of the process.
pub fn heavy() {
    if expedited() {
        sys::barrier();
    } else {
        fence(Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[derive(Default)]
    struct Litmus {
        x: AtomicU64,
        y: AtomicU64,
        /// The round the fast side may start.
        go: AtomicU64,
        /// The last round the fast side finished, and what it read of `y` in it.
        done: AtomicU64,
        fast_saw: AtomicU64,
    }

    fn wait_until(ready: impl Fn() -> bool) {
        let mut spins = 0u32;
        while !ready() {
            if spins < 1000 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The store-buffering litmus test, which plain stores and loads fail on x86: with `light`
    /// between the store and the load on one side and `heavy` on the other, the two loads never
    /// both miss the other side's store.
    #[test]
    fn store_buffering_never_sees_both_stale() {
        const ROUNDS: u64 = 5_000;
        let litmus = Arc::new(Litmus::default());
        let fast = {
            let l = litmus.clone();
            std::thread::spawn(move || {
                for round in 1..=ROUNDS {
                    wait_until(|| l.go.load(Ordering::Acquire) >= round);
                    l.x.store(round, Ordering::Relaxed);
                    light();
                    l.fast_saw
                        .store(l.y.load(Ordering::Relaxed), Ordering::Relaxed);
                    l.done.store(round, Ordering::Release);
                }
            })
        };
        let l = &*litmus;
        for round in 1..=ROUNDS {
            l.go.store(round, Ordering::Release);
            l.y.store(round, Ordering::Relaxed);
            heavy();
            let slow_saw = l.x.load(Ordering::Relaxed);
            wait_until(|| l.done.load(Ordering::Acquire) >= round);
            let fast_saw = l.fast_saw.load(Ordering::Relaxed);
            assert!(
                slow_saw == round || fast_saw == round,
                "round {round}: each side missed the other's store"
            );
        }
        fast.join().expect("the fast side");
    }
}
