//! Deep pipelines on any thread's stack.
//!
//! A pipeline is a chain of boxed iterators, one per op: building it calls each upstream
//! factory from the one below, `next` calls each upstream `next`, and dropping it drops each
//! upstream in turn, all one stack frame per op. A chain of thousands of ops would overflow a
//! thread's stack (and a stack overflow aborts the whole process). Every [`GUARD_EVERY`] ops
//! the chain gets a guard that, when the current stack has less than [`RED_ZONE`] left,
//! continues on a fresh stack segment (`stacker`): build, `next` and drop of a chain of any
//! length then fit whatever thread runs them. Chains shorter than `GUARD_EVERY` ops have no
//! guard and pay nothing.

use std::sync::Arc;

use sluice_element::{DatasetError, Element, ElementIter};

use crate::ops::Factory;

/// Ops between two guards. A guard's frames below it must fit in the red zone: 32 ops take a
/// few kilobytes in an optimized build and tens of kilobytes in a debug one.
pub(crate) const GUARD_EVERY: usize = 32;

/// When less than this much stack is left at a guard, the chain above it runs on a new segment.
const RED_ZONE: usize = 256 * 1024;

/// The size of each new stack segment.
const SEGMENT: usize = 4 * 1024 * 1024;

/// Whether the chain gets a guard after its `index`-th op (0-based).
pub(crate) fn guard_after(index: usize) -> bool {
    (index + 1).is_multiple_of(GUARD_EVERY)
}

struct GuardedIter {
    /// `None` only while dropping.
    inner: Option<ElementIter>,
}

impl Iterator for GuardedIter {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        let inner = self.inner.as_mut()?;
        stacker::maybe_grow(RED_ZONE, SEGMENT, || inner.next())
    }
}

impl Drop for GuardedIter {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            stacker::maybe_grow(RED_ZONE, SEGMENT, move || drop(inner));
        }
    }
}

/// `it`, its `next` and its drop guarded.
pub(crate) fn guard_iter(it: ElementIter) -> ElementIter {
    Box::new(GuardedIter { inner: Some(it) })
}

/// Holds an upstream factory and drops it behind a guard: the closures of a factory chain hold
/// their upstreams, so dropping the chain nests one frame per op too.
struct FactoryCell(Option<Factory>);

impl Drop for FactoryCell {
    fn drop(&mut self) {
        if let Some(factory) = self.0.take() {
            stacker::maybe_grow(RED_ZONE, SEGMENT, move || drop(factory));
        }
    }
}

/// `upstream`, its iterators' creation guarded and the iterators it creates guarded.
pub(crate) fn guard_factory(upstream: Factory) -> Factory {
    let cell = FactoryCell(Some(upstream));
    Arc::new(move || {
        let upstream = cell
            .0
            .as_ref()
            .expect("a factory cell is emptied only when dropped");
        stacker::maybe_grow(RED_ZONE, SEGMENT, || upstream()).map(guard_iter)
    })
}
