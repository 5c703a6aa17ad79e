//! The commands of the replicated log and their outcomes.
//!
//! A log entry carries a [`Proposal`]: the requests the leader's proposer batched into one entry
//! (group commit). Each [`Request`] is one [`Update`] plus, for requests that may be retried, the
//! requester's [`RequestId`]. Everything an update needs that is not derivable from the state
//! (random name suffixes, expanded file lists, split counts) is chosen by the leader before
//! proposing and travels inside the update, and the entry carries the leader's time, so
//! `apply` stays pure.

use crate::state::entities::DefinitionKey;
use crate::state::lineage::DeliveryReport;
use serde::{Deserialize, Serialize};
use sluice_element::Compression;
use sluice_security::FetchKey;
use sluice_types::{
    ClientId, DatasetId, Delivery, IterationId, JobId, LeaseRequest, ShardingPolicy, SplitLease,
    TargetWorkers, TaskId,
};

/// The parameters that make a job's identity besides its dataset and processing mode: a named
/// job requested again must ask for the same ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOptions {
    /// Coordinated reads: consumers reading in lockstep rounds.
    pub num_consumers: Option<u32>,
    pub use_cross_trainer_cache: bool,
    pub target_workers: TargetWorkers,
}

/// What the dispatcher knows about a dataset besides its definition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetMetadata {
    /// The prost encoding of the `ElementSpec`, opaque to the state.
    #[serde(with = "serde_bytes")]
    pub element_spec: Vec<u8>,
    /// -1 infinite, -2 unknown, otherwise the number of elements.
    pub cardinality: i64,
    pub compression: Compression,
}

impl DatasetMetadata {
    /// tf.data's (and `sluice_pipeline::INFINITE`'s) cardinality of an infinite dataset.
    pub const INFINITE: i64 = -1;

    pub fn is_infinite(&self) -> bool {
        self.cardinality == Self::INFINITE
    }
}

/// Identifies a retryable request: a retry with the same pair returns the recorded outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId {
    pub requester: u64,
    pub seq: u64,
    /// The requester's lowest sequence number still awaiting an answer: every request below it
    /// was answered, will never be retried, and its recorded outcome may be forgotten.
    pub watermark: u64,
}

/// One request inside a log entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: Option<RequestId>,
    pub update: Update,
}

/// The payload of one normal log entry: every request the proposer gathered for it, and the
/// proposing leader's wall clock, stamped once for the whole entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// Microseconds since the Unix epoch on the leader when it proposed the entry.
    pub time_micros: u64,
    pub requests: Vec<Request>,
}

/// The responses to a [`Proposal`], in the same order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcomes(pub Vec<Outcome>);

/// A change to the replicated dispatcher state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Update {
    /// Registers a dataset; `dataset_id` is the user's explicit id, if any. `def` is the prost
    /// encoding of the `DatasetDef` with its file lists already expanded.
    RegisterDataset {
        dataset_id: Option<DatasetId>,
        // As one byte string, not a sequence of bytes: encoded and decoded at memory speed (a
        // large definition must reach the followers within one heartbeat).
        #[serde(with = "serde_bytes")]
        def: Vec<u8>,
        metadata: DatasetMetadata,
        /// Number of splits of each split provider (for distributed_epoch iterations).
        num_splits: Vec<u64>,
    },
    /// First contact of a worker (or of a restarted one under the same address): registers it
    /// and creates one task for every unfinished iteration. `worker_addresses` is the proposing
    /// leader's configured static-sharding list, carried so that every replica resolves the
    /// same worker index (see `WorkerIndexResolver`).
    RegisterWorker {
        address: String,
        tags: Vec<String>,
        worker_addresses: Vec<String>,
        /// The name the registering caller authenticated as ("" without authentication): only
        /// the same name may register this address again while it is registered.
        owner: String,
    },
    /// Returns the job named `job_name`, or creates it. Without a name a fresh anonymous job is
    /// created, named with the leader-chosen `anonymous_suffix`.
    GetOrCreateJob {
        dataset_id: DatasetId,
        sharding: ShardingPolicy,
        job_name: Option<String>,
        anonymous_suffix: u64,
        options: JobOptions,
    },
    /// Returns the iteration `(job, repetition)`, creating it (one task per registered worker)
    /// if absent, and attaches a new iteration client to it.
    GetOrCreateIteration { job_id: JobId, repetition: u64 },
    /// Leases up to `max_splits` consecutive splits of one provider of a distributed_epoch
    /// iteration to `task_id`: the worker's request as it sent it. Encoded as the struct variant
    /// it replaced (`iteration_id`, `provider`, `repetition`, `max`, `task_id`), byte for byte.
    LeaseSplits(LeaseRequest),
    /// Detaches a client from its iteration; the entry's time is recorded as the moment the
    /// iteration lost the client (for garbage collection).
    ReleaseIterationClient { client_id: ClientId },
    /// A worker finished these tasks (its pipeline reached the end and a consumer saw it).
    FinishTasks {
        worker: String,
        task_ids: Vec<TaskId>,
    },
    /// The leader heard nothing from the worker for the worker timeout. Its unfinished tasks are
    /// dropped so finite iterations can end; if it comes back it registers again.
    RemoveWorker { address: String },
    /// The leader saw no client of the iteration for the job GC timeout.
    GarbageCollectIteration { iteration_id: IterationId },
    /// A coordinated reader's heartbeat while its iteration has a pending task: the reader's
    /// round, and the round it holds before (if any), decide whether the pending task's target
    /// round is accepted by this consumer or moved later.
    ClientRounds {
        client_id: ClientId,
        current_round: u64,
        blocked_round: Option<u64>,
    },
    /// Every consumer of a coordinated iteration gave up on this task in the same round: it is
    /// taken out of the rounds. Its worker gets a new pending task if it comes back.
    RemoveTask { task_id: TaskId },
    /// The leader found these entities idle: each one that is still idle, judged against the
    /// cutoffs (leader wall-clock microseconds), is removed. Iterations: ended, without
    /// clients, the last one gone before `iterations_before`. Jobs: without iterations, last
    /// asked for before `iterations_before`. Datasets: no job reads them, last used before
    /// `datasets_before`.
    RemoveIdle {
        iterations_before: u64,
        datasets_before: u64,
        iterations: Vec<IterationId>,
        jobs: Vec<JobId>,
        datasets: Vec<DatasetId>,
    },
    /// One part of a large definition, staged in the state before the `RegisterStagedDataset`
    /// that uses it: `bytes` go at `offset` of the definition stored under `key` (its SHA-256,
    /// computed by the leader over the whole definition). Parts keep every log entry small
    /// enough to reach the followers within one heartbeat, whatever the definition's size.
    StageDefinition {
        key: DefinitionKey,
        offset: u64,
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    /// `RegisterDataset` of a definition staged by `StageDefinition` parts: all `len` bytes of
    /// the definition under `key` must be staged.
    RegisterStagedDataset {
        dataset_id: Option<DatasetId>,
        key: DefinitionKey,
        len: u64,
        metadata: DatasetMetadata,
        num_splits: Vec<u64>,
    },
    /// A worker's previous run died of `signal` (its name, e.g. `SIGABRT`) while running these
    /// tasks at address `worker`: each task's iteration, unless it finished, is failed and its
    /// tasks are dropped, so no other worker runs it again. Tasks not of `worker` are ignored.
    FailCrashedTasks {
        worker: String,
        task_ids: Vec<TaskId>,
        signal: String,
    },
    /// `GetOrCreateJob` that says how the job delivers: a new job records it (exactly once
    /// only where it applies, see `set_job_delivery`); a named job requested again must ask
    /// for the same. (`GetOrCreateJob` entries of earlier builds create at-most-once jobs.)
    GetOrCreateJobWithDelivery {
        dataset_id: DatasetId,
        sharding: ShardingPolicy,
        job_name: Option<String>,
        anonymous_suffix: u64,
        options: JobOptions,
        delivery: Delivery,
    },
    /// What a client received from the tasks of exactly-once lineages since its last report,
    /// and the moving tasks it let go of.
    ReportDelivered {
        client_id: ClientId,
        reports: Vec<DeliveryReport>,
    },
    /// A worker's heartbeat named the process it runs in; another one than recorded restarted
    /// at the address, and the lineages of its tasks move.
    WorkerIncarnation { address: String, incarnation: u64 },
    /// The cluster's fetch key, chosen at random by a leader whose state had none. Only the
    /// first one counts: once a key is set, a later `SetFetchKey` (another leader's, proposed
    /// before it saw the first applied) changes nothing, so admissions stay valid.
    SetFetchKey { key: FetchKey },
    /// A reader's state: what it took since its previous one (`base_step`, or since it
    /// joined), added to its iteration's checkpoint at `step`.
    SaveCheckpoint {
        client_id: ClientId,
        reader: String,
        step: u64,
        base_step: Option<u64>,
        taken: Vec<(TaskId, Vec<(u64, u64)>)>,
    },
    /// A reader restored from its state at `step`: a new client of the iteration restored
    /// from that checkpoint (created, or joined; see `state::checkpoint`).
    ResumeIteration {
        job_id: JobId,
        repetition: u64,
        step: u64,
        reader: String,
    },
}

impl Update {
    /// Short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Update::RegisterDataset { .. } => "register_dataset",
            Update::RegisterWorker { .. } => "register_worker",
            Update::GetOrCreateJob { .. } => "get_or_create_job",
            Update::GetOrCreateIteration { .. } => "get_or_create_iteration",
            Update::LeaseSplits { .. } => "lease_splits",
            Update::ReleaseIterationClient { .. } => "release_iteration_client",
            Update::FinishTasks { .. } => "finish_tasks",
            Update::RemoveWorker { .. } => "remove_worker",
            Update::GarbageCollectIteration { .. } => "garbage_collect_iteration",
            Update::ClientRounds { .. } => "client_rounds",
            Update::RemoveTask { .. } => "remove_task",
            Update::RemoveIdle { .. } => "remove_idle",
            Update::StageDefinition { .. } => "stage_definition",
            Update::RegisterStagedDataset { .. } => "register_staged_dataset",
            Update::FailCrashedTasks { .. } => "fail_crashed_tasks",
            Update::GetOrCreateJobWithDelivery { .. } => "get_or_create_job",
            Update::ReportDelivered { .. } => "report_delivered",
            Update::WorkerIncarnation { .. } => "worker_incarnation",
            Update::SetFetchKey { .. } => "set_fetch_key",
            Update::SaveCheckpoint { .. } => "save_checkpoint",
            Update::ResumeIteration { .. } => "resume_iteration",
        }
    }
}

/// The result of applying one request. Rejections are replicated results too: every replica
/// rejects the same request the same way.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    DatasetRegistered {
        dataset_id: DatasetId,
    },
    WorkerRegistered {
        tasks: Vec<TaskId>,
    },
    Job {
        job_id: JobId,
    },
    Iteration {
        iteration_id: IterationId,
        client_id: ClientId,
    },
    Splits(SplitLease),
    ClientReleased,
    TasksFinished,
    WorkerRemoved,
    IterationCollected,
    /// The pending task's target round after a `ClientRounds` update (`None`: none pending).
    Rounds {
        block_round: Option<u64>,
    },
    TaskRemoved,
    /// How many of the listed entities a `RemoveIdle` removed.
    IdleRemoved {
        iterations: u64,
        jobs: u64,
        datasets: u64,
    },
    Rejected(Rejection),
    /// A `StageDefinition` part is in place: `staged` bytes of the definition are stored.
    DefinitionStaged {
        staged: u64,
    },
    /// The iterations a `FailCrashedTasks` failed (those already failed or finished are not
    /// listed).
    IterationsFailed {
        iterations: Vec<IterationId>,
    },
    /// A `ReportDelivered` was recorded.
    DeliveryRecorded,
    /// A `WorkerIncarnation` was recorded: the tasks whose lineages moved because the worker
    /// restarted (empty when it did not).
    WorkerRestarted {
        moved: Vec<TaskId>,
    },
    /// After a `SetFetchKey`: whether it set the key (`false`: one was set already).
    FetchKeySet {
        set: bool,
    },
    /// A `SaveCheckpoint` was recorded: the job's name and repetition it names, and the
    /// definition the job reads.
    CheckpointSaved {
        job_name: String,
        repetition: u64,
        definition: [u8; 32],
    },
}

/// Why a request changed nothing. Messages follow tf.data service's texts where it has one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    PermissionDenied(String),
    /// A limit the request will still cross if sent again later (its own size, or a store
    /// that is full): `ResourceExhausted`, with gRPC's retry pushback telling clients not to
    /// retry it.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A limit that frees up as other requests finish: `ResourceExhausted`, which clients
    /// retry with backoff.
    #[error("{0}")]
    Busy(String),
}
