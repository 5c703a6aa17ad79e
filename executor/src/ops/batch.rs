//! `batch`: stacks consecutive elements along a new first dimension, component-wise for tuples
//! and dicts. The last partial batch is kept unless `drop_remainder`.
//!
//! The elements of the batch being built are held against the memory budget, so a batch size
//! no memory could hold fails with `ResourceExhausted` instead of growing without end; the
//! fill loop checks the cancellation flag, as it may pull many elements before yielding.

use std::sync::Arc;

use sluice_element::{Cancellation, DatasetError, Element, Tensor};

use super::padded_batch::Padding;

use crate::memory_budget::Reservation;
use sluice_element::ElementIter;

/// The most slots allocated ahead for a batch: a huge batch size with a short input must not
/// reserve it all.
const MAX_PREALLOCATED: usize = 1 << 16;

pub(crate) struct BatchIter {
    input: ElementIter,
    size: usize,
    drop_remainder: bool,
    /// Elements of the batch being built; kept across an upstream error.
    pending: Vec<Element>,
    /// What `pending` holds, against the memory budget.
    held: Reservation,
    cancel: Cancellation,
    done: bool,
    /// `padded_batch`: how each component is padded before stacking.
    padding: Option<Arc<Padding>>,
}

impl BatchIter {
    pub(crate) fn new(
        input: ElementIter,
        size: usize,
        drop_remainder: bool,
        held: Reservation,
        cancel: Cancellation,
    ) -> Self {
        BatchIter {
            input,
            size,
            drop_remainder,
            pending: Vec::with_capacity(size.min(MAX_PREALLOCATED)),
            held,
            cancel,
            done: false,
            padding: None,
        }
    }

    /// This batch padding each component as `padding` says (`padded_batch`).
    pub(crate) fn padded(self, padding: Arc<Padding>) -> Self {
        BatchIter {
            padding: Some(padding),
            ..self
        }
    }
}

impl Iterator for BatchIter {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        // Past the budget no partial batch follows the error.
        if let Some(e) = super::fill_held(
            &mut self.input,
            &mut self.pending,
            self.size,
            &self.held,
            &self.cancel,
            &mut self.done,
        ) {
            return Some(Err(e));
        }
        if self.pending.is_empty() || (self.pending.len() < self.size && self.drop_remainder) {
            return None;
        }
        // The next batch's buffer is allocated at its full size once, not grown element by
        // element (capped).
        let parts = std::mem::replace(
            &mut self.pending,
            Vec::with_capacity(self.size.min(MAX_PREALLOCATED)),
        );
        let batch = match &self.padding {
            None => stack(parts),
            Some(padding) => padding.pad_and_stack(parts, &self.held),
        };
        // The batch is handed on: downstream holds it now.
        self.held.clear();
        Some(batch)
    }
}

/// Stacks elements of the same structure, dtypes and shapes.
pub(crate) fn stack(parts: Vec<Element>) -> Result<Element, DatasetError> {
    match parts.first() {
        None => Err(DatasetError::invalid("cannot batch zero elements")),
        Some(Element::Tensor(_)) => {
            let tensors = parts
                .into_iter()
                .map(|p| match p {
                    Element::Tensor(t) => Ok(t),
                    other => Err(structure_mismatch(&other)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Tensor::stack(&tensors).map(Element::Tensor)
        }
        Some(Element::Tuple(first)) => {
            let arity = first.len();
            let mut columns: Vec<Vec<Element>> = (0..arity)
                .map(|_| Vec::with_capacity(parts.len()))
                .collect();
            for p in parts {
                match p {
                    Element::Tuple(items) if items.len() == arity => {
                        for (col, item) in columns.iter_mut().zip(items) {
                            col.push(item);
                        }
                    }
                    other => return Err(structure_mismatch(&other)),
                }
            }
            Ok(Element::Tuple(
                columns.into_iter().map(stack).collect::<Result<_, _>>()?,
            ))
        }
        Some(Element::Dict(first)) => {
            let keys: Vec<String> = first.keys().cloned().collect();
            let mut columns: Vec<Vec<Element>> = (0..keys.len())
                .map(|_| Vec::with_capacity(parts.len()))
                .collect();
            for p in parts {
                match p {
                    Element::Dict(fields) if fields.keys().eq(keys.iter()) => {
                        for (col, v) in columns.iter_mut().zip(fields.into_values()) {
                            col.push(v);
                        }
                    }
                    other => return Err(structure_mismatch(&other)),
                }
            }
            let values = columns
                .into_iter()
                .map(stack)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Element::Dict(keys.into_iter().zip(values).collect()))
        }
    }
}

fn structure_mismatch(other: &Element) -> DatasetError {
    DatasetError::invalid(format!(
        "cannot batch elements with different structures: found {}",
        other.spec()
    ))
}
