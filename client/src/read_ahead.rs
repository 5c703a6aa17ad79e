//! `ReadAhead`: how many elements a reader requests or buffers ahead of its caller, as the
//! permits of one semaphore (a permit is taken before an element is requested and given back
//! when the caller takes the element; see `element_stream`).
//!
//! A reader told its `max_outstanding_requests` keeps exactly that many. Without it (tf.data's
//! `AUTOTUNE`) the window opens when the caller first asks for an element (as tf.data's reader
//! starts fetching at its first `get_next`: a reader made and not read yet holds nothing a worker
//! restart would have it read twice), starts small, and doubles when the window is what the
//! caller waits for, up to the autotuned maximum: the caller found nothing to read, and the
//! message that ended its wait, with the messages already queued behind it, brought a burst (at
//! least a quarter of the window), which a worker sends when it had elements ready and waited for
//! credits. A worker slower than its
//! reader sends each element as it is made, one per message, and a deeper window would only
//! move more of the task into this reader's buffer. At most one doubling per half a window
//! taken, and never a window past half of what the caller has taken: on a loaded machine a
//! reader starves often whatever its window, and the start of an epoch must stay shallow.
//!
//! So a caller that keeps up with fast workers grows the window in a few round trips to the
//! depth that throughput needs; one that reads slowly, one consumer among many of a shared job,
//! or one whose workers are the bottleneck, keeps a small one. A task does not drain into one
//! reader's buffer at the start: the other consumers of a shared job get their share, and a
//! worker that joins or restarts mid-epoch still finds the epoch unfinished (tf.data's reader,
//! which prefetches about one element per core, behaves so).

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

    /// The caller found nothing to read: opens a growing window at its first request.
    pub(crate) fn starved(&self, taken: u64) {
        let mut growth = self.lock();
        if growth.size == 0 {
            self.permits.add_permits(self.initial as usize);
            *growth = Growth {
                size: self.initial,
                grown_at: taken,
            };
        }
    }

    /// A wait of the caller's ended with a burst of `burst` elements (the message that ended it
    /// and those already queued behind it), after it took `taken`
    /// in all: doubles the window (up to its maximum) when the burst shows the worker had
    /// elements ready and waited for credits (at least a quarter of the window, and 2), and the
    /// caller took at least half a window since the window last grew. The wait for the first
    /// elements is latency, not a window too small.
    pub(crate) fn stall_ended(&self, burst: u64, taken: u64) {
        let mut growth = self.lock();
        let size = growth.size;
        if size == 0 || size >= self.max {
            return;
        }
        if burst < u64::from(size / 4).max(2)
            || taken < growth.grown_at + u64::from(size / 2).max(1)
        {
            return;
        }
        // Never past half of what the caller took: an epoch's start stays shallow however the
        // machine's load makes the caller wait.
        let earned = u32::try_from(taken / 2).unwrap_or(u32::MAX);
        let grown = size.saturating_mul(2).min(self.max).min(earned);
        if grown <= size {
            return;
        }
        self.permits.add_permits((grown - size) as usize);
        *growth = Growth {
            size: grown,
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
    fn an_autotuned_window_doubles_when_bursts_end_its_waits_and_a_fixed_one_never_grows() {
        // (window, waits that ended with (burst, total taken), window after each)
        type Case = (ReadAhead, Vec<(u64, u64, u32)>);
        let cases: Vec<Case> = vec![
            (
                ReadAhead::growing(8, 64),
                vec![
                    (4, 0, 8),     // the first elements: latency
                    (4, 3, 8),     // under half a window since the start
                    (4, 4, 8),     // half a window, but only 4 taken: at most 2
                    (4, 32, 16),   // a burst of half a window: grows
                    (8, 33, 16),   // again at once: not before half of the new window
                    (3, 40, 16),   // a trickle (under a quarter of the window): the worker's pace
                    (1, 90, 16),   // one element at a time: the worker's pace, however long
                    (4, 91, 32),   // a burst of a quarter
                    (16, 107, 53), // 16 more, capped at half of 107 taken
                    (16, 200, 64), // at the maximum
                    (32, 400, 64), // stays there
                ],
            ),
            (ReadAhead::growing(100, 10), vec![(10, 1000, 10)]),
            (
                ReadAhead::growing(0, 4),
                vec![(1, 2, 1), (2, 4, 2), (2, 8, 4)],
            ),
            (ReadAhead::fixed(3), vec![(3, 10, 3), (3, 1000, 3)]),
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
            window.starved(0);
            window.starved(0);
            for (burst, taken, want) in steps {
                window.stall_ended(burst, taken);
                assert_eq!(
                    window.size(),
                    want,
                    "after a wait ended by {burst} elements at {taken}"
                );
                assert_eq!(
                    window.permits.available_permits(),
                    want as usize,
                    "the permits follow the window"
                );
            }
        }
    }
}
