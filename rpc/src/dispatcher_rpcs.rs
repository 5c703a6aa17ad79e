//! The argument and result types of `DispatcherClient`'s typed RPC methods (`JobRequest`,
//! `ClientHeartbeat`, ...), and how long a lease asked for ahead may wait for company
//! ([`lease_slack`]). The ids and lease types are `sluice_types`'.

use sluice_proto::dispatcher as pb;
use sluice_security::Admission;
use sluice_types::{
    ClientId, DatasetId, Delivery, IndexRuns, IterationId, ShardingPolicy, TargetWorkers, TaskId,
    WorkerId,
};
use std::time::Duration;

/// The job a client asks for (tf.data's `GetOrCreateJob`): a named job requested again must ask
/// for the same parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRequest {
    pub dataset_id: DatasetId,
    pub sharding: ShardingPolicy,
    /// Consumers with the same name share the job; `None` makes a fresh anonymous job.
    pub job_name: Option<String>,
    /// Coordinated reads: how many consumers read in lockstep rounds.
    pub num_consumers: Option<u32>,
    pub use_cross_trainer_cache: bool,
    pub target_workers: TargetWorkers,
    /// Exactly once (where it applies) or at most once.
    pub delivery: Delivery,
}

/// The iteration a client was attached to, its id as a client of it, and its admission: what
/// it presents to workers with every read of the iteration's tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IterationClient {
    pub iteration_id: IterationId,
    pub client_id: ClientId,
    pub admission: Admission,
}

/// A client's heartbeat; `current_round` and `blocked_round` only for coordinated reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientHeartbeat {
    pub client_id: ClientId,
    /// The task list the client holds: the dispatcher answers at once when it has another,
    /// and leaves the list out of a reply while it is the same.
    pub known_tasks: KnownTasks,
    pub current_round: Option<u64>,
    pub blocked_round: Option<u64>,
}

/// A client's task list as its heartbeat describes it: its length and last task. The
/// dispatcher only appends tasks (with fresh ids) or removes them, so the two tell any change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KnownTasks {
    pub count: u32,
    pub last: Option<u64>,
}

impl KnownTasks {
    /// The list a heartbeat reply gave, in its order.
    pub fn of(tasks: &[pb::TaskInfo]) -> Self {
        KnownTasks {
            count: tasks.len() as u32,
            last: tasks.last().map(|t| t.task_id),
        }
    }
}

/// A client heartbeat's reply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientHeartbeatReply {
    /// The iteration's tasks, in the dispatcher's order; `None` when the caller's list is still
    /// current.
    pub tasks: Option<Vec<pb::TaskInfo>>,
    pub iteration_finished: bool,
    /// Coordinated reads: a pending task joins at this round.
    pub block_round: Option<u64>,
    /// Exactly-once jobs: tasks to stop reading for good and report as released.
    pub release_tasks: Vec<TaskId>,
}

/// What a client received from one exactly-once task since its last report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskDelivery {
    pub task_id: TaskId,
    pub runs: IndexRuns,
    /// The client stopped reading the task for good.
    pub released: bool,
}

/// A worker's heartbeat: the tasks it holds; the first one registers it. A crashed run's report
/// travels beside it (`DispatcherClient::worker_heartbeat_reporting`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerHeartbeat {
    pub worker: WorkerId,
    pub current_tasks: Vec<TaskId>,
    pub tags: Vec<String>,
    /// This worker process's id (random per start; 0: not told).
    pub incarnation: u64,
}

/// The longest a lease asked for ahead of need waits for company (see [`lease_slack`]).
pub const MAX_LEASE_SLACK: Duration = Duration::from_secs(1);

/// The slack of a lease asked for as the one before it is installed, when that one's
/// predecessor lasted `lasted`: half that time, at most [`MAX_LEASE_SLACK`]. The lease just
/// installed is at least as large as its predecessor, so the one asked for ahead arrives
/// before it is needed unless the task speeds up to twice its pace.
pub fn lease_slack(lasted: Duration) -> Duration {
    (lasted / 2).min(MAX_LEASE_SLACK)
}
