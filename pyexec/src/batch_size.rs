//! How many elements go to an executor in one BATCH: chosen from what the last batches cost,
//! so that a cheap function's elements share a frame (and the pipe round trip, the wake-ups and
//! the Python loop's fixed cost per frame) while a slow one's go one by one.
//!
//! The rule aims a batch at `TARGET_NANOS` of the executor's time: a function that takes more
//! than that per element runs in batches of 1 (no element waits behind another in its frame),
//! one that takes less gets `TARGET_NANOS / cost` elements. A batch grows at most twofold from
//! one measure to the next (so one fast outlier does not make a huge batch), and shrinks at
//! once. Pure: the measures in, the next size out.

use std::time::Duration;

/// The executor time one batch aims at.
pub const TARGET_NANOS: u64 = 2_000_000;

/// The most elements in one batch (the stage keeps a few batches in flight per executor, and
/// it holds at most 1,024 calls in flight).
pub const MAX_BATCH: usize = 128;

/// The batch size after a batch of `elements` took `elapsed` in the executor, when the size
/// was `current`.
pub fn next_batch_size(current: usize, elements: usize, elapsed: Duration) -> usize {
    let current = current.clamp(1, MAX_BATCH);
    if elements == 0 {
        return current;
    }
    let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
    let per_element = (nanos / elements as u64).max(1);
    let fits = usize::try_from(TARGET_NANOS / per_element).unwrap_or(MAX_BATCH);
    fits.min(current.saturating_mul(2)).clamp(1, MAX_BATCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn micros(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_cheap_function_grows_twofold_per_batch_up_to_the_most() {
        let mut size = 1;
        let mut sizes = Vec::new();
        for _ in 0..10 {
            // 5 µs per element.
            size = next_batch_size(size, size, micros(5 * size as u64));
            sizes.push(size);
        }
        assert_eq!(sizes, [2, 4, 8, 16, 32, 64, 128, 128, 128, 128]);
    }

    #[test]
    fn the_size_settles_where_a_batch_takes_the_target() {
        // 250 µs per element: 8 elements make 2 ms.
        let mut size = 1;
        for _ in 0..10 {
            size = next_batch_size(size, size, micros(250 * size as u64));
        }
        assert_eq!(size, 8);
        // 20 µs per element: 100.
        for _ in 0..10 {
            size = next_batch_size(size, size, micros(20 * size as u64));
        }
        assert_eq!(size, 100);
    }

    #[test]
    fn a_slow_function_stays_at_one() {
        for per_element in [2_000, 2_500, 5_000, 1_000_000] {
            assert_eq!(
                next_batch_size(1, 1, micros(per_element)),
                1,
                "{per_element} µs"
            );
        }
    }

    #[test]
    fn a_function_that_turns_slow_drops_to_its_size_at_once() {
        assert_eq!(next_batch_size(128, 128, micros(128 * 3_000)), 1);
        assert_eq!(next_batch_size(128, 128, micros(128 * 500)), 4);
    }

    #[test]
    fn a_partial_batch_counts_its_own_elements() {
        // The last batch of an input had 3 elements at 10 µs: the size may still grow.
        assert_eq!(next_batch_size(16, 3, micros(30)), 32);
    }

    #[test]
    fn odd_measures_are_bounded() {
        assert_eq!(next_batch_size(0, 1, Duration::ZERO), 2);
        assert_eq!(next_batch_size(usize::MAX, 1, Duration::ZERO), MAX_BATCH);
        assert_eq!(next_batch_size(7, 0, micros(10)), 7);
        assert_eq!(next_batch_size(64, 1, Duration::MAX), 1);
    }
}
