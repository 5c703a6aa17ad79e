//! Iterators of the ops that keep state between elements (interleave's among them). Stateless
//! ops (map, filter, take, skip, shard) are closures in `executor.rs`.

pub(crate) mod batch;
pub(crate) mod cache;
pub(crate) mod group_by_window;
pub(crate) mod interleave;
pub(crate) mod nested;
pub(crate) mod padded_batch;
pub(crate) mod prefetch;
pub(crate) mod repeat;
pub(crate) mod shuffle;
pub(crate) mod unbatch;

use std::sync::Arc;

use sluice_element::{Cancellation, DatasetError, Element, ElementIter};

use crate::memory_budget::{element_bytes, Reservation};

/// Creates a fresh iterator over an upstream pipeline.
pub(crate) type Factory = Arc<dyn Fn() -> Result<ElementIter, DatasetError> + Send + Sync>;

/// Reads `input` into `buffer` until it holds `until` elements or the input ends (`done` set),
/// charging each element to `held` and checking `cancel` before each read. An error of the
/// input or of the cancellation is returned as it is; past the memory budget, the buffer and
/// its charge are dropped and nothing more is read (`done` set) before the error is returned.
pub(super) fn fill_held(
    input: &mut ElementIter,
    buffer: &mut Vec<Element>,
    until: usize,
    held: &Reservation,
    cancel: &Cancellation,
    done: &mut bool,
) -> Option<DatasetError> {
    while !*done && buffer.len() < until {
        if let Err(e) = cancel.check() {
            return Some(e);
        }
        match input.next() {
            Some(Ok(e)) => {
                if let Err(err) = held.grow(element_bytes(&e)) {
                    *done = true;
                    buffer.clear();
                    held.clear();
                    return Some(err);
                }
                buffer.push(e)
            }
            Some(Err(e)) => return Some(e),
            None => *done = true,
        }
    }
    None
}
