//! A split lease as the worker asks for it ([`LeaseRequest`]) and as the dispatcher grants it
//! ([`SplitLease`]). Both are persisted by the dispatcher: a request is the payload of the
//! `LeaseSplits` log entry, a lease its recorded outcome, so their field order and types are part
//! of its on-disk format.

use crate::ids::{IterationId, TaskId};
use serde::{Deserialize, Serialize};

/// A lease request: up to `max_splits` splits of one split provider for one task.
///
/// The fields are in the order the dispatcher's log has always encoded them in (`max_splits`
/// as a varint, the same bytes as the `u64` it was persisted as).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRequest {
    pub iteration_id: IterationId,
    /// The split provider's index in the dataset.
    pub provider: u32,
    pub repetition: u64,
    pub max_splits: u32,
    pub task_id: TaskId,
}

/// A range of splits leased to one task: `[start, end)` of `repetition`, or the end of that
/// repetition's splits. Committed at the dispatcher before it arrives. Also the outcome the
/// replicated state records for a lease (hence serde).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitLease {
    pub repetition: u64,
    pub start: u64,
    pub end: u64,
    pub end_of_splits: bool,
}
