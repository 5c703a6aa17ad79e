//! The objects of the replicated state, as `DispatcherState` stores them.
//!
//! Relations are by id (a task names its iteration, an iteration its job) so the state is a
//! plain tree of maps that serializes deterministically for snapshots.

use crate::state::split_cursor::SplitCursor;
use crate::state::update::{DatasetMetadata, JobOptions};
use serde::{Deserialize, Serialize};
use sluice_types::{ClientId, DatasetId, IterationId, JobId, ShardingPolicy, TaskId};
use std::collections::{BTreeSet, VecDeque};

/// The SHA-256 of a dataset definition's encoding: the key it is stored under.
pub type DefinitionKey = [u8; 32];

/// A dataset definition, stored once per content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Definition {
    /// The prost encoding of the `DatasetDef` (file lists expanded), as one byte string.
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
    /// Datasets using it; at 0 it is removed.
    pub datasets: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    pub id: DatasetId,
    /// The key of its definition in the state's definitions.
    pub definition: DefinitionKey,
    pub metadata: DatasetMetadata,
    /// Splits per split provider, for distributed_epoch iterations.
    pub num_splits: Vec<u64>,
    /// Jobs reading it.
    pub jobs: u64,
    /// Leader time when it was last registered, or a job reading it was last asked for.
    pub last_used_micros: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Worker {
    /// The address clients fetch from; a worker's identity (a restart under the same address is
    /// the same worker).
    pub address: String,
    pub tags: Vec<String>,
    /// The name the worker authenticated as when it registered ("" without authentication).
    /// Its tasks may be acted on by callers of that name only.
    pub owner: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    /// Never empty: anonymous jobs get a generated name.
    pub name: String,
    pub dataset_id: DatasetId,
    pub sharding: ShardingPolicy,
    pub options: JobOptions,
    /// Its iterations in the state.
    pub iterations: u64,
    /// Leader time of the last `GetOrCreateJob` that returned it.
    pub last_used_micros: u64,
}

/// A task waiting to join a coordinated iteration at `target_round` (tf.data's pending task):
/// it joins once every consumer agreed to hold before that round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingTask {
    pub task_id: TaskId,
    pub target_round: u64,
    /// Clients that are blocked before `target_round`.
    pub ready_clients: BTreeSet<ClientId>,
    /// Times the target round was rejected (a consumer had already started it).
    pub failures: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Iteration {
    pub id: IterationId,
    pub job_id: JobId,
    pub repetition: u64,
    /// Tasks in creation order; finished tasks stay.
    pub tasks: Vec<TaskId>,
    /// One cursor per split provider; empty unless the job is distributed_epoch.
    pub cursors: Vec<SplitCursor>,
    pub num_clients: u64,
    /// Leader wall clock when the last client left; `None` while none ever left.
    pub last_client_released_micros: Option<u64>,
    /// All tasks finished and at least one of them reached its end (set once; never reset).
    pub finished: bool,
    /// Collected after `job_gc_timeout` without clients; its key is free for a new iteration.
    pub garbage_collected: bool,
    /// Coordinated reads: tasks waiting to join, first in first out.
    pub pending_tasks: VecDeque<PendingTask>,
    /// Coordinated reads: the highest round a consumer reported.
    pub round_estimate: u64,
    /// Why the iteration was failed (one of its tasks crashed its worker); `None` while it was
    /// not. A failed iteration gets no new tasks and its readers get this error.
    pub failure: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: TaskId,
    pub iteration_id: IterationId,
    pub worker: String,
    /// Coordinated reads: the first round that includes this task.
    pub starting_round: u64,
    pub finished: bool,
    /// Finished because its worker was removed (or its iteration collected), not because its
    /// input ended.
    pub dropped: bool,
}
