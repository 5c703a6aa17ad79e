//! Readers' states of exactly-once epochs: a state adds what its reader took to the checkpoint
//! at its step, and a restore creates an iteration from a checkpoint (see `state::checkpoint`
//! for the model).

use super::DispatcherState;
use crate::state::changes::Watched;
use crate::state::checkpoint::{
    Checkpoint, CheckpointKey, Restore, SavedLineage, CHECKPOINTS_KEPT, MAX_CHECKPOINTS,
    MAX_READER_NAME, MAX_TAKEN_RUNS,
};
use crate::state::entities::DefinitionKey;
use crate::state::lineage::{Lineage, LineageKey, MAX_LINEAGE_RUNS, MAX_REPORT_TASKS};
use crate::state::split_cursor::SplitCursor;
use crate::state::update::{Outcome, Rejection};
use sluice_types::{ClientId, IterationId, JobId, TaskId};

/// What one reader took from one task since its previous state: runs `[start, end)` of the
/// task stream's indices.
pub type Taken = (TaskId, Vec<(u64, u64)>);

impl DispatcherState {
    /// Adds what `client_id` took to the checkpoint of its iteration at `step`: the indices in
    /// `taken` (since its state at `base_step`, or since it joined), with the checkpoint at
    /// `base_step`.
    pub(super) fn save_checkpoint(
        &mut self,
        client_id: ClientId,
        reader: &str,
        step: u64,
        base_step: Option<u64>,
        taken: &[Taken],
    ) -> Result<Outcome, Rejection> {
        let iteration_id = *self.clients.get(&client_id).ok_or_else(|| {
            Rejection::NotFound(format!("Iteration client id not found: {client_id}"))
        })?;
        check_reader(reader)?;
        let iteration = &self.iterations[&iteration_id];
        let job = &self.jobs[&iteration.job_id];
        if !self.exactly_once_job(job.id) {
            return Err(Rejection::FailedPrecondition(format!(
                "job '{}' delivers at most once: a reader's state needs exactly-once delivery \
                 (distributed_epoch or static sharding, without coordinated reads or a \
                 cross-trainer cache)",
                job.name
            )));
        }
        if let Some(failure) = self.iteration_failures.get(&iteration_id) {
            return Err(Rejection::FailedPrecondition(failure.clone()));
        }
        if taken.len() > MAX_REPORT_TASKS {
            return Err(Rejection::InvalidArgument(format!(
                "a state names {} tasks, more than {MAX_REPORT_TASKS}",
                taken.len()
            )));
        }
        let runs: usize = taken.iter().map(|(_, runs)| runs.len()).sum();
        if runs > MAX_TAKEN_RUNS {
            return Err(Rejection::ResourceExhausted(format!(
                "a state reports {runs} runs of taken elements, more than {MAX_TAKEN_RUNS}: take \
                 states more often"
            )));
        }
        let name = job.name.clone();
        let repetition = iteration.repetition;
        let definition = self.definition_of(job.id).ok_or_else(|| {
            Rejection::NotFound(format!("the dataset of job '{name}' is not registered"))
        })?;
        let base = match base_step {
            None => None,
            Some(base) => Some(
                self.checkpoints
                    .records
                    .get(&(name.clone(), repetition, base))
                    .filter(|c| c.iteration == iteration_id)
                    .ok_or_else(|| {
                        Rejection::FailedPrecondition(format!(
                            "the state this reader took at step {base} of job '{name}' is no \
                             longer kept (the dispatcher keeps the last {CHECKPOINTS_KEPT} of \
                             each job): take states at the same steps on every reader"
                        ))
                    })?,
            ),
        };
        // Everything is checked, and the checkpoint built aside, before anything changes.
        let key: CheckpointKey = (name.clone(), repetition, step);
        let mut checkpoint = self
            .checkpoints
            .records
            .get(&key)
            .filter(|c| c.iteration == iteration_id)
            .cloned()
            .unwrap_or_else(|| Checkpoint {
                definition,
                iteration: iteration_id,
                sequence: self.checkpoints.next_sequence,
                cursors: Vec::new(),
                lineages: Default::default(),
                readers: Default::default(),
            });
        checkpoint.cursors = iteration.cursors.clone();
        for (lineage_key, lineage) in self.lineages_of(iteration_id) {
            let saved = checkpoint.lineages.entry(*lineage_key).or_default();
            saved.leases = lineage.leases.clone();
            saved.origin_worker = lineage.origin_worker.clone();
            if let Some(before) = self.checkpoints.bases.get(lineage_key) {
                saved.taken.extend(before);
            }
            if let Some(from_base) = base.and_then(|b| b.lineages.get(lineage_key)) {
                saved.taken.extend(&from_base.taken);
            }
        }
        for (task_id, runs) in taken {
            if let Some((start, end)) = runs.iter().find(|(s, e)| s >= e) {
                return Err(Rejection::InvalidArgument(format!(
                    "the state's runs of task {task_id} include an empty or reversed run \
                     [{start}, {end})"
                )));
            }
            let Some(lineage_key) = self.exactly_once.tasks.get(task_id).copied() else {
                return Err(Rejection::InvalidArgument(format!(
                    "task {task_id} is not a task of iteration {iteration_id}, which client \
                     {client_id} reads"
                )));
            };
            if lineage_key.0 != iteration_id {
                return Err(Rejection::InvalidArgument(format!(
                    "task {task_id} is not a task of iteration {iteration_id}, which client \
                     {client_id} reads"
                )));
            }
            let saved = checkpoint.lineages.entry(lineage_key).or_default();
            for &(start, end) in runs {
                saved.taken.insert(start, end);
            }
            if saved.taken.num_runs() > MAX_LINEAGE_RUNS {
                return Err(Rejection::ResourceExhausted(format!(
                    "the elements taken from task {task_id} would take {} runs to record, more \
                     than {MAX_LINEAGE_RUNS}",
                    saved.taken.num_runs()
                )));
            }
        }
        checkpoint.readers.insert(reader.to_string());
        if checkpoint.sequence == self.checkpoints.next_sequence {
            self.checkpoints.next_sequence = self.checkpoints.next_sequence.saturating_add(1);
        }
        self.checkpoints.records.insert(key, checkpoint);
        self.keep_last_checkpoints(&name);
        Ok(Outcome::CheckpointSaved {
            job_name: name,
            repetition,
            definition,
        })
    }

    /// Drops the oldest checkpoints of `job_name` beyond the last [`CHECKPOINTS_KEPT`], and the
    /// oldest of all beyond [`MAX_CHECKPOINTS`].
    fn keep_last_checkpoints(&mut self, job_name: &str) {
        self.keep_last_of_job(job_name);
        while self.checkpoints.records.len() > MAX_CHECKPOINTS {
            let Some(oldest) = self
                .checkpoints
                .records
                .iter()
                .min_by_key(|(_, c)| c.sequence)
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            self.checkpoints.records.remove(&oldest);
        }
    }

    fn keep_last_of_job(&mut self, job_name: &str) {
        let from = (job_name.to_string(), 0, 0);
        let to = (job_name.to_string(), u64::MAX, u64::MAX);
        let mut of_job: Vec<(u64, CheckpointKey)> = self
            .checkpoints
            .records
            .range(from..=to)
            .map(|(key, c)| (c.sequence, key.clone()))
            .collect();
        if of_job.len() <= CHECKPOINTS_KEPT {
            return;
        }
        of_job.sort();
        let excess = of_job.len() - CHECKPOINTS_KEPT;
        for (_, key) in of_job.into_iter().take(excess) {
            self.checkpoints.records.remove(&key);
        }
    }

    /// A reader restores job `job_id`'s `repetition` from its state at `step`: it joins the
    /// iteration restored from that step when one is there and the reader has not joined it
    /// yet; otherwise a new iteration is created from the checkpoint, superseding the one under
    /// the job's name and repetition.
    pub(super) fn resume_iteration(
        &mut self,
        job_id: JobId,
        repetition: u64,
        step: u64,
        reader: &str,
    ) -> Result<Outcome, Rejection> {
        check_reader(reader)?;
        let job = self
            .jobs
            .get(&job_id)
            .ok_or_else(|| Rejection::NotFound(format!("Job with id {job_id} not found")))?;
        let name = job.name.clone();
        if !self.exactly_once_job(job_id) {
            return Err(Rejection::FailedPrecondition(format!(
                "job '{name}' delivers at most once: only an exactly-once job resumes from a \
                 reader's state"
            )));
        }
        let key: CheckpointKey = (name.clone(), repetition, step);
        let checkpoint = self.checkpoints.records.get(&key).ok_or_else(|| {
            Rejection::NotFound(format!(
                "no state of job '{name}' at step {step} of epoch {repetition} is kept (the \
                 dispatcher keeps the last {CHECKPOINTS_KEPT} of each job)"
            ))
        })?;
        let definition = self.definition_of(job_id).ok_or_else(|| {
            Rejection::NotFound(format!("the dataset of job '{name}' is not registered"))
        })?;
        if checkpoint.definition != definition {
            return Err(Rejection::InvalidArgument(format!(
                "the state was taken reading dataset definition {}, and job '{name}' reads \
                 definition {}: a state resumes the dataset it was taken from",
                hex(&checkpoint.definition),
                hex(&definition)
            )));
        }
        let current = self
            .iteration_keys
            .get(&(name.clone(), repetition))
            .copied();
        let joinable = current.filter(|id| {
            self.checkpoints
                .restores
                .get(id)
                .is_some_and(|r| r.step == step && !r.readers.contains(reader))
                // Finished too: the readers that restored first read what was left, and a
                // late one gets the end.
                && self.iterations.get(id).is_some_and(|it| !it.garbage_collected)
                && !self.iteration_failures.contains_key(id)
        });
        let iteration_id = match joinable {
            Some(id) => {
                if let Some(restore) = self.checkpoints.restores.get_mut(&id) {
                    restore.readers.insert(reader.to_string());
                }
                id
            }
            None => {
                let checkpoint = checkpoint.clone();
                if let Some(old) = current {
                    self.supersede(old, &name, step);
                }
                self.restore_iteration(job_id, repetition, step, reader, checkpoint)
            }
        };
        Ok(self.add_client(iteration_id))
    }

    /// Ends iteration `old`, which a restore replaces: its readers get why, its tasks stop.
    fn supersede(&mut self, old: IterationId, job_name: &str, step: u64) {
        let Some(iteration) = self.iterations.get(&old) else {
            return;
        };
        if !iteration.finished && !self.iteration_failures.contains_key(&old) {
            self.iteration_failures.insert(
                old,
                format!(
                    "iteration {old} of job '{job_name}' was superseded: a reader restored the \
                     job from its state at step {step} (restore every reader of a job from \
                     states of one step)"
                ),
            );
        }
        let unfinished = self.unfinished_tasks(old);
        self.changes.touch(Watched::Iteration(old));
        self.forget_lineages(old);
        for task_id in unfinished {
            self.drop_task(task_id);
        }
    }

    /// A new iteration of `job_id`'s `repetition` from `checkpoint`: its lineages wait for
    /// workers, its cursors go on from the checkpoint's, and every worker gets a fresh task.
    fn restore_iteration(
        &mut self,
        job_id: JobId,
        repetition: u64,
        step: u64,
        reader: &str,
        checkpoint: Checkpoint,
    ) -> IterationId {
        let id = self.new_iteration(job_id, repetition, checkpoint.cursors);
        for saved in checkpoint.lineages.into_values() {
            let SavedLineage {
                leases,
                taken,
                origin_worker,
            } = saved;
            // A task id that names no task: the lineage's key until it gets a task.
            let placeholder = TaskId(self.next_task_id);
            self.next_task_id = self.next_task_id.saturating_add(1);
            let key: LineageKey = (id, placeholder);
            let mut lineage = Lineage::new(placeholder, &origin_worker);
            lineage.running = false;
            lineage.leases = leases;
            #[cfg(feature = "planted-restore-bug")]
            let taken = planted_restore_bug(taken);
            lineage.delivered = taken.clone();
            self.exactly_once.lineages.insert(key, lineage);
            self.checkpoints.bases.insert(key, taken);
        }
        self.checkpoints.restores.insert(
            id,
            Restore {
                step,
                readers: [reader.to_string()].into(),
            },
        );
        let workers: Vec<String> = self.workers.keys().cloned().collect();
        for worker in workers {
            if self.lacks_task(&self.iterations[&id], &worker) {
                self.create_task(id, &worker, 0);
            }
        }
        self.assign_ready_lineages();
        id
    }

    /// The definition the dataset of `job_id` reads.
    fn definition_of(&self, job_id: JobId) -> Option<DefinitionKey> {
        let job = self.jobs.get(&job_id)?;
        Some(self.datasets.get(&job.dataset_id)?.definition)
    }

    /// The iteration's checkpoint bookkeeping goes with it.
    pub(super) fn forget_restore(&mut self, iteration_id: IterationId) {
        self.checkpoints.restores.remove(&iteration_id);
        let keys: Vec<LineageKey> = self
            .checkpoints
            .bases
            .range((iteration_id, TaskId(0))..=(iteration_id, TaskId(u64::MAX)))
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            self.checkpoints.bases.remove(&key);
        }
    }

    /// The checkpoint kept under `(job_name, repetition, step)`.
    pub fn checkpoint(&self, job_name: &str, repetition: u64, step: u64) -> Option<&Checkpoint> {
        self.checkpoints
            .records
            .get(&(job_name.to_string(), repetition, step))
    }

    /// Checkpoints kept, of every job.
    pub fn checkpoint_count(&self) -> usize {
        self.checkpoints.records.len()
    }

    /// The cursors a new iteration starts with when nothing restores it: every provider of a
    /// distributed_epoch dataset at its start.
    pub(super) fn fresh_cursors(&self, job_id: JobId) -> Vec<SplitCursor> {
        let Some(job) = self.jobs.get(&job_id) else {
            return Vec::new();
        };
        if job.sharding != sluice_types::ShardingPolicy::Dynamic {
            return Vec::new();
        }
        self.datasets
            .get(&job.dataset_id)
            .map(|d| d.num_splits.iter().map(|n| SplitCursor::new(*n)).collect())
            .unwrap_or_default()
    }
}

/// The planted bug of the chaos harness's self-test: a restored lineage forgets the last
/// element its readers had taken, so a restored reader receives it again. Never enable
/// otherwise.
#[cfg(feature = "planted-restore-bug")]
fn planted_restore_bug(taken: sluice_types::IndexRuns) -> sluice_types::IndexRuns {
    let mut runs: Vec<(u64, u64)> = taken.iter().collect();
    if let Some(last) = runs.last_mut() {
        last.1 -= 1;
    }
    sluice_types::IndexRuns::from_runs(runs.into_iter().filter(|(s, e)| s < e))
}

fn check_reader(reader: &str) -> Result<(), Rejection> {
    if reader.is_empty() || reader.len() > MAX_READER_NAME {
        return Err(Rejection::InvalidArgument(format!(
            "a reader's name must have 1 to {MAX_READER_NAME} bytes; got {}",
            reader.len()
        )));
    }
    Ok(())
}

/// `definition` in hex, as states carry it.
pub fn hex(definition: &DefinitionKey) -> String {
    definition.iter().map(|b| format!("{b:02x}")).collect()
}
