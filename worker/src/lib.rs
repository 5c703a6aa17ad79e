//! The Sluice worker: runs the tasks the dispatcher assigns and streams their elements to
//! clients.
//!
//! Layout:
//! - `config`: `WorkerConfig`.
//! - `crash_record`: the running tasks, written to the state directory by a fatal signal and
//!   reported by the next run.
//! - `worker_handle`: start (bind, register), heartbeat loop, completion reports, shutdown.
//! - `worker_state`: the tasks held, shared by the heartbeat loop and the service.
//! - `task_runner`: one task's pipeline thread and its shared buffer (first-come-first-served).
//! - `task_buffer`: that buffer, handed over to readers in chunks of many elements.
//! - `membarrier`: the process-wide barrier that lets the pipeline append without a lock.
//! - `round_robin`: coordinated reads, one element per consumer per round.
//! - `cross_trainer_cache`: a sliding window of a task's elements shared by trainers.
//! - `definition_fetch`: a task's dataset definition, fetched by id when its pipeline starts.
//! - `split_leaser`: split ranges leased from the dispatcher for distributed_epoch tasks.
//! - `service`: the `Fetch` stream with credit-based flow control (gRPC, and `open_fetch` for
//!   both transports), one loop for every source of elements.
//! - `reader_ledger`: what a reader was sent and has not acknowledged, resent when it
//!   reconnects.
//! - `reader_stream`: one fetch stream's credits and place in its reader's ledger.
//! - `fetch_source`: those sources: the task's buffer, and its cross-trainer cache.
//! - `raw_fetch`: the worker's port shared by gRPC and raw fetch streams (no protobuf copies).
//! - `task_failure`: why a task's pipeline failed, with a Python function's exception.
//! - `error`: `WorkerError`, and its one map to the gRPC status a reader sees.
//! - `worker_stats`: elements and bytes served, pipeline time, counted on the data path.
//! - `worker_ops`: what the metrics listener serves: the worker's metrics and readiness.

mod blob_cache;
pub mod config;
pub mod crash_record;
pub mod cross_trainer_cache;
mod definition_fetch;
pub mod error;
mod fetch_source;
pub mod index_list;
mod membarrier;
mod raw_fetch;
pub mod reader_ledger;
mod reader_stream;
pub mod replay;
pub mod round_robin;
pub mod service;
pub mod split_leaser;
pub mod task_buffer;
pub mod task_failure;
pub mod task_runner;
pub mod worker_handle;
pub mod worker_ops;
pub mod worker_state;
pub mod worker_stats;

pub use config::{LeaseEvent, LeaseObserver, WorkerConfig};
pub use error::WorkerError;
pub use sluice_pyexec::PoolConfig;
pub use task_failure::TaskFailure;
pub use worker_handle::WorkerHandle;
