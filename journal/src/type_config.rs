//! `JournalTypeConfig`: every bound the journal puts on an openraft `RaftTypeConfig`, in one
//! place.
//!
//! openraft's `serde` feature already makes `D`, `R`, `NodeId` and `Node` serde types, so the
//! journal only adds: log entries are `openraft::Entry<C>` (it reads their `log_id` and
//! payload), snapshots travel as `Cursor<Vec<u8>>`, and `R: Default` is the response to blank
//! and membership entries. Any type config meeting these gets the trait by the blanket impl.

use std::io::Cursor;

use openraft::Entry;
use openraft::RaftTypeConfig;

/// A `RaftTypeConfig` the journal can persist. Implemented automatically.
pub trait JournalTypeConfig:
    RaftTypeConfig<Entry = Entry<Self>, SnapshotData = Cursor<Vec<u8>>, R: Default>
{
}

impl<T> JournalTypeConfig for T where
    T: RaftTypeConfig<Entry = Entry<T>, SnapshotData = Cursor<Vec<u8>>, R: Default>
{
}
