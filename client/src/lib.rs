//! The Sluice client library: register datasets and read them through the service.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sluice_client::ClientError> {
//! use sluice_client::{DispatcherClient, DistributeOptions, ProcessingMode};
//! use sluice_dataset::{Dataset, Transform};
//! let client = DispatcherClient::new("127.0.0.1:5050")?;
//! let dataset = Dataset::range(5).map("square"); // runs on the workers
//! let service = client.distribute(&dataset, ProcessingMode::Off, DistributeOptions::default()).await?;
//! let mut epoch = service.map("square").iter().await?; // this map runs here
//! while let Some(element) = epoch.next().await {
//!     println!("{}", element?.to_json());
//! }
//! # Ok(()) }
//! ```
//!
//! Layout:
//! - `dispatcher_client`: `DispatcherClient`, leader following, retries, request ids.
//! - `distribute`: tf.distribute's input side: `DistributedDataset`, `InputContext`,
//!   `distribute_datasets_from_function`, per-replica splitting and auto-sharding.
//! - `options`: `ProcessingMode`, `DistributeOptions`, `RegisterOptions`, `Compression`.
//! - `service_dataset`: `ServiceDataset` and `distribute` / `register_dataset` / `from_dataset_id`.
//! - `element_stream`: `ElementStream`, one epoch: heartbeats, task refresh, local ops.
//! - `task_stream`: one task's fetch stream with credit-based flow control.
//! - `raw_fetch`: that stream's connection to the worker, without gRPC.
//! - `raw_frame`: the raw fetch protocol's wire format, shared with the worker.
//! - `coordinated`: coordinated reads, consumers in lockstep rounds over the tasks.
//! - `local_workers`: `LocalWorkers`, the workers running in this process (target workers).
//! - `read_params`: checks made when an epoch starts (cross-trainer cache, local reads).
//! - `error`: `ClientError`.

mod coordinated;
pub mod dispatcher_client;
pub mod distribute;
pub mod element_stream;
pub mod error;
pub mod local_workers;
pub mod options;
pub mod raw_fetch;
pub mod raw_frame;
mod read_params;
pub mod service_dataset;
mod task_stream;

pub use dispatcher_client::{DispatcherClient, RetryConfig};
pub use distribute::{
    distribute_datasets_from_function, AutoShardPolicy, DistributeConfig, DistributedDataset,
    DistributedInput, DistributedIterator, InputContext, PerReplica,
};
pub use element_stream::ElementStream;
pub use error::ClientError;
pub use local_workers::{LocalWorker, LocalWorkers};
pub use options::{
    Compression, CrossTrainerCache, DistributeOptions, ProcessingMode, RegisterOptions,
    TargetWorkers,
};
pub use service_dataset::ServiceDataset;
