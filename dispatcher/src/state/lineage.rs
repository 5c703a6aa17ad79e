//! The replicated record of exactly-once delivery: per job, whether it delivers exactly once;
//! per task stream (a *lineage*), the splits it was leased and the elements its readers
//! received, so that another worker can take the stream over where its readers stand.
//!
//! A lineage is one stream of elements, numbered from 0, produced by one task and, after its
//! worker failed, by the tasks that took it over. Its content is a function of the dataset's
//! definition and the splits leased to it, in order (static sharding: of the shard it reads), so
//! a worker that takes it over runs the pipeline again from the start on the same splits and
//! skips the elements the readers received; its output from there on is what the failed worker
//! would have produced. (This needs a pipeline whose output is determined by its input splits;
//! see docs/guide.md.)
//!
//! A lineage moves when its worker is removed or restarts: its task is dropped and the lineage
//! waits until every client of the iteration has let go of the dropped task, reporting what it
//! received from it; only then is a new task created for it on a live worker, so no reader can
//! still be taking elements from the old one while the new one produces them again.

use serde::{Deserialize, Serialize};
use sluice_types::{ClientId, IndexRuns, IterationId, JobId, TaskId};
use std::collections::{BTreeMap, BTreeSet};

/// Runs of received indices one report may carry per task, at most.
pub const MAX_REPORT_RUNS: usize = 4096;
/// Tasks one report may name, at most.
pub const MAX_REPORT_TASKS: usize = 1024;
/// Runs a lineage's received set may hold: readers receive long runs, so only a reader that
/// reports garbage gets near it.
pub const MAX_LINEAGE_RUNS: usize = 1 << 16;

/// A lineage's key: its iteration and the first task that ran it.
pub type LineageKey = (IterationId, TaskId);

/// Splits `[start, end)` of `repetition`, leased to a lineage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedLease {
    pub repetition: u64,
    pub start: u64,
    pub end: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lineage {
    /// The task producing it, or (while it moves) the dropped task it moves from.
    pub task: TaskId,
    /// `task` produces it; `false` while it moves.
    pub running: bool,
    /// While it moves: the clients of the iteration that have not yet let go of `task`.
    pub waiting: BTreeSet<ClientId>,
    /// Every lease granted to its tasks, in the order granted (the order their pipelines
    /// consumed them).
    pub leases: Vec<RecordedLease>,
    /// Indices of the elements its readers received.
    pub delivered: IndexRuns,
    /// The worker whose task started it: for static sharding, whose shard it reads.
    pub origin_worker: String,
    /// Times it moved.
    pub moves: u64,
}

impl Lineage {
    pub fn new(task: TaskId, worker: &str) -> Lineage {
        Lineage {
            task,
            running: true,
            waiting: BTreeSet::new(),
            leases: Vec::new(),
            delivered: IndexRuns::new(),
            origin_worker: worker.to_string(),
            moves: 0,
        }
    }

    /// It moves and every client has let go of its old task: it needs a worker.
    pub fn ready_to_move(&self) -> bool {
        !self.running && self.waiting.is_empty()
    }
}

/// What one client received from one task, as it reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryReport {
    pub task_id: TaskId,
    /// Runs `[start, end)` of the lineage's element indices received since the last report.
    pub runs: Vec<(u64, u64)>,
    /// The client has stopped reading the task for good (it was asked to let go of it): no
    /// element of it will reach the client after what this report lists.
    pub released: bool,
}

/// The exactly-once part of the state, one trailing field of `DispatcherState`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExactlyOnce {
    /// Jobs that deliver exactly once (jobs of builds before it are read as at most once).
    pub jobs: BTreeSet<JobId>,
    pub lineages: BTreeMap<LineageKey, Lineage>,
    /// Every task of a lineage (current or earlier), to its lineage.
    pub tasks: BTreeMap<TaskId, LineageKey>,
    /// The process (incarnation) of each registered worker as it last reported it: another one
    /// under the same address is a restarted worker, whose lineages move.
    pub incarnations: BTreeMap<String, u64>,
}
