//! The Sluice client library: register datasets and read them through the service.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sluice_client::ClientError> {
//! use sluice_client::{DispatcherClient, DispatcherClientExt, DistributeOptions, ShardingPolicy};
//! use sluice_dataset::{Dataset, Transform};
//! let client = DispatcherClient::new("127.0.0.1:5050")?;
//! let dataset = Dataset::range(5).map("square"); // runs on the workers
//! let service = client.distribute(&dataset, ShardingPolicy::Off, DistributeOptions::default()).await?;
//! let mut epoch = service.map("square").iter().await?; // this map runs here
//! while let Some(element) = epoch.next().await {
//!     println!("{}", element?.to_json());
//! }
//! # Ok(()) }
//! ```
//!
//! The transport (`DispatcherClient`, the ids, `ShardingPolicy`, `Compression`,
//! `TargetWorkers`, `LocalWorkers`) is `sluice_rpc`'s, re-exported here so a user of the client
//! imports this crate alone.
//!
//! Layout:
//! - `distribute`: tf.distribute's input side: `DistributedDataset`, `InputContext`,
//!   `distribute_datasets_from_function`, per-replica splitting and auto-sharding.
//! - `options`: `DistributeOptions`, `RegisterOptions`, `CrossTrainerCache`, and which tasks
//!   `target_workers` reads.
//! - `service_dataset`: `ServiceDataset`, and `DispatcherClientExt` with `distribute` /
//!   `register_dataset` / `from_dataset_id`.
//! - `element_stream`: `ElementStream`, one epoch: heartbeats, task refresh.
//! - `local_ops`: the ops chained after `distribute`, run on a thread of the reader.
//! - `task_stream`: one task's fetch stream with credit-based flow control.
//! - `coordinated`: coordinated reads, consumers in lockstep rounds over the tasks.
//! - `read_params`: checks made when an epoch starts (cross-trainer cache, local reads).
//! - `error`: `ClientError`.
//! - `client_metrics`: `ClientMetrics`, the process's Prometheus metrics of what readers
//!   received and how long they waited; `read_metrics`: one epoch's handles on them.

pub mod client_metrics;
mod coordinated;
pub mod distribute;
pub mod element_stream;
pub mod error;
mod local_ops;
pub mod options;
pub mod read_metrics;
mod read_params;
pub mod service_dataset;
mod task_stream;

pub use client_metrics::ClientMetrics;
pub use distribute::{
    distribute_datasets_from_function, AutoShardPolicy, DistributeConfig, DistributedDataset,
    DistributedInput, DistributedIterator, InputContext, PerReplica,
};
pub use element_stream::ElementStream;
pub use error::ClientError;
pub use options::{
    CrossTrainerCache, DistributeOptions, HeartbeatWaits, RegisterOptions, HEARTBEAT_POLL,
};
pub use service_dataset::{DispatcherClientExt, ServiceDataset};
pub use sluice_dataset::Compression;
pub use sluice_rpc::{DispatcherClient, LocalWorker, LocalWorkers, RetryConfig, RpcError};
pub use sluice_types::{
    ClientId, DatasetId, IterationId, JobId, NodeId, ShardingPolicy, TargetWorkers, TaskId,
    WorkerId,
};
