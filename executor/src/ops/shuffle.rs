//! `shuffle`: tf.data's buffer shuffle. Fill a buffer of `buffer_size` elements, then repeatedly
//! yield a uniformly chosen buffered element and refill from upstream. With a seed the order is
//! deterministic; each pass under an enclosing `repeat` uses a seed derived from the pass number
//! so epochs differ (tf.data's `reshuffle_each_iteration=True`).
//!
//! The buffer is held against the memory budget (a buffer size no memory could hold fails with
//! `ResourceExhausted`), and the fill loop checks the cancellation flag.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_element::{Cancellation, DatasetError, Element};

use crate::memory_budget::{element_bytes, Reservation};
use sluice_element::ElementIter;

/// The seed of pass `pass`: the user's seed for the first pass, a splitmix64 mix after that.
pub(crate) fn pass_seed(seed: u64, pass: u64) -> u64 {
    if pass == 0 {
        return seed;
    }
    let mut z = seed ^ pass.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub(crate) struct ShuffleIter {
    input: ElementIter,
    buffer: Vec<Element>,
    capacity: usize,
    rng: StdRng,
    input_done: bool,
    /// What `buffer` holds, against the memory budget.
    held: Reservation,
    cancel: Cancellation,
}

impl ShuffleIter {
    pub(crate) fn new(
        input: ElementIter,
        capacity: usize,
        seed: u64,
        held: Reservation,
        cancel: Cancellation,
    ) -> Self {
        ShuffleIter {
            input,
            // Capacity grows as elements arrive: a huge buffer_size must not allocate up front.
            buffer: Vec::with_capacity(capacity.min(1024)),
            capacity,
            rng: StdRng::seed_from_u64(seed),
            input_done: false,
            held,
            cancel,
        }
    }
}

impl Iterator for ShuffleIter {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        // Past the budget nothing more is read: the pipeline ends with the error.
        if let Some(e) = super::fill_held(
            &mut self.input,
            &mut self.buffer,
            self.capacity,
            &self.held,
            &self.cancel,
            &mut self.input_done,
        ) {
            return Some(Err(e));
        }
        if self.buffer.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..self.buffer.len());
        let e = self.buffer.swap_remove(i);
        self.held.shrink(element_bytes(&e));
        Some(Ok(e))
    }
}
