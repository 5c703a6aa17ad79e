//! The Sluice client library: register datasets and read them through the service.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sluice_client::ClientError> {
//! use sluice_client::{DispatcherClient, DispatcherClientExt, DistributeOptions, ShardingPolicy};
//! use sluice_pipeline::{Dataset, Transform};
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
//! Layout (the modules are private but `distribute`; their public items are re-exported here):
//! - `distribute`: tf.distribute's input side: `DistributedDataset`, `InputContext`,
//!   `distribute_datasets_from_function`, per-replica splitting and auto-sharding.
//! - `options`: `DistributeOptions`, `RegisterOptions`, `CrossTrainerCache`, `HeartbeatWaits`,
//!   and which tasks `target_workers` reads.
//! - `service_dataset`: `ServiceDataset`, and `DispatcherClientExt` with `distribute` /
//!   `register_dataset` / `from_dataset_id`.
//! - `read_params`: checks made when an epoch starts (cross-trainer cache, local reads).
//! - `element_stream`: `ElementStream`, one epoch as the caller reads it.
//! - `reader_state`: `ReaderState`, a reader's position in an exactly-once epoch, and what
//!   taking one sends to the dispatcher.
//! - `driver`: the loop behind an epoch: performs `epoch`'s (or `coordinated`'s) decisions.
//! - `epoch`: the end-of-epoch rules of a reader that is not coordinated, a pure state machine
//!   (events in, decisions out).
//! - `task_stream`: one task's fetch stream with credit-based flow control.
//! - `coordinated`: coordinated reads' requests and heartbeats, as `rounds` decides them.
//! - `rounds`: coordinated reads' lockstep rounds over the tasks, a pure state machine.
//! - `local_ops`: the ops chained after `distribute`, run on a thread of the reader.
//! - `delivery`: what reaches the caller: elements (decoded or packed) and their permits.
//! - `error`: `ClientError`.
//! - `client_metrics`: `ClientMetrics`, the process's Prometheus metrics of what readers
//!   received and how long they waited.
//! - `read_metrics`: one epoch's handles on the client metrics.
//!
//! Dependencies go one way (each module uses only those above it; `error` and `options` are
//! used throughout): `delivery`; `task_stream`, `local_ops`; `epoch`; `rounds`; `coordinated`;
//! `driver`; `reader_state`; `element_stream`; `service_dataset`; `distribute`.

mod client_metrics;
mod coordinated;
mod delivery;
pub mod distribute;
mod driver;
mod element_stream;
mod epoch;
mod error;
mod local_ops;
mod options;
mod read_ahead;
mod read_metrics;
mod read_params;
mod reader_state;
mod received;
mod rounds;
mod service_dataset;
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
pub use reader_state::{ReaderState, READER_STATE_FORMAT};
pub use service_dataset::{DispatcherClientExt, ServiceDataset};
pub use sluice_element::Compression;
pub use sluice_rpc::{
    dataset_error_code, DispatcherClient, LocalWorker, LocalWorkers, RetryConfig, RpcError,
    BLOB_THRESHOLD,
};
pub use sluice_types::{
    ClientId, DatasetId, Delivery, IterationId, JobId, NodeId, ShardingPolicy, TargetWorkers,
    TaskId, WorkerId,
};
