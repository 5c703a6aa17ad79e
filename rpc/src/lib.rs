//! Sluice's transport: what the worker and the client both use to talk to the dispatcher quorum
//! and to each other, so that neither depends on the other.
//!
//! Layout:
//! - `dispatcher_client`: `DispatcherClient`, leader following, retries, hedging, request ids.
//! - `leader_view`: `LeaderView`, the newest leader the replicas named, shared by callers;
//!   `leader_watcher`: the `WatchLeader` stream per replica that feeds it.
//! - `dispatcher_rpcs`: the dispatcher's RPCs as typed methods (`lease_splits`, ...) and their
//!   argument and result types (`SplitLease`, `JobRequest`, ...).
//! - `lease_batcher`: a client's concurrent lease requests, sent together in one call.
//! - `error`: `RpcError`, how a dispatcher call failed.
//! - `ids`: the id newtypes (`DatasetId`, `JobId`, `IterationId`, `TaskId`, `ClientId`,
//!   `WorkerId`, `NodeId`).
//! - `sharding_policy`, `target_workers`: the enums the client, the worker and the dispatcher's
//!   state share (`Compression` is `sluice_element`'s, which implements it; re-exported here).
//! - `invalid_value`: `InvalidValue`, a value one of those enums does not have.
//! - `raw_frame`: the raw fetch protocol's wire format; `raw_fetch`: its reading side's
//!   connection (the worker serves it in `sluice_worker::raw_fetch`).
//! - `local_workers`: `LocalWorkers`, the workers running in this process.
//! - `worker_address`: `check_worker_address`, whether clients can dial a worker's address.
//! - `fake_dispatcher` (feature `fake-dispatcher`): a stand-in replica for tests.

pub mod dispatcher_client;
pub mod dispatcher_rpcs;
pub mod error;
#[cfg(any(test, feature = "fake-dispatcher"))]
pub mod fake_dispatcher;
pub mod ids;
pub mod invalid_value;
mod leader_view;
mod leader_watcher;
mod lease_batcher;
pub mod local_workers;
pub mod raw_fetch;
pub mod raw_frame;
mod request_ids;
pub mod sharding_policy;
pub mod target_workers;
pub mod worker_address;

#[cfg(test)]
mod fuzz_tests;

pub use dispatcher_client::{DispatcherClient, RetryConfig};
pub use dispatcher_rpcs::{
    lease_slack, ClientHeartbeat, ClientHeartbeatReply, IterationClient, JobRequest, KnownTasks,
    LeaseRequest, SplitLease, WorkerHeartbeat, MAX_LEASE_SLACK,
};
pub use error::{is_retryable_code, is_retryable_status, RpcError};
pub use ids::{ClientId, DatasetId, IterationId, JobId, NodeId, TaskId, WorkerId};
pub use invalid_value::InvalidValue;
pub use local_workers::{LocalWorker, LocalWorkers};
pub use sharding_policy::ShardingPolicy;
pub use sluice_element::Compression;
pub use target_workers::TargetWorkers;
pub use worker_address::check_worker_address;
