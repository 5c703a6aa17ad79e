//! `RecordOrigin`: which file and record an element came from, so that a per-element op that
//! fails on it (a corrupt image, a malformed Example) can say where the bad bytes are.
//!
//! Elements carry no origin of their own (see `origin_cell` for how a pipeline tracks them).

use std::fmt;

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
