//! Removing what nobody uses any more, so the state is bounded by live work, not by history.
//!
//! The leader's timers list candidates; `remove_idle` checks each one again against the cutoffs
//! the update carries (the list was made on an older view, and a client may have come back
//! since) and removes only what is still idle:
//! - an iteration that ended (finished or collected) and whose last client left before the
//!   cutoff, with its tasks; its `(job, repetition)` key is free again;
//! - a job with no iteration left, last asked for before the cutoff;
//! - a dataset no job reads, last used before the dataset cutoff, with its definition if no
//!   other dataset shares it.
//!
//! Ids are never reused: a client that still holds a removed id gets `NotFound`.

use super::DispatcherState;
use crate::state::changes::Watched;
use crate::state::update::Outcome;
use sluice_types::{DatasetId, IterationId, JobId};

impl DispatcherState {
    pub(super) fn remove_idle(
        &mut self,
        iterations_before: u64,
        datasets_before: u64,
        iterations: &[IterationId],
        jobs: &[JobId],
        datasets: &[DatasetId],
    ) -> Outcome {
        let mut removed = (0, 0, 0);
        for id in iterations {
            if self.iteration_idle(*id, iterations_before) {
                self.forget_iteration(*id);
                removed.0 += 1;
            }
        }
        for id in jobs {
            if self.job_idle(*id, iterations_before) {
                self.forget_job(*id);
                removed.1 += 1;
            }
        }
        for id in datasets {
            if self.dataset_idle(id, datasets_before) {
                self.forget_dataset(id);
                removed.2 += 1;
            }
        }
        Outcome::IdleRemoved {
            iterations: removed.0,
            jobs: removed.1,
            datasets: removed.2,
        }
    }

    /// Ended, without clients, the last one gone before `before`.
    pub fn iteration_idle(&self, id: IterationId, before: u64) -> bool {
        self.iterations.get(&id).is_some_and(|it| {
            (it.finished || it.garbage_collected)
                && it.num_clients == 0
                && it.last_client_released_micros.is_some_and(|t| t < before)
        })
    }

    /// Without iterations, last asked for before `before`.
    pub fn job_idle(&self, id: JobId, before: u64) -> bool {
        self.jobs
            .get(&id)
            .is_some_and(|job| job.iterations == 0 && job.last_used_micros < before)
    }

    /// No job reads it, last used before `before`.
    pub fn dataset_idle(&self, id: &DatasetId, before: u64) -> bool {
        self.datasets
            .get(id)
            .is_some_and(|d| d.jobs == 0 && d.last_used_micros < before)
    }

    fn forget_iteration(&mut self, id: IterationId) {
        let Some(iteration) = self.iterations.remove(&id) else {
            return;
        };
        self.changes.touch(Watched::Iteration(id));
        self.iteration_failures.remove(&id);
        self.forget_lineages(id);
        let pending = iteration.pending_tasks.iter().map(|p| p.task_id);
        for task_id in iteration.tasks.iter().copied().chain(pending) {
            self.mark_finished(task_id, true);
            self.tasks.remove(&task_id);
        }
        // No client refers to it: it had none left.
        if let Some(job) = self.jobs.get_mut(&iteration.job_id) {
            job.iterations = job.iterations.saturating_sub(1);
            let key = (job.name.clone(), iteration.repetition);
            if self.iteration_keys.get(&key) == Some(&id) {
                self.iteration_keys.remove(&key);
            }
        }
    }

    fn forget_job(&mut self, id: JobId) {
        let Some(job) = self.jobs.remove(&id) else {
            return;
        };
        if self.job_names.get(&job.name) == Some(&id) {
            self.job_names.remove(&job.name);
        }
        if let Some(dataset) = self.datasets.get_mut(&job.dataset_id) {
            dataset.jobs = dataset.jobs.saturating_sub(1);
            dataset.last_used_micros = dataset.last_used_micros.max(job.last_used_micros);
        }
    }
}
