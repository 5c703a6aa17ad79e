//! `RecordOrigin`: which file and record an element came from, so that a per-element op that
//! fails on it (a corrupt image, a malformed Example) can say where the bad bytes are.
//!
//! Elements carry no origin of their own. Instead a files source keeps one `OriginCell` per
//! pipeline and writes the position of each element into it just before yielding it; a stage
//! that fails reads the cell. That is exact only while the pipeline is pulled one element at a
//! time from the source to the failing stage: the executor attaches the cell only to stages with
//! nothing but one-in, at-most-one-out ops in source order (map, filter, take, skip, shard,
//! enumerate, repeat, the native per-element ops, a prefetch of 0) before them. Behind a shuffle,
//! batch, prefetch or Python op the source runs ahead (or the element is several records), so
//! no origin is named there rather than a wrong one.
//!
//! The cell is a `std::sync::Mutex` (never held across an `.await`, never contended: the source
//! and the stages that read it run on one thread, a prefetch thread included).

use std::fmt;
use std::sync::{Arc, Mutex};

/// Where in its file an element is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordPosition {
    /// The 0-based index of a TFRecord in its file.
    Record(u64),
    /// The 1-based number of a text line in its file.
    Line(u64),
}

/// The file and position of one element of a files source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordOrigin {
    pub file: String,
    pub position: RecordPosition,
}

impl fmt::Display for RecordOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            RecordPosition::Record(i) => write!(f, "record {i} (0-based) of '{}'", self.file),
            RecordPosition::Line(n) => write!(f, "line {n} of '{}'", self.file),
        }
    }
}

/// The position of the element a files source yielded last, shared by the source and the
/// stages allowed to name it (see the module header).
#[derive(Debug, Clone, Default)]
pub struct OriginCell(Arc<Mutex<Option<LastYielded>>>);

/// The file (shared by all its records, so writing the cell never copies the path) and the
/// position of the element yielded last.
type LastYielded = (Arc<str>, RecordPosition);

impl OriginCell {
    pub fn set(&self, file: &Arc<str>, position: RecordPosition) {
        // A poisoned cell only lost an origin: errors still flow, without it.
        if let Ok(mut cell) = self.0.lock() {
            *cell = Some((file.clone(), position));
        }
    }

    pub fn get(&self) -> Option<RecordOrigin> {
        let cell = self.0.lock().ok()?;
        cell.as_ref().map(|(file, position)| RecordOrigin {
            file: file.to_string(),
            position: *position,
        })
    }

    /// `error` with the origin of the element last yielded, if there is one.
    pub fn attach(&self, error: crate::error::DatasetError) -> crate::error::DatasetError {
        match self.get() {
            Some(origin) => crate::error::DatasetError::AtRecord {
                origin,
                error: Box::new(error),
            },
            None => error,
        }
    }
}

#[cfg(test)]
#[path = "record_origin_tests.rs"]
mod tests;
