//! The vocabulary every Sluice layer shares and the dispatcher's journal persists: ids, the
//! enums a job is described by, and a split lease. It depends on no other Sluice crate and knows
//! nothing of protobuf (`sluice_rpc::convert` and the dispatcher's `convert` read and write the
//! wire forms).
//!
//! Every serde encoding here is part of the dispatcher's on-disk format (bincode encodes
//! structure: field order, variant order, integer types), so a change to a type's shape is a
//! change of the journal's format version.
//!
//! Layout:
//! - `ids`: the id newtypes (`DatasetId`, `JobId`, `IterationId`, `TaskId`, `ClientId`,
//!   `WorkerId`, `NodeId`).
//! - `sharding_policy`: `ShardingPolicy`, how a job's data is divided between workers.
//! - `target_workers`: `TargetWorkers`, which workers a job's clients read from.
//! - `invalid_value`: `InvalidValue`, a value one of those enums does not have.
//! - `lease`: `LeaseRequest` and `SplitLease`, a split lease asked for and granted.
//! - `delivery`: `Delivery`, exactly once or at most once.
//! - `index_runs`: `IndexRuns`, the element indices of a stream that readers received.

mod delivery;
mod ids;
mod index_runs;
mod invalid_value;
mod lease;
mod sharding_policy;
mod target_workers;

pub use delivery::Delivery;
pub use ids::{ClientId, DatasetId, IterationId, JobId, NodeId, TaskId, WorkerId};
pub use index_runs::IndexRuns;
pub use invalid_value::InvalidValue;
pub use lease::{LeaseRequest, SplitLease};
pub use sharding_policy::ShardingPolicy;
pub use target_workers::TargetWorkers;
