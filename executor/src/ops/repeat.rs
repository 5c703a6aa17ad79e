//! `repeat`: re-creates its upstream for every pass (so sources re-read, shuffles reshuffle and
//! split suppliers are asked for the next repetition). Stops early if a pass yields nothing, so
//! `repeat()` over an empty input ends instead of spinning. Each new pass checks the
//! cancellation flag.
//!
//! In distributed_epoch mode a pass that yields nothing because its source received no split
//! is not an empty input: the workers share each repetition's splits, and the others took them
//! all (with one split per repetition, every worker but one has such passes). As in tf.data,
//! whose `repeat` stops on an empty pass only without split providers, the next pass asks for
//! the next repetition, which has splits. A pass that received splits and yielded nothing still
//! ends the repeat, as it does locally.

use sluice_element::{Cancellation, DatasetError, Element};

use super::Factory;
use crate::sources::SplitCount;
use sluice_element::ElementIter;

pub(crate) struct RepeatIter {
    upstream: Factory,
    /// Passes left to start; `None` forever.
    remaining: Option<u64>,
    current: Option<ElementIter>,
    yielded_this_pass: bool,
    /// In distributed_epoch mode: the splits the source received, and their count when the
    /// current pass began.
    received: Option<(SplitCount, u64)>,
    done: bool,
    cancel: Cancellation,
}

impl RepeatIter {
    /// `received`: in distributed_epoch mode (with a source that has splits), the splits its
    /// source receives.
    pub(crate) fn new(
        upstream: Factory,
        count: Option<u64>,
        received: Option<SplitCount>,
        cancel: Cancellation,
    ) -> Self {
        RepeatIter {
            upstream,
            remaining: count,
            current: None,
            yielded_this_pass: false,
            received: received.map(|r| (r, 0)),
            done: false,
            cancel,
        }
    }
}

impl Iterator for RepeatIter {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            let Some(current) = self.current.as_mut() else {
                if self.remaining == Some(0) {
                    self.done = true;
                    return None;
                }
                if let Err(e) = self.cancel.check() {
                    self.done = true;
                    return Some(Err(e));
                }
                // Before the pass starts: a prefetch may ask for its first split at once.
                if let Some((received, at_start)) = self.received.as_mut() {
                    *at_start = received.get();
                }
                match (self.upstream)() {
                    Ok(it) => self.current = Some(it),
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                if let Some(r) = self.remaining.as_mut() {
                    *r -= 1;
                }
                self.yielded_this_pass = false;
                continue;
            };
            match current.next() {
                Some(item) => {
                    self.yielded_this_pass = true;
                    return Some(item);
                }
                None => {
                    self.current = None;
                    let starved = self
                        .received
                        .as_ref()
                        .is_some_and(|(received, at_start)| received.get() == *at_start);
                    if !self.yielded_this_pass && !starved {
                        self.done = true;
                    }
                }
            }
        }
    }
}
