//! `OriginCell`: where a files source records the file and position of the element it yielded
//! last, for stages that fail on it to name (`RecordOrigin`).
//!
//! A files source keeps one `OriginCell` per pipeline and writes the position of each element
//! into it just before yielding it; a stage that fails reads the cell. That is exact only while the pipeline is pulled one element at a
//! time from the source to the failing stage: the executor attaches the cell only to stages with
//! nothing but one-in, at-most-one-out ops in source order (map, filter, take, skip, shard,
//! enumerate, repeat, the native per-element ops, a prefetch of 0) before them. Behind a shuffle,
//! batch, prefetch or Python op the source runs ahead (or the element is several records), so
//! no origin is named there rather than a wrong one.
//!
//! The cell is a `std::sync::Mutex` (never held across an `.await`, never contended: the source
//! and the stages that read it run on one thread, a prefetch thread included).

use std::sync::{Arc, Mutex};

use crate::error::DatasetError;
use crate::record_origin::{RecordOrigin, RecordPosition};

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
    pub fn attach(&self, error: DatasetError) -> DatasetError {
        match self.get() {
            Some(origin) => DatasetError::AtRecord {
                origin,
                error: Box::new(error),
            },
            None => error,
        }
    }
}

#[cfg(test)]
#[path = "origin_cell_tests.rs"]
mod tests;
