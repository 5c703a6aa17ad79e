//! The replicated record of readers' states: where an exactly-once epoch stood when its readers
//! took their states, so that a restored reader resumes it there.
//!
//! A reader's state (what `state_dict()` returns) is small: the job's name, the repetition, the
//! *step* (how many elements the reader had taken from the epoch) and the reader's name. What it
//! stands for is kept here, as a *checkpoint* under `(job name, repetition, step)`:
//!
//! - every lineage of the iteration, with the leases its tasks were granted so far (the splits it
//!   consumes, in order) and the indices its readers had *taken* (handed to the caller) when
//!   they took their states: the union over every reader that took one at this step;
//! - the iteration's split cursors, from the same moment as the leases.
//!
//! Each reader adds what it took since its previous state (its *base*), so a state costs the
//! log what the reader took since the last one, and a checkpoint's taken sets are nearly
//! prefixes (the union of the readers' takes), a few runs per lineage.
//!
//! Restoring from a checkpoint creates a new iteration under the same key, which supersedes the
//! one there: the checkpoint's lineages wait for workers (their tasks replay the recorded leases
//! and skip what was taken), the cursors continue from where they were, so splits leased after
//! the checkpoint are leased again, and every worker gets a fresh task as in a new iteration.
//! Several readers restoring from the same step join one restored iteration; a reader whose
//! name already joined it restores again (it was killed again) and supersedes it in turn.
//!
//! Checkpoints outlive their iterations and jobs (a job garbage-collected and created again
//! under its name restores from them), and the last [`CHECKPOINTS_KEPT`] of each job name are
//! kept, [`MAX_CHECKPOINTS`] in all.

use crate::state::entities::DefinitionKey;
use crate::state::lineage::{LineageKey, RecordedLease};
use crate::state::split_cursor::SplitCursor;
use serde::{Deserialize, Serialize};
use sluice_types::{IndexRuns, IterationId};
use std::collections::{BTreeMap, BTreeSet};

/// Checkpoints kept per job name: older ones are dropped as new ones are taken.
pub const CHECKPOINTS_KEPT: usize = 16;
/// Checkpoints kept in all: past it the oldest of any job goes, so job names that come and go
/// (a name per run) cannot grow the state without bound.
pub const MAX_CHECKPOINTS: usize = 1024;
/// Longest reader name.
pub const MAX_READER_NAME: usize = 256;
/// Runs one state may report as taken since the reader's previous state, over all its tasks.
pub const MAX_TAKEN_RUNS: usize = 1 << 16;

/// A checkpoint's key: the job's name, the repetition and the step.
pub type CheckpointKey = (String, u64, u64);

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SavedLineage {
    /// Its leases when the checkpoint was last added to, in the order granted.
    #[serde(with = "crate::state::lineage::recorded_leases")]
    pub leases: Vec<RecordedLease>,
    /// The indices its readers had taken.
    pub taken: IndexRuns,
    /// The worker whose task started it (static sharding: whose shard it reads).
    pub origin_worker: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The dataset definition the job reads: a restore must read the same one.
    pub definition: DefinitionKey,
    /// The iteration it was taken in.
    pub iteration: IterationId,
    /// Order of creation, for keeping the last [`CHECKPOINTS_KEPT`].
    pub sequence: u64,
    pub cursors: Vec<SplitCursor>,
    pub lineages: BTreeMap<LineageKey, SavedLineage>,
    /// The readers whose states point here.
    pub readers: BTreeSet<String>,
}

/// A restored iteration: the step it resumed at and the readers that restored into it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Restore {
    pub step: u64,
    pub readers: BTreeSet<String>,
}

/// The checkpoint part of the state, one trailing field of `DispatcherState`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpoints {
    pub records: BTreeMap<CheckpointKey, Checkpoint>,
    pub restores: BTreeMap<IterationId, Restore>,
    /// What a restored lineage's readers had taken before the restore: part of every
    /// checkpoint taken after it.
    pub bases: BTreeMap<LineageKey, IndexRuns>,
    pub next_sequence: u64,
}
