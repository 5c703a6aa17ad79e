//! How many elements go to an executor in one BATCH: chosen from what the last batches cost,
//! so that a function's elements share a frame (and the pipe round trip, the wake-ups of the
//! worker's threads and of the reader, and the Python loop's fixed cost per frame) while a
//! batch stays short and small.
//!
//! The rule aims a batch at `TARGET_NANOS` of the executor's time and at most `TARGET_BYTES`
//! of inputs and results: a function that takes more than that time per element, or whose
//! element and outputs are larger than that, runs in batches of 1; one that takes less gets
//! `TARGET_NANOS / cost` elements (and at most `TARGET_BYTES / bytes`). A batch grows at most
//! twofold from one measure to the next (so one fast outlier does not make a huge batch), and
//! shrinks at once. Pure: the measures in, the next size out.
//!
//! Why these targets: each batch costs the worker and the reader about 0.2-0.3 ms of CPU
//! however many elements it holds (its elements are handed on together), measured on a 2-core
//! machine with a 4 ms function, where batches of one element took 6% of the CPU from the
//! executors and batches of five 2%. A batch of 20 ms holds that cost near 1% of the
//! executors' time; its first element waits at most that long behind the others, which a
//! reader with elements buffered does not see (the first batch of a function is 1 element, so
//! the first element of an epoch does not wait). The byte target is an executor's request slot
//! (`SharedLayout::DEFAULT`), so a batch's inputs fit it. A smaller one costs large elements
//! more than it saves: with a 0.25 ms image function (12 KiB in, 48 KiB out) on that machine,
//! batches of 4 MiB (68 images) took the executors 262-266 µs of CPU per image and the worker
//! 14-16 µs, against 268-277 µs and 16-22 µs in batches of 1 MiB (17 images): each batch wakes
//! the worker's and the reader's threads, and each wake-up takes an executor's core.

use std::time::Duration;

/// The executor time one batch aims at.
pub const TARGET_NANOS: u64 = 20_000_000;

/// The bytes of inputs and results one batch aims at most.
pub const TARGET_BYTES: usize = 4 << 20;

/// The most elements in one batch (the stage keeps a few batches in flight per executor, and
/// it holds at most 1,024 calls in flight).
pub const MAX_BATCH: usize = 128;

/// The batch size after a batch of `elements` took `elapsed` in the executor and `bytes` of
/// inputs and results, when the size was `current`.
pub fn next_batch_size(current: usize, elements: usize, elapsed: Duration, bytes: usize) -> usize {
    let current = current.clamp(1, MAX_BATCH);
    if elements == 0 {
        return current;
    }
    let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
    let per_element = (nanos / elements as u64).max(1);
    let fits_time = usize::try_from(TARGET_NANOS / per_element).unwrap_or(MAX_BATCH);
    let fits_bytes = TARGET_BYTES / (bytes / elements).max(1);
    fits_time
        .min(fits_bytes)
        .min(current.saturating_mul(2))
        .clamp(1, MAX_BATCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn micros(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// The sizes a function settles at from 1: `per_element` µs and `bytes` per element.
    fn settled(per_element: u64, bytes: usize) -> Vec<usize> {
        let mut size = 1;
        (0..10)
            .map(|_| {
                size = next_batch_size(size, size, micros(per_element * size as u64), bytes * size);
                size
            })
            .collect()
    }

    #[test]
    fn a_cheap_function_grows_twofold_per_batch_up_to_the_most() {
        assert_eq!(settled(5, 16), [2, 4, 8, 16, 32, 64, 128, 128, 128, 128]);
    }

    #[test]
    fn the_size_settles_where_a_batch_takes_the_target_time_or_bytes() {
        let cases = [
            // (µs per element, bytes per element, the size it settles at)
            (250, 64, 80),      // 20 ms / 250 µs
            (4_000, 12_300, 5), // a 4 ms augmentation: 20 ms / 4 ms
            (150, 61_500, 68),  // an image in, a 48 KiB image out: 4 MiB / 60 KiB
            (20, 72, 128),      // 20 µs: the most
            (5, 300_000, 13),   // cheap but large: 4 MiB / 300 KB
            (20_000, 64, 1),    // 20 ms or more: one by one
            (50, 1 << 20, 4),   // a megabyte: 4 MiB / 1 MiB
            (50, 4 << 20, 1),   // four megabytes or more: one by one
            (1_000_000, 10 << 20, 1),
        ];
        for (per_element, bytes, size) in cases {
            assert_eq!(
                *settled(per_element, bytes).last().unwrap(),
                size,
                "{per_element} µs, {bytes} bytes"
            );
        }
    }

    #[test]
    fn a_function_that_turns_slow_or_large_drops_to_its_size_at_once() {
        assert_eq!(next_batch_size(128, 128, micros(128 * 30_000), 128), 1);
        assert_eq!(next_batch_size(128, 128, micros(128 * 5_000), 128), 4);
        assert_eq!(next_batch_size(128, 128, micros(128), 128 * (4 << 20)), 1);
        assert_eq!(next_batch_size(128, 128, micros(128), 128 * (1 << 20)), 4);
    }

    #[test]
    fn a_partial_batch_counts_its_own_elements() {
        // The last batch of an input had 3 elements at 10 µs: the size may still grow.
        assert_eq!(next_batch_size(16, 3, micros(30), 300), 32);
    }

    #[test]
    fn odd_measures_are_bounded() {
        assert_eq!(next_batch_size(0, 1, Duration::ZERO, 0), 2);
        assert_eq!(next_batch_size(usize::MAX, 1, Duration::ZERO, 0), MAX_BATCH);
        assert_eq!(next_batch_size(7, 0, micros(10), 10), 7);
        assert_eq!(next_batch_size(64, 1, Duration::MAX, 0), 1);
        assert_eq!(next_batch_size(64, 1, micros(1), usize::MAX), 1);
    }
}
