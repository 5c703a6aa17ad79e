//! The identifier newtypes, shared with the dispatcher's clients and workers (they are defined
//! in `sluice_rpc::ids`, which says how they are numbered and persisted).

pub use sluice_rpc::ids::{ClientId, DatasetId, IterationId, JobId, NodeId, TaskId};
