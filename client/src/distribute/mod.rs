//! tf.distribute's input side: global batches split between the replicas that train in sync,
//! input functions that build one pipeline per input worker, and auto-sharding between
//! pipelines. The input is a local dataset or a service read.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sluice_client::ClientError> {
//! use sluice_client::distribute::{DistributeConfig, DistributedDataset};
//! use sluice_pipeline::{Dataset, Transform};
//! // Two replicas in sync: each global batch of 4 is split into two batches of 2.
//! let dataset = DistributedDataset::new(Dataset::range(9).batch(4), DistributeConfig::replicas(2))?;
//! let mut steps = dataset.iter().await?;
//! while let Some(step) = steps.get_next_as_optional().await? {
//!     println!("{}", step.to_json()); // [[0,1],[2,3]], [[4,5],[6,7]], [[8],[]]
//! }
//! # Ok(()) }
//! ```
//!
//! Layout:
//! - `distribute_config`: `DistributeConfig`, replicas, pipelines and the auto-shard policy.
//! - `input_context`: `InputContext`, what an input function learns about its pipeline.
//! - `distributed_dataset`: `DistributedDataset`, `DistributedInput`,
//!   `distribute_datasets_from_function`, and auto-sharding for a pipeline.
//! - `distributed_iterator`: `DistributedIterator`, one epoch, step by step.
//! - `per_replica`: `PerReplica`, one step's values.
//! - `rebatch`: cutting a global batch into per-replica batches (tf's rebatching).

mod distribute_config;
mod distributed_dataset;
mod distributed_iterator;
mod input_context;
mod per_replica;
mod rebatch;

pub use distribute_config::DistributeConfig;
pub use distributed_dataset::{
    distribute_datasets_from_function, DistributedDataset, DistributedInput,
};
pub use distributed_iterator::DistributedIterator;
pub use input_context::InputContext;
pub use per_replica::PerReplica;
pub use sluice_pipeline::AutoShardPolicy;
