//! Conversions between protobuf messages and the dispatcher's domain types, in one place.

use crate::error::DispatcherError;
use crate::state::{
    Dataset, DatasetMetadata, DeliveryReport, DispatcherState, Job, RequestId, Task,
};
use prost::Message;
use sluice_element::Compression;
use sluice_proto::dataset as dpb;
use sluice_proto::dispatcher as pb;
use sluice_rpc::ToProto;

/// The shared enums' decoding (`ShardingPolicy`, `TargetWorkers`, read by `sluice_rpc`'s
/// `FromProto`) names the field and the value.
impl From<sluice_types::InvalidValue> for DispatcherError {
    fn from(e: sluice_types::InvalidValue) -> Self {
        DispatcherError::InvalidArgument(e.0)
    }
}

/// A message's `compression` field (unspecified means `auto`); the rule is `Compression`'s own.
pub fn compression_from_proto(value: i32) -> Result<Compression, DispatcherError> {
    Compression::from_proto(value).map_err(|e| DispatcherError::InvalidArgument(e.to_string()))
}

pub fn request_id(id: Option<pb::RequestId>) -> Option<RequestId> {
    id.map(|id| RequestId {
        requester: id.requester_id,
        seq: id.seq,
        watermark: id.watermark,
    })
}

pub fn metadata_to_proto(metadata: &DatasetMetadata) -> pb::DatasetMetadata {
    pb::DatasetMetadata {
        element_spec: dpb::ElementSpec::decode(metadata.element_spec.as_slice()).ok(),
        cardinality: metadata.cardinality,
        compression: metadata.compression.to_proto() as i32,
    }
}

/// Decodes a dataset's definition stored in the state (it was encoded by this crate at
/// registration, so only a corrupt state would make this `None`).
pub fn decode_def(state: &DispatcherState, dataset: &Dataset) -> Option<dpb::DatasetDef> {
    dpb::DatasetDef::decode(state.dataset_def(dataset)?).ok()
}

/// The definition itself stays out (the worker fetches it by id when the task starts).
/// `worker_index` and `static_workers` place the task's worker in the static-sharding worker
/// list (an empty list: no index, and static policies fail on the worker).
pub fn task_def(state: &DispatcherState, task: &Task, job: &Job, dataset: &Dataset) -> pb::TaskDef {
    // A static shard is its lineage's first worker's, wherever the lineage runs now.
    let shard_worker = state.shard_worker_of(task.id, &task.worker);
    let worker_index = state.worker_index(shard_worker);
    let static_workers = state.static_workers();
    let (exactly_once, replay_leases, replay_providers, skip_runs) = match state.replay_of(task.id)
    {
        Some((leases, delivered)) => (
            true,
            leases
                .iter()
                .flat_map(|l| [l.repetition, l.start, l.end])
                .collect(),
            // Left empty when every lease is provider 0's, as before several providers.
            if leases.iter().any(|l| l.provider != 0) {
                leases.iter().map(|l| l.provider).collect()
            } else {
                Vec::new()
            },
            delivered.iter().flat_map(|(s, e)| [s, e]).collect(),
        ),
        None => (false, Vec::new(), Vec::new(), Vec::new()),
    };
    pb::TaskDef {
        task_id: task.id.0,
        iteration_id: task.iteration_id.0,
        dataset_id: dataset.id.0.clone(),
        sharding_policy: job.sharding.to_proto() as i32,
        compression: dataset.metadata.compression.to_proto() as i32,
        num_split_providers: dataset.num_splits.len() as u32,
        worker_address: task.worker.clone(),
        num_consumers: job.options.num_consumers,
        use_cross_trainer_cache: job.options.use_cross_trainer_cache,
        worker_index,
        num_workers: static_workers.len() as u64,
        exactly_once,
        replay_leases,
        replay_providers,
        skip_runs,
    }
}

/// A client's delivery reports: runs as flattened `start, end` pairs, which must pair up.
pub fn delivery_reports(
    tasks: &[pb::TaskDelivery],
) -> Result<Vec<DeliveryReport>, DispatcherError> {
    tasks
        .iter()
        .map(|t| {
            if !t.runs.len().is_multiple_of(2) {
                return Err(DispatcherError::InvalidArgument(format!(
                    "the delivery report of task {} has {} run bounds, not pairs of start and end",
                    t.task_id,
                    t.runs.len()
                )));
            }
            Ok(DeliveryReport {
                task_id: sluice_types::TaskId(t.task_id),
                runs: t.runs.chunks_exact(2).map(|r| (r[0], r[1])).collect(),
                released: t.released,
            })
        })
        .collect()
}

/// What a client learns of a task: where it runs, its worker's tags, and (coordinated reads)
/// the round it joins at.
pub fn task_info(state: &DispatcherState, task: &Task) -> pb::TaskInfo {
    pb::TaskInfo {
        task_id: task.id.0,
        worker_address: task.worker.clone(),
        iteration_id: task.iteration_id.0,
        starting_round: task.starting_round,
        worker_tags: state
            .worker(&task.worker)
            .map(|w| w.tags.clone())
            .unwrap_or_default(),
        moved: state.task_moved(task.id),
    }
}
