//! `DispatcherState`: every dataset, worker, job, iteration, task, split cursor and recorded
//! request outcome of the dispatcher, and `apply`, the only function that changes them.
//!
//! Invariants (checked by the table tests):
//! - a task is in its iteration's `tasks` list and names a registered worker;
//! - at most one iteration per `(job name, repetition)`;
//! - an iteration is finished iff it has tasks and all of them are finished; a finished
//!   iteration never gets new tasks;
//! - a split index of a provider and repetition is leased at most once;
//! - a request id seen again returns the outcome recorded the first time (`RequestLog`);
//! - a dataset's definition is stored once per content, in `definitions`, with the number of
//!   datasets using it; a definition no dataset uses is gone, but for at most one whose parts
//!   are being staged;
//! - the state is bounded by live work: ended iterations, jobs and datasets nobody uses are
//!   removed by `RemoveIdle` (the leader's timers propose it), with their tasks.
//!
//! This file holds the data and `apply`; the handling of each update lives beside it, one file
//! per entity:
//! - `datasets`, `workers`, `jobs`, `iterations`, `tasks`: registration, get-or-create,
//!   release, finish, removal and garbage collection of each;
//! - `idle`: removal of what nobody uses any more;
//! - `splits`: split leases of distributed_epoch iterations;
//! - `rounds`: pending tasks and task removal of coordinated reads;
//! - `fetch_key`: the cluster's secret for readers' admissions;
//! - `queries`: the read-only accessors the services use.

mod checkpoints;
pub use checkpoints::{hex as definition_hex, Taken};
mod datasets;
mod exactly_once;
mod fetch_key;
pub use datasets::{definition_key, MAX_DEFINITION_BYTES};
mod idle;
#[cfg(test)]
mod invariants;
mod iterations;
mod jobs;
mod queries;
pub use queries::StateSizes;
mod rounds;
pub use rounds::check_rounds;
#[cfg(test)]
pub use rounds::MAX_ROUND;
mod splits;
mod tasks;
mod workers;

use crate::state::changes::Changes;
use crate::state::checkpoint::Checkpoints;
use crate::state::entities::{Dataset, Definition, DefinitionKey, Iteration, Job, Task, Worker};
use crate::state::lineage::ExactlyOnce;
use crate::state::request_log::{Admission, RequestLog};
use crate::state::update::{Outcome, Rejection, Request, Update};
use crate::state::worker_index_resolver::WorkerIndexResolver;
use serde::{Deserialize, Serialize};
use sluice_security::FetchKey;
use sluice_types::{ClientId, DatasetId, IterationId, JobId, TaskId};
use std::collections::{BTreeMap, BTreeSet};

/// The first task id: ids count up from it and are never reused.
const FIRST_TASK_ID: u64 = 4000;

/// What `apply` may know about the entry being applied.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApplyContext {
    /// Index of the log entry.
    pub log_index: u64,
    /// The proposing leader's wall clock when it proposed the entry (microseconds since the
    /// Unix epoch): the only time `apply` knows, the same on every replica.
    pub time_micros: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DispatcherState {
    datasets: BTreeMap<DatasetId, Dataset>,
    /// Dataset definitions by content, each stored once however many datasets share it.
    definitions: BTreeMap<DefinitionKey, Definition>,
    workers: BTreeMap<String, Worker>,
    jobs: BTreeMap<JobId, Job>,
    job_names: BTreeMap<String, JobId>,
    iterations: BTreeMap<IterationId, Iteration>,
    iteration_keys: BTreeMap<(String, u64), IterationId>,
    clients: BTreeMap<ClientId, IterationId>,
    tasks: BTreeMap<TaskId, Task>,
    /// The unfinished tasks of each worker (an index of `tasks`, so a heartbeat does not scan
    /// every task).
    worker_tasks: BTreeMap<String, BTreeSet<TaskId>>,
    /// Static sharding: the configured worker list and the index each worker took in it.
    worker_indices: WorkerIndexResolver,
    /// Recorded outcomes of retryable requests.
    requests: RequestLog,
    next_dataset_id: u64,
    next_job_id: u64,
    next_iteration_id: u64,
    next_client_id: u64,
    next_task_id: u64,
    /// The owner (authenticated name) of each address whose worker was removed: the address
    /// stays that identity's, so another worker's credential cannot register there while it is
    /// down, until the same identity registers again (there or elsewhere). Names only, no
    /// anonymous owner (""). Last of the encoded fields, and read as empty from a snapshot
    /// made before it existed (see `departed_workers_codec`).
    #[serde(default, deserialize_with = "trailing_field::deserialize")]
    departed_workers: BTreeMap<String, String>,
    /// Why each failed iteration was failed (one of its tasks crashed its worker): a failed
    /// iteration gets no new tasks and its readers get this error. Kept beside the iterations
    /// rather than in them so that snapshots of builds before it still decode (read as empty,
    /// as `departed_workers`). Removed with its iteration.
    #[serde(default, deserialize_with = "trailing_field::deserialize")]
    iteration_failures: BTreeMap<IterationId, String>,
    /// Exactly-once delivery: which jobs promise it, their lineages, and the workers' processes
    /// (see `state::lineage`). Trailing, read as empty from snapshots before it.
    #[serde(default, deserialize_with = "trailing_field::deserialize")]
    exactly_once: ExactlyOnce,
    /// The cluster's secret for readers' admissions (see `sluice_security::fetch_admission`):
    /// chosen by a leader that found none and set by the first `SetFetchKey`, never changed
    /// after. Never shown: not on the status page, in metrics or in logs (its `Debug` prints
    /// no byte). `None` in a snapshot made before it existed; the next leader sets one.
    #[serde(default, deserialize_with = "trailing_field::deserialize")]
    fetch_key: Option<FetchKey>,
    /// Readers' states of exactly-once epochs: the checkpoints they point to and the
    /// iterations restored from them (see `state::checkpoint`). Trailing, read as empty from
    /// snapshots before it.
    #[serde(default, deserialize_with = "trailing_field::deserialize")]
    checkpoints: Checkpoints,
    /// What the entries applied since the last take touched (not replicated, never encoded).
    #[serde(skip)]
    changes: Changes,
}

/// A snapshot is `AppliedState { .., state }` encoded alone, so the state's last fields are the
/// last things in it: a snapshot of a build before `departed_workers` (or any trailing field
/// after it) ends where those fields would start. Decoding one there finds no bytes and reads
/// it as empty; anything else in the field decodes as usual (and bytes left over fail
/// the codec's check that all were read).
mod trailing_field {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
        deserializer: D,
    ) -> Result<T, D::Error> {
        Ok(T::deserialize(deserializer).unwrap_or_default())
    }
}

impl Default for DispatcherState {
    fn default() -> Self {
        DispatcherState {
            datasets: BTreeMap::new(),
            definitions: BTreeMap::new(),
            workers: BTreeMap::new(),
            jobs: BTreeMap::new(),
            job_names: BTreeMap::new(),
            iterations: BTreeMap::new(),
            iteration_keys: BTreeMap::new(),
            clients: BTreeMap::new(),
            tasks: BTreeMap::new(),
            worker_tasks: BTreeMap::new(),
            worker_indices: WorkerIndexResolver::default(),
            requests: RequestLog::default(),
            next_dataset_id: 1000,
            next_job_id: 5000,
            next_iteration_id: 2000,
            next_client_id: 3000,
            next_task_id: FIRST_TASK_ID,
            departed_workers: BTreeMap::new(),
            iteration_failures: BTreeMap::new(),
            exactly_once: ExactlyOnce::default(),
            fetch_key: None,
            checkpoints: Checkpoints::default(),
            changes: Changes::default(),
        }
    }
}

impl DispatcherState {
    /// Applies one request: returns the recorded outcome for a repeated request id, otherwise
    /// applies the update and records its outcome.
    pub fn apply(&mut self, ctx: ApplyContext, request: &Request) -> Outcome {
        self.requests.expire(ctx.time_micros);
        if let Some(id) = request.id {
            match self.requests.admit(id, ctx.time_micros) {
                Admission::Recorded(outcome) => return outcome,
                Admission::Refused(rejection) => return Outcome::Rejected(rejection),
                Admission::Apply => {}
            }
        }
        let outcome = match self.apply_update(ctx, &request.update) {
            Ok(outcome) => outcome,
            Err(rejection) => Outcome::Rejected(rejection),
        };
        if let Some(id) = request.id {
            self.requests.record(id, outcome.clone());
        }
        outcome
    }

    fn apply_update(&mut self, ctx: ApplyContext, update: &Update) -> Result<Outcome, Rejection> {
        match update {
            Update::RegisterDataset {
                dataset_id,
                def,
                metadata,
                num_splits,
            } => self.register_dataset(
                dataset_id.clone(),
                def,
                metadata,
                num_splits,
                ctx.time_micros,
            ),
            Update::RegisterWorker {
                address,
                tags,
                worker_addresses,
                owner,
            } => self.register_worker(address, tags, worker_addresses, owner),
            Update::GetOrCreateJob {
                dataset_id,
                sharding,
                job_name,
                anonymous_suffix,
                options,
            } => self.get_or_create_job(
                dataset_id,
                *sharding,
                job_name.as_deref(),
                *anonymous_suffix,
                *options,
                ctx.time_micros,
            ),
            Update::GetOrCreateIteration { job_id, repetition } => {
                self.get_or_create_iteration(*job_id, *repetition)
            }
            Update::SaveCheckpoint {
                client_id,
                reader,
                step,
                base_step,
                taken,
            } => self.save_checkpoint(*client_id, reader, *step, *base_step, taken),
            Update::ResumeIteration {
                job_id,
                repetition,
                step,
                reader,
            } => self.resume_iteration(*job_id, *repetition, *step, reader),
            Update::LeaseSplits(lease) => self.lease_splits(lease),
            Update::ReleaseIterationClient { client_id } => {
                self.release_client(*client_id, ctx.time_micros)
            }
            Update::FinishTasks { worker, task_ids } => {
                self.finish_tasks(worker, task_ids);
                Ok(Outcome::TasksFinished)
            }
            Update::RemoveWorker { address } => {
                self.remove_worker(address);
                Ok(Outcome::WorkerRemoved)
            }
            Update::GarbageCollectIteration { iteration_id } => self.garbage_collect(*iteration_id),
            Update::ClientRounds {
                client_id,
                current_round,
                blocked_round,
            } => self.client_rounds(*client_id, *current_round, *blocked_round),
            Update::RemoveTask { task_id } => self.remove_task(*task_id),
            Update::RemoveIdle {
                iterations_before,
                datasets_before,
                iterations,
                jobs,
                datasets,
            } => Ok(self.remove_idle(
                *iterations_before,
                *datasets_before,
                iterations,
                jobs,
                datasets,
            )),
            Update::StageDefinition { key, offset, bytes } => {
                self.stage_definition(*key, *offset, bytes)
            }
            Update::RegisterStagedDataset {
                dataset_id,
                key,
                len,
                metadata,
                num_splits,
            } => self.register_staged_dataset(
                dataset_id.clone(),
                *key,
                *len,
                metadata,
                num_splits,
                ctx.time_micros,
            ),
            Update::FailCrashedTasks {
                worker,
                task_ids,
                signal,
            } => Ok(self.fail_crashed_tasks(worker, task_ids, signal)),
            Update::GetOrCreateJobWithDelivery {
                dataset_id,
                sharding,
                job_name,
                anonymous_suffix,
                options,
                delivery,
            } => self.get_or_create_job_with_delivery(
                dataset_id,
                *sharding,
                job_name.as_deref(),
                *anonymous_suffix,
                *options,
                *delivery,
                ctx.time_micros,
            ),
            Update::ReportDelivered { client_id, reports } => {
                self.report_delivered(*client_id, reports)
            }
            Update::WorkerIncarnation {
                address,
                incarnation,
            } => Ok(self.worker_incarnation(address, *incarnation)),
            Update::SetFetchKey { key } => Ok(self.set_fetch_key(key)),
        }
    }
}
