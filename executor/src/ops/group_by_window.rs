//! `group_by_window`: each element goes to the group of its key; a group that reaches its
//! window size is reduced to a dataset whose elements are yielded before the next input element
//! is read. At the input's end the groups left are reduced in key order, smallest first, as
//! tf.data does. A key's window size is asked for once, when its first element arrives.
//!
//! The elements waiting in groups are held against the memory budget.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sluice_element::{Cancellation, DatasetError, Element, ElementIter};

use crate::memory_budget::{element_bytes, MemoryShare, Reservation};

/// An element's key.
pub(crate) type KeyFn = Arc<dyn Fn(&Element) -> Result<i64, DatasetError> + Send + Sync>;
/// A key's window size.
pub(crate) type WindowSizeFn = Arc<dyn Fn(i64) -> Result<u64, DatasetError> + Send + Sync>;
/// The dataset a window becomes: its key and its elements in.
pub(crate) type ReduceFn =
    Arc<dyn Fn(i64, Vec<Element>) -> Result<ElementIter, DatasetError> + Send + Sync>;

#[derive(Clone)]
pub(crate) struct GroupSpec {
    pub(crate) key: KeyFn,
    pub(crate) window_size: WindowSizeFn,
    pub(crate) reduce: ReduceFn,
}

impl GroupSpec {
    pub(crate) fn apply(
        &self,
        input: ElementIter,
        memory: &Option<Arc<MemoryShare>>,
        cancel: &Cancellation,
    ) -> ElementIter {
        Box::new(Groups {
            input: Some(input),
            spec: self.clone(),
            groups: BTreeMap::new(),
            sizes: HashMap::new(),
            reduced: None,
            held: Reservation::new(memory.clone(), "group_by_window"),
            cancel: cancel.clone(),
        })
    }
}

struct Groups {
    /// `None` once exhausted: the groups left are being flushed.
    input: Option<ElementIter>,
    spec: GroupSpec,
    groups: BTreeMap<i64, Vec<Element>>,
    sizes: HashMap<i64, u64>,
    /// The dataset of the window reduced last, being yielded.
    reduced: Option<ElementIter>,
    held: Reservation,
    cancel: Cancellation,
}

impl Groups {
    /// Takes `key`'s group out (its bytes given back) and reduces it.
    fn reduce(&mut self, key: i64) -> Result<(), DatasetError> {
        let window = self.groups.remove(&key).unwrap_or_default();
        self.held
            .shrink(window.iter().map(element_bytes).sum::<u64>());
        self.reduced = Some((self.spec.reduce)(key, window)?);
        Ok(())
    }

    /// Puts `e` in its group, reducing the group when it is full.
    fn add(&mut self, e: Element) -> Result<(), DatasetError> {
        let key = (self.spec.key)(&e)?;
        let size = match self.sizes.get(&key) {
            Some(size) => *size,
            None => {
                let size = (self.spec.window_size)(key)?;
                self.sizes.insert(key, size);
                size
            }
        };
        self.held.grow(element_bytes(&e))?;
        let group = self.groups.entry(key).or_default();
        group.push(e);
        if group.len() as u64 >= size {
            self.reduce(key)?;
        }
        Ok(())
    }
}

impl Iterator for Groups {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(reduced) = self.reduced.as_mut() {
                match reduced.next() {
                    Some(item) => return Some(item),
                    None => self.reduced = None,
                }
            }
            if let Err(e) = self.cancel.check() {
                return Some(Err(e));
            }
            let step = match self.input.as_mut() {
                Some(input) => match input.next() {
                    Some(Ok(e)) => self.add(e),
                    Some(Err(err)) => Err(err),
                    None => {
                        self.input = None;
                        Ok(())
                    }
                },
                None => match self.groups.keys().next().copied() {
                    Some(key) => self.reduce(key),
                    None => return None,
                },
            };
            if let Err(err) = step {
                return Some(Err(err));
            }
        }
    }
}

impl Drop for Groups {
    fn drop(&mut self) {
        self.held.clear();
    }
}
