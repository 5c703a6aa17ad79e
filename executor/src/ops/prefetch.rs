//! `prefetch(n)`: runs the upstream on a background std thread feeding a bounded channel of `n`
//! elements.
//!
//! Dropping the returned iterator drops the receiver; the thread's next `send` then fails and
//! it exits (after finishing the upstream `next` it may be blocked in, e.g. a split request).
//! The thread is detached rather than joined for that reason: a drop must never block.
//!
//! The queued elements are held against the memory budget: the producer takes an element's
//! bytes before sending it and the consumer gives them back when it takes the element, so a
//! huge `n` of large elements fails with `ResourceExhausted` rather than filling memory.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use sluice_element::{DatasetError, Element};

use crate::memory_budget::{element_bytes, Reservation};
use sluice_element::ElementIter;

/// Channel slots are allocated up front, so the bound is capped; the memory that matters (the
/// elements) is still bounded by it, and by the budget.
const MAX_SLOTS: usize = 1 << 16;

pub(crate) fn prefetch(input: ElementIter, n: usize, held: Reservation) -> ElementIter {
    let (tx, rx) = sync_channel(n.min(MAX_SLOTS));
    let held = Arc::new(held);
    let producer_held = held.clone();
    // The input moves into the closure; if spawning fails we get nothing back, so build the
    // closure lazily around an Option and fall back to running inline.
    let slot = Arc::new(std::sync::Mutex::new(Some(input)));
    let thread_slot = slot.clone();
    let spawned = std::thread::Builder::new()
        .name("sluice-prefetch".to_string())
        .spawn(move || {
            let input = thread_slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(input) = input {
                for item in input {
                    // Over the budget: that error is the queue's last item.
                    let (item, over_budget) = match item {
                        Ok(e) => match producer_held.grow(element_bytes(&e)) {
                            Ok(()) => (Ok(e), false),
                            Err(over) => (Err(over), true),
                        },
                        Err(e) => (Err(e), false),
                    };
                    if tx.send(item).is_err() || over_budget {
                        break;
                    }
                }
            }
        });
    match spawned {
        Ok(_) => Box::new(Prefetched { rx, held }),
        Err(_) => {
            let input = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            input.unwrap_or_else(|| Box::new(std::iter::empty()))
        }
    }
}

/// The consumer's end of a producer thread's queue (prefetch's, and each of a parallel
/// interleave's reading threads).
pub(crate) struct Prefetched {
    pub(crate) rx: Receiver<Result<Element, DatasetError>>,
    /// Shared with the producer thread: it grows, this side shrinks.
    pub(crate) held: Arc<Reservation>,
}

impl Iterator for Prefetched {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.rx.recv().ok()?;
        if let Ok(e) = &item {
            self.held.shrink(element_bytes(e));
        }
        Some(item)
    }
}

impl Drop for Prefetched {
    /// Dropping the receiver discards the queued elements: their bytes are free again.
    fn drop(&mut self) {
        self.held.clear();
    }
}
