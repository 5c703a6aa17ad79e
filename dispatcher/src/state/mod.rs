//! The replicated dispatcher state: pure data and the one function that changes it.
//!
//! Nothing in this module does I/O, reads a clock, draws random numbers or touches tokio, tonic
//! or sled: `DispatcherState::apply` must produce the same state and outcome on every replica
//! from the same log. Decisions that need time or randomness are made by the leader and carried
//! in the [`Update`].
//!
//! Layout:
//! - `update`: `Update`, `Request`, `Proposal`, `Outcome`, `Rejection` and the value types they carry.
//! - `entities`: datasets, workers, jobs, iterations, tasks as stored in the state.
//! - `lineage`: exactly-once delivery: lineages, the leases and deliveries they record.
//! - `checkpoint`: readers' states: the checkpoints they point to, restored iterations.
//! - `split_cursor`: the per-provider cursor of a distributed_epoch iteration.
//! - `request_log`: the recorded outcomes of retryable requests, and when they are forgotten.
//! - `worker_index_resolver`: the static-sharding worker list and each worker's index in it.
//! - `changes`: which workers and iterations the last applied entries touched (not replicated:
//!   what long polls wake on).
//! - `dispatcher_state`: `DispatcherState` and `apply`, with the handling of each update in one
//!   file per entity beside it (datasets, workers, jobs, iterations, tasks, splits, rounds) and
//!   the read-only queries.

mod changes;
mod checkpoint;
mod dispatcher_state;
mod entities;
mod lineage;
mod request_log;
mod split_cursor;
mod update;
mod worker_index_resolver;

#[cfg(test)]
mod dispatcher_state_tests;

pub use changes::{Changes, Touched, Watched};
pub use checkpoint::{Checkpoint, CHECKPOINTS_KEPT, MAX_CHECKPOINTS};
pub use dispatcher_state::{
    check_rounds, definition_hex, definition_key, ApplyContext, DispatcherState, StateSizes, Taken,
    MAX_DEFINITION_BYTES,
};
pub use entities::{Dataset, Definition, DefinitionKey, Iteration, Job, PendingTask, Task, Worker};
pub use lineage::{DeliveryReport, ExactlyOnce, Lineage, RecordedLease};
pub use split_cursor::SplitCursor;
pub use update::{
    DatasetMetadata, JobOptions, Outcome, Outcomes, Proposal, Rejection, Request, RequestId, Update,
};
pub use worker_index_resolver::WorkerIndexResolver;
