//! `DistributedDataset`: a dataset spread over the replicas that train in sync, as
//! tf.distribute's `experimental_distribute_dataset` and `distribute_datasets_from_function`
//! build it.
//!
//! Two ways in:
//! - [`DistributedDataset::new`] takes a dataset batched by the *global* batch size. With
//!   several input pipelines it is first auto-sharded for this pipeline; then each global batch
//!   is split into per-replica batches (`rebatch.rs`).
//! - [`distribute_datasets_from_function`] calls the caller's function with this pipeline's
//!   [`InputContext`]; the dataset it returns is already per replica: no sharding, no
//!   splitting (tf does neither there), its elements go to the local replicas in turn.
//!
//! The input is a local [`Dataset`] (run here by the local executor) or a [`ServiceDataset`]
//! (elements from the service, the ops chained after `distribute` run here).
//!
//! Auto-sharding a service read (tf's behaviour, `data_service_ops.py` and `auto_shard.cc`):
//! - through a named job, never: tf sets `auto_shard_policy = OFF` on it ("Disable autosharding
//!   for shared jobs"), because every pipeline reading the job already gets a disjoint part of
//!   it from the service;
//! - through an anonymous job (every pipeline its own job, each a whole epoch), like any other
//!   dataset whose source cannot be sharded by file: tf's rewrite finds no file reader above the
//!   data-service source, so `File` is an error and `Auto` falls back to `Data`, which keeps
//!   every `num_input_pipelines`-th element of this pipeline's own stream (`shard` appended to
//!   the local ops). The service's order is not deterministic with several workers, so the
//!   pipelines' parts may then overlap: use a named job (or `Off`) with several pipelines.
//!
//! Difference from tf kept on purpose: under `Data`, tf moves the shard behind its rebatching,
//! so a worker gets a strided part of every global batch; here the shard is the one
//! `auto_shard` places in the definition, so a pipeline gets every W-th global batch (and cuts
//! each into W steps). Either way each element reaches exactly one pipeline.

use super::distribute_config::DistributeConfig;
use super::distributed_iterator::{DistributedIterator, Feed, Steps};
use super::input_context::InputContext;
use super::rebatch::{compute_batch_size, per_replica_spec, Rebatch};
use crate::error::ClientError;
use crate::reader_state::ReaderState;
use crate::service_dataset::ServiceDataset;
use sluice_element::{pb, ElementSpec, PythonRunner};
use sluice_executor::ExecOptions;
use sluice_formats::{expand_files, FileAccess};
use sluice_pipeline::{auto_shard, AutoShardPolicy, Dataset, FunctionRegistry, Transform};
use std::sync::Arc;
use tracing::debug;

/// What a distributed dataset reads: a local pipeline or the service.
// A local definition is a few hundred bytes inline (its source's tensor protos), built and moved
// once per `distribute`: not worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum DistributedInput {
    Local(Dataset),
    /// Boxed: a service dataset is several times larger than a local definition.
    Service(Box<ServiceDataset>),
}

impl From<Dataset> for DistributedInput {
    fn from(d: Dataset) -> Self {
        DistributedInput::Local(d)
    }
}

impl From<ServiceDataset> for DistributedInput {
    fn from(d: ServiceDataset) -> Self {
        DistributedInput::Service(Box::new(d))
    }
}

/// A dataset whose steps give each local replica its batch. Each [`DistributedDataset::iter`]
/// is a new epoch.
#[derive(Debug, Clone)]
pub struct DistributedDataset {
    /// The input after auto-sharding for this pipeline.
    input: DistributedInput,
    config: DistributeConfig,
    steps: Steps,
    element_spec: ElementSpec,
    /// Runs a local input's Python ops (a service input carries its own runner).
    python: Option<Arc<dyn PythonRunner>>,
}

impl DistributedDataset {
    /// tf's `strategy.experimental_distribute_dataset(dataset)`: `input` is batched by the
    /// global batch size; each step gives each of this pipeline's replicas about
    /// `global / num_replicas_in_sync` rows. Fails if the elements cannot be split (scalar
    /// components: batch the dataset first) or auto-sharding fails.
    pub fn new(
        input: impl Into<DistributedInput>,
        config: DistributeConfig,
    ) -> Result<DistributedDataset, ClientError> {
        config.validate()?;
        let input = shard_for_pipeline(input.into(), &config)?;
        let registry = FunctionRegistry::global();
        let (spec, global) = match &input {
            DistributedInput::Local(d) => {
                let spec = sluice_pipeline::element_spec(d.def(), &registry)?;
                let global = compute_batch_size(&spec, d.def().ops.iter());
                (spec, global)
            }
            DistributedInput::Service(s) => {
                let spec = s.element_spec()?;
                let ops = s.definition().ops.iter().chain(s.local_ops());
                let global = compute_batch_size(&spec, ops);
                (spec, global)
            }
        };
        let element_spec = per_replica_spec(&spec, config.num_replicas_in_sync)?;
        let rebatch = Rebatch::plan(
            global,
            config.num_input_pipelines,
            config.num_local_replicas(),
            config.input_pipeline_id,
        );
        debug!(?global, ?rebatch, "distributed dataset");
        Ok(DistributedDataset {
            input,
            config,
            steps: Steps::Rebatch(rebatch),
            element_spec,
            python: None,
        })
    }

    /// The same dataset, whose local input runs its Python ops with `runner`.
    pub fn with_python_runner(self, runner: Arc<dyn PythonRunner>) -> DistributedDataset {
        DistributedDataset {
            python: Some(runner),
            ..self
        }
    }

    /// The spec of one replica's value in a step.
    pub fn element_spec(&self) -> &ElementSpec {
        &self.element_spec
    }

    pub fn config(&self) -> &DistributeConfig {
        &self.config
    }

    /// The input as this pipeline reads it (after auto-sharding).
    pub fn input(&self) -> &DistributedInput {
        &self.input
    }

    /// Makes the next epoch resume from `state` (see [`ServiceDataset::load_state`]); only an
    /// input read through the service has states.
    pub fn load_state(&self, state: ReaderState) -> Result<(), ClientError> {
        match &self.input {
            DistributedInput::Service(s) => s.load_state(state),
            DistributedInput::Local(_) => Err(ClientError::FailedPrecondition(
                "a distributed dataset over a local pipeline takes no state: read it through \
                 the service (`distribute` with a `job_name`) to take states"
                    .into(),
            )),
        }
    }

    /// Starts a new epoch: a new run of the local pipeline, or the next repetition of the
    /// service's job.
    pub async fn iter(&self) -> Result<DistributedIterator, ClientError> {
        let feed = match &self.input {
            DistributedInput::Local(d) => {
                let options = ExecOptions {
                    python: self.python.clone(),
                    ..ExecOptions::default()
                };
                Feed::local(sluice_executor::iterate(d.def(), &options)?)?
            }
            DistributedInput::Service(s) => Feed::Service(Box::new(s.iter().await?)),
        };
        Ok(DistributedIterator::new(
            feed,
            self.steps.clone(),
            self.config.num_local_replicas(),
        ))
    }
}

/// tf's `strategy.distribute_datasets_from_function(dataset_fn)`: calls `f` with this
/// pipeline's [`InputContext`]; the dataset it returns is batched per replica (size it with
/// `get_per_replica_batch_size`) and sharded by `f` as it sees fit. Its elements go to the
/// local replicas in turn, one per replica per step. `config.auto_shard_policy` is not used:
/// tf does not auto-shard here either.
pub async fn distribute_datasets_from_function<F, D>(
    config: &DistributeConfig,
    f: F,
) -> Result<DistributedDataset, ClientError>
where
    F: AsyncFnOnce(&InputContext) -> Result<D, ClientError>,
    D: Into<DistributedInput>,
{
    config.validate()?;
    let context = config.input_context();
    let input: DistributedInput = f(&context).await?.into();
    let element_spec = match &input {
        DistributedInput::Local(d) => {
            sluice_pipeline::element_spec(d.def(), &FunctionRegistry::global())?
        }
        DistributedInput::Service(s) => s.element_spec()?,
    };
    Ok(DistributedDataset {
        input,
        config: config.clone(),
        steps: Steps::Whole,
        element_spec,
        python: None,
    })
}

/// Auto-shards `input` for pipeline `input_pipeline_id` of `num_input_pipelines` (see the
/// module header for service reads).
fn shard_for_pipeline(
    input: DistributedInput,
    config: &DistributeConfig,
) -> Result<DistributedInput, ClientError> {
    let (n, index) = (
        config.num_input_pipelines as u64,
        config.input_pipeline_id as u64,
    );
    // tf skips the rewrite for a single worker.
    if n == 1 || config.auto_shard_policy == AutoShardPolicy::Off {
        return Ok(input);
    }
    match input {
        DistributedInput::Local(d) => {
            // FILE sharding (AUTO's first choice) picks from the file list, and the rewrite is
            // pure: a pattern is expanded here first.
            let mut def = d.into_def();
            if matches!(
                config.auto_shard_policy,
                AutoShardPolicy::File | AutoShardPolicy::Auto
            ) {
                expand_files(&mut def, &FileAccess::Unrestricted)?;
            }
            Ok(DistributedInput::Local(Dataset::from_def(auto_shard(
                &def,
                config.auto_shard_policy,
                n,
                index,
            )?)))
        }
        DistributedInput::Service(s) if s.job_name().is_some() => {
            debug!(
                job = s.job_name(),
                "named job: auto-sharding is off, the job splits the data"
            );
            Ok(DistributedInput::Service(s))
        }
        DistributedInput::Service(s) => {
            let policy = match config.auto_shard_policy {
                AutoShardPolicy::File => {
                    return Err(ClientError::NotFound(format!(
                        "Did not find a shardable source, walked to a node which is not a \
                         dataset: the tf.data service (dataset id {}, anonymous job). Consider \
                         either turning off auto-sharding or switching the auto_shard_policy to \
                         DATA to shard this dataset.",
                        s.dataset_id()
                    )));
                }
                AutoShardPolicy::Auto | AutoShardPolicy::Data => AutoShardPolicy::Data,
                p @ (AutoShardPolicy::Hint | AutoShardPolicy::Off) => p,
            };
            // The client-side pipeline: the service is its source, the local ops its ops.
            let local = pb::DatasetDef {
                source: None,
                ops: s.local_ops().to_vec(),
                options: None,
            };
            let sharded = auto_shard(&local, policy, n, index)?;
            let mut service = s.without_local_ops();
            for op in sharded.ops {
                service = service.push_op(op);
            }
            Ok(DistributedInput::Service(Box::new(service)))
        }
    }
}
