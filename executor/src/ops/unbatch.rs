//! `unbatch`: each input element split along the first dimension its components share, one
//! output element per row (rows share the input's buffers). The element being split is held
//! against the memory budget until its last row is handed on.

use sluice_element::{Cancellation, DatasetError, Element, ElementIter};

use super::padded_batch::{row_of, unbatch_rows};
use crate::memory_budget::{element_bytes, Reservation};

pub(crate) struct UnbatchIter {
    input: ElementIter,
    /// The element being split, its number of rows and the next row.
    current: Option<(Element, usize, usize)>,
    held: Reservation,
    cancel: Cancellation,
}

impl UnbatchIter {
    pub(crate) fn new(input: ElementIter, held: Reservation, cancel: Cancellation) -> Self {
        UnbatchIter {
            input,
            current: None,
            held,
            cancel,
        }
    }
}

impl Iterator for UnbatchIter {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((e, rows, next)) = &mut self.current {
                if *next < *rows {
                    let row = row_of(e, *next);
                    *next += 1;
                    return Some(row);
                }
                self.current = None;
                self.held.clear();
            }
            // Elements of no rows are skipped here, possibly many in a row.
            if let Err(e) = self.cancel.check() {
                return Some(Err(e));
            }
            let e = match self.input.next()? {
                Ok(e) => e,
                Err(err) => return Some(Err(err)),
            };
            let rows = match unbatch_rows(&e) {
                Ok(rows) => rows,
                Err(err) => return Some(Err(err)),
            };
            if let Err(err) = self.held.grow(element_bytes(&e)) {
                return Some(Err(err));
            }
            self.current = Some((e, rows, 0));
        }
    }
}
