//! How many malloc arenas a dispatcher uses.
//!
//! glibc gives threads that allocate at the same time arenas of their own, up to eight per
//! core, and returns little of what they once held. A dispatcher allocates many small,
//! short-lived values on every thread of its two runtimes; spread over many arenas, the freed
//! memory stays fragmented and resident. Measured on the leader after 100,000 short jobs whose
//! records were all removed (`sluice bench --only scale`'s soak): 138 MiB resident with glibc's
//! default, 75 to 90 MiB with one arena, level from about half the jobs on. A dispatcher's
//! allocations are few next to a worker's data path, which keeps glibc's default.

/// Arenas of a dispatcher process.
const DISPATCHER_ARENAS: i32 = 1;

/// Caps the malloc arenas of this process; call it first thing, before any thread starts.
/// Elsewhere than glibc it does nothing.
pub fn cap_for_dispatcher() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets an allocator parameter; it is called before any other
    // thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, DISPATCHER_ARENAS);
    }
}
