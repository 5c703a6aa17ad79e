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
//!
//! With several sources below the repeat (a zip or concatenate of ranges, each with its own
//! split provider), a pass is starved when one of them asked for a split in it and got none:
//! `zip(a, b)` yields nothing when `b`'s repetition went to other workers even if `a` handed it
//! a split. A source that was not asked at all (a zip that ended on an input before it) does not
//! make the pass starved.

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
    /// In distributed_epoch mode: the split counts of the sources below, and what each had
    /// received and asked for when the current pass began.
    received: Vec<(SplitCount, u64, u64)>,
    done: bool,
    cancel: Cancellation,
}

impl RepeatIter {
    /// `received`: in distributed_epoch mode, the split counts of the sources below that have
    /// splits (empty otherwise).
    pub(crate) fn new(
        upstream: Factory,
        count: Option<u64>,
        received: Vec<SplitCount>,
        cancel: Cancellation,
    ) -> Self {
        RepeatIter {
            upstream,
            remaining: count,
            current: None,
            yielded_this_pass: false,
            received: received.into_iter().map(|r| (r, 0, 0)).collect(),
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
                for (count, received, asked) in &mut self.received {
                    *received = count.get();
                    *asked = count.asked();
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
                    let starved = self.received.iter().any(|(count, received, asked)| {
                        count.asked() != *asked && count.get() == *received
                    });
                    if !self.yielded_this_pass && !starved {
                        self.done = true;
                    }
                }
            }
        }
    }
}
