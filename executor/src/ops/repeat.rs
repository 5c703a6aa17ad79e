//! `repeat`: re-creates its upstream for every pass (so sources re-read, shuffles reshuffle and
//! split suppliers are asked for the next repetition). Stops early if a pass yields nothing, so
//! `repeat()` over an empty input ends instead of spinning. Each new pass checks the
//! cancellation flag.

use sluice_element::{Cancellation, DatasetError, Element};

use super::Factory;
use sluice_element::ElementIter;

pub(crate) struct RepeatIter {
    upstream: Factory,
    /// Passes left to start; `None` forever.
    remaining: Option<u64>,
    current: Option<ElementIter>,
    yielded_this_pass: bool,
    done: bool,
    cancel: Cancellation,
}

impl RepeatIter {
    pub(crate) fn new(upstream: Factory, count: Option<u64>, cancel: Cancellation) -> Self {
        RepeatIter {
            upstream,
            remaining: count,
            current: None,
            yielded_this_pass: false,
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
                    if !self.yielded_this_pass {
                        self.done = true;
                    }
                }
            }
        }
    }
}
