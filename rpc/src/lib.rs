//! Sluice's transport: what the worker and the client both use to talk to the dispatcher quorum
//! and to each other, so that neither depends on the other. The types they exchange (ids,
//! `ShardingPolicy`, `TargetWorkers`, `LeaseRequest`, `SplitLease`, ...) are `sluice_types`'.
//!
//! Layout:
//! - `dispatcher_client`: `DispatcherClient`, the dispatcher's RPCs as typed methods
//!   (`lease_splits`, ...) with their request ids.
//! - `dispatcher_rpcs`: those methods' argument and result types (`JobRequest`,
//!   `ClientHeartbeat`, ...).
//! - `quorum`: `Quorum` and `RetryConfig`, how a call reaches the leader (leader following,
//!   retries, hedging, deadlines).
//! - `leader_view`: `LeaderView`, the newest leader the replicas named, shared by callers;
//!   `leader_watcher`: the `WatchLeader` stream per replica that feeds it.
//! - `lease_batcher`: `LeaseBatcher`, a client's concurrent lease requests, sent together in one
//!   call.
//! - `convert`: the protobuf forms of `sluice_types`' types (`FromProto`, `ToProto`), for both
//!   ends of the wire, and of a batch reply's lease results.
//! - `error`: `RpcError`, how a dispatcher call failed.
//! - `request_ids`: the request ids of mutating calls, and their watermark.
//! - `raw_frame`: the raw fetch protocol's wire format; `raw_fetch`: its reading side's
//!   connection (the worker serves it in `sluice_worker::raw_fetch`).
//! - `local_workers`: `LocalWorkers`, the workers running in this process.
//! - `worker_address`: `check_worker_address`, whether clients can dial a worker's address.
//! - `fake_dispatcher` (feature `fake-dispatcher`): a stand-in replica for tests.

mod convert;
mod dispatcher_client;
mod dispatcher_rpcs;
mod error;
#[cfg(any(test, feature = "fake-dispatcher"))]
pub mod fake_dispatcher;
mod leader_view;
mod leader_watcher;
mod lease_batcher;
mod local_workers;
mod quorum;
pub mod raw_fetch;
pub mod raw_frame;
pub mod raw_region;
mod request_ids;
mod worker_address;

#[cfg(test)]
mod fuzz_tests;

pub use convert::{lease_splits_result, FromProto, ToProto};
pub use dispatcher_client::{DispatcherClient, BLOB_THRESHOLD, MAX_BLOB_BYTES};
pub use dispatcher_rpcs::{
    lease_slack, ClientHeartbeat, ClientHeartbeatReply, IterationClient, JobRequest, KnownTasks,
    TaskDelivery, WorkerHeartbeat, MAX_LEASE_SLACK,
};
pub use error::{
    dataset_error_code, is_retryable_code, is_retryable_status, refuse_retry, RpcError,
    RETRY_PUSHBACK_METADATA_KEY,
};
pub use local_workers::{LocalWorker, LocalWorkers};
pub use quorum::RetryConfig;
pub use worker_address::check_worker_address;
