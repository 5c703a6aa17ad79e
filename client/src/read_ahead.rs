//! `ReadAhead`: how many elements a reader requests or buffers ahead of its caller, as the
//! permits of one semaphore (a permit is taken before an element is requested and given back
//! when the caller takes the element; see `element_stream`).
//!
//! A reader told its `max_outstanding_requests` keeps exactly that many. Without it (tf.data's
//! `AUTOTUNE`) the window opens when the caller first asks for an element (as tf.data's reader
//! starts fetching at its first `get_next`: a reader made and not read yet holds nothing a worker
//! restart would have it read twice), starts small, and doubles each time the caller finds
//! nothing to read after taking at least half a window since the last growth, up to the
//! autotuned maximum. A
//! caller that keeps up with its workers grows it in a few round trips to the depth that
//! throughput needs; one that reads slowly, or one consumer among many of a shared job, keeps
//! a small one. So a task does not drain into one reader's buffer at the start: the other
//! consumers of a shared job get their share, and a worker that joins or restarts mid-epoch
//! still finds the epoch unfinished (tf.data's reader, which prefetches about one element per
//! core, behaves so).

use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

/// The window a reader without `max_outstanding_requests` starts with.
pub(crate) const INITIAL_AUTOTUNED: u32 = 8;

#[derive(Debug)]
pub(crate) struct ReadAhead {
    permits: Arc<Semaphore>,
    max: u32,
    /// The window it opens with at the caller's first request (growing windows).
    initial: u32,
    growth: Mutex<Growth>,
}

#[derive(Debug)]
struct Growth {
    /// 0 until a growing window opens.
    size: u32,
    /// Elements the caller had taken when the window last grew.
    grown_at: u64,
}

impl ReadAhead {
    /// A window of `size`, always, open from the start.
    pub(crate) fn fixed(size: u32) -> ReadAhead {
        let size = size.max(1);
        ReadAhead {
            permits: Arc::new(Semaphore::new(size as usize)),
            max: size,
            initial: size,
            growth: Mutex::new(Growth { size, grown_at: 0 }),
        }
    }

    /// A window that opens at `initial` (at most `max`) when the caller first starves, and
    /// grows up to `max` while it starves.
    pub(crate) fn growing(initial: u32, max: u32) -> ReadAhead {
        let max = max.max(1);
        ReadAhead {
            permits: Arc::new(Semaphore::new(0)),
            max,
            initial: initial.clamp(1, max),
            growth: Mutex::new(Growth {
                size: 0,
                grown_at: 0,
            }),
        }
    }

    pub(crate) fn permits(&self) -> Arc<Semaphore> {
        self.permits.clone()
    }

    /// The size of a stream's credit grants after its first: half its `max_credits`, or half
    /// the window while that is smaller (a grant larger than the window would never be met).
    pub(crate) fn grant(&self, max_credits: u32) -> u32 {
        (max_credits / 2).min(self.lock().size / 2).max(1)
    }

    /// The current window.
    #[cfg(test)]
    fn size(&self) -> u32 {
        self.lock().size
    }

    /// The caller found nothing to read after taking `taken` elements in all: doubles the
    /// window (up to its maximum) if it took at least half a window since it last grew. A wait
    /// before the first elements arrive is latency, not a window too small.
    pub(crate) fn starved(&self, taken: u64) {
        let mut growth = self.lock();
        if growth.size == 0 {
            self.permits.add_permits(self.initial as usize);
            *growth = Growth {
                size: self.initial,
                grown_at: taken,
            };
            return;
        }
        if growth.size >= self.max || taken < growth.grown_at + u64::from(growth.size / 2).max(1) {
            return;
        }
        let size = growth.size.saturating_mul(2).min(self.max);
        self.permits.add_permits((size - growth.size) as usize);
        *growth = Growth {
            size,
            grown_at: taken,
        };
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Growth> {
        self.growth.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_autotuned_window_doubles_while_its_caller_starves_and_a_fixed_one_never_grows() {
        // (window, starvations at these totals taken, window after each)
        type Case = (ReadAhead, Vec<(u64, u32)>);
        let cases: Vec<Case> = vec![
            (
                ReadAhead::growing(8, 64),
                vec![
                    (0, 8),   // the first request opens the window
                    (0, 8),   // waiting for the first elements: latency
                    (3, 8),   // under half a window since the start
                    (4, 16),  // half a window: grows
                    (5, 16),  // again at once: not before half of the new window
                    (12, 32), // 8 more
                    (28, 64), // 16 more
                    (60, 64), // at the maximum
                ],
            ),
            (ReadAhead::growing(100, 10), vec![(0, 10), (1000, 10)]),
            (
                ReadAhead::growing(0, 4),
                vec![(0, 1), (0, 1), (1, 2), (2, 4)],
            ),
            (ReadAhead::fixed(3), vec![(0, 3), (10, 3), (1000, 3)]),
        ];
        for (window, steps) in cases {
            if window.max != window.initial || window.size() == 0 {
                assert_eq!(
                    window.size(),
                    0,
                    "a growing window opens at the first request"
                );
                assert_eq!(window.permits.available_permits(), 0);
            }
            for (taken, want) in steps {
                window.starved(taken);
                assert_eq!(window.size(), want, "after starving at {taken}");
                assert_eq!(
                    window.permits.available_permits(),
                    want as usize,
                    "the permits follow the window"
                );
            }
        }
    }
}
