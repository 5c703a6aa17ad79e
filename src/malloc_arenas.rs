//! How a dispatcher process uses malloc: one arena, trimmed every few seconds.
//!
//! glibc gives threads that allocate at the same time arenas of their own, up to eight per
//! core, and returns little of what they once held. A dispatcher allocates many small,
//! short-lived values on every thread of its two runtimes; spread over many arenas, the freed
//! memory stays fragmented and resident. Measured on the leader after 100,000 short jobs whose
//! records were all removed (`sluice bench --only scale`'s soak): 138 MiB resident with glibc's
//! default, 68 to 80 MiB with one arena, level from about half the jobs on. Even one arena
//! keeps pages it no longer uses: a dispatcher also trims the heap every few seconds
//! (`malloc_trim`, which hands free pages back to the kernel), which left 44 to 50 MiB. A
//! dispatcher's allocations are few next to a worker's data path, which keeps glibc's default.

/// Arenas of a dispatcher process.
const DISPATCHER_ARENAS: i32 = 1;
/// How often a dispatcher hands freed heap pages back to the kernel.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Caps the malloc arenas of this process and starts the thread that trims the heap; call it
/// first thing, before any other thread starts. Elsewhere than glibc it does nothing.
pub fn cap_for_dispatcher() {
    // An operator's own `MALLOC_ARENA_MAX` (read by glibc at startup) wins.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: `mallopt` only sets an allocator parameter; it is called before any other
        // thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, DISPATCHER_ARENAS);
        }
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    let _ = std::thread::Builder::new()
        .name("malloc-trim".into())
        .spawn(|| loop {
            std::thread::sleep(TRIM_EVERY);
            // SAFETY: `malloc_trim` only releases free memory of the allocator's own.
            unsafe {
                libc::malloc_trim(0);
            }
        });
}
