//! `prefetch(n)`: runs the upstream on a background std thread feeding a bounded channel of `n`
//! elements.
//!
//! Dropping the returned iterator drops the receiver; the thread's next `send` then fails and
//! it exits (after finishing the upstream `next` it may be blocked in, e.g. a split request).
//! The thread is detached rather than joined for that reason: a drop must never block.

use std::sync::mpsc::{sync_channel, Receiver};

use crate::element::Element;
use crate::error::DatasetError;
use crate::executor::ElementIter;

/// Channel slots are allocated up front, so the bound is capped; the memory that matters (the
/// elements) is still bounded by it.
const MAX_SLOTS: usize = 1 << 16;

pub(crate) fn prefetch(input: ElementIter, n: usize) -> ElementIter {
    let (tx, rx) = sync_channel(n.min(MAX_SLOTS));
    // The input moves into the closure; if spawning fails we get nothing back, so build the
    // closure lazily around an Option and fall back to running inline.
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(input)));
    let thread_slot = slot.clone();
    let spawned = std::thread::Builder::new()
        .name("sluice-prefetch".to_string())
        .spawn(move || {
            let input = thread_slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(input) = input {
                for item in input {
                    if tx.send(item).is_err() {
                        break;
                    }
                }
            }
        });
    match spawned {
        Ok(_) => Box::new(Prefetched { rx }),
        Err(_) => {
            let input = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            input.unwrap_or_else(|| Box::new(std::iter::empty()))
        }
    }
}

struct Prefetched {
    rx: Receiver<Result<Element, DatasetError>>,
}

impl Iterator for Prefetched {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.rx.recv().ok()
    }
}
