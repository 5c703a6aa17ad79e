//! Identifier newtypes shared by the dispatcher's replicated state, its clients and workers, and
//! the logs.
//!
//! Numbering follows tf.data service so logs read alike: datasets from "1000", iterations from
//! 2000, iteration clients from 3000, tasks from 4000, jobs from 5000. Ids are allocated inside
//! the dispatcher's `DispatcherState::apply` from counters that are part of the replicated state,
//! so every replica allocates the same id for the same log entry.
//!
//! The numeric ids are persisted (serde, bincode) as the bare number: their layout
//! (`pub struct TaskId(pub u64)`) is part of the dispatcher's on-disk format.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! numeric_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

numeric_id!(
    /// A job: a named (or anonymous) request to process a dataset in one processing mode.
    JobId
);
numeric_id!(
    /// One pass (repetition) over a job; tasks belong to iterations.
    IterationId
);
numeric_id!(
    /// The unit of work of one iteration on one worker.
    TaskId
);
numeric_id!(
    /// One consumer attached to an iteration (tf.data's `iteration_client_id`).
    ClientId
);

/// A registered dataset: a user-chosen string or a generated decimal string.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DatasetId(pub String);

impl fmt::Display for DatasetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for DatasetId {
    fn from(id: &str) -> Self {
        DatasetId(id.to_string())
    }
}

/// A worker, named by the address it serves and registers under (`host:port`): a worker
/// restarted at the same address is the same worker to the dispatcher.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkerId(pub String);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for WorkerId {
    fn from(address: &str) -> Self {
        WorkerId(address.to_string())
    }
}

/// A dispatcher replica's Raft id, as given by `--id`. A bare number: openraft's `NodeId` type.
pub type NodeId = u64;
