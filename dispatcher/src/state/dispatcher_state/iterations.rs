//! Iterations and their clients: get-or-create by `(job name, repetition)`, client release,
//! the finished rule, and garbage collection of idle iterations.

use super::DispatcherState;
use crate::state::changes::Watched;
use crate::state::entities::Iteration;
use crate::state::split_cursor::SplitCursor;
use crate::state::update::{Outcome, Rejection};
use sluice_types::{ClientId, IterationId, JobId};

impl DispatcherState {
    pub(super) fn get_or_create_iteration(
        &mut self,
        job_id: JobId,
        repetition: u64,
    ) -> Result<Outcome, Rejection> {
        let job = self
            .jobs
            .get(&job_id)
            .ok_or_else(|| Rejection::NotFound(format!("Job with id {job_id} not found")))?;
        let key = (job.name.clone(), repetition);
        let iteration_id = match self.iteration_keys.get(&key) {
            Some(id) => *id,
            None => {
                let cursors = self.fresh_cursors(job_id);
                let id = self.new_iteration(job_id, repetition, cursors);
                let workers: Vec<String> = self.workers.keys().cloned().collect();
                for worker in workers {
                    self.create_task(id, &worker, 0);
                }
                id
            }
        };
        Ok(self.add_client(iteration_id))
    }

    /// A new iteration of `job_id` under the job's name and `repetition`, without tasks.
    pub(super) fn new_iteration(
        &mut self,
        job_id: JobId,
        repetition: u64,
        cursors: Vec<SplitCursor>,
    ) -> IterationId {
        let name = self
            .jobs
            .get(&job_id)
            .map(|j| j.name.clone())
            .unwrap_or_default();
        let id = IterationId(self.next_iteration_id);
        self.next_iteration_id = self.next_iteration_id.saturating_add(1);
        self.iterations.insert(
            id,
            Iteration {
                id,
                job_id,
                repetition,
                tasks: Vec::new(),
                cursors,
                num_clients: 0,
                last_client_released_micros: None,
                finished: false,
                garbage_collected: false,
                pending_tasks: Default::default(),
                round_estimate: 0,
            },
        );
        self.iteration_keys.insert((name, repetition), id);
        if let Some(job) = self.jobs.get_mut(&job_id) {
            job.iterations += 1;
        }
        self.changes.touch(Watched::Iteration(id));
        id
    }

    /// A new client of `iteration_id`.
    pub(super) fn add_client(&mut self, iteration_id: IterationId) -> Outcome {
        let client_id = ClientId(self.next_client_id);
        self.next_client_id = self.next_client_id.saturating_add(1);
        self.clients.insert(client_id, iteration_id);
        self.iteration_mut(iteration_id).num_clients += 1;
        Outcome::Iteration {
            iteration_id,
            client_id,
        }
    }

    pub(super) fn release_client(
        &mut self,
        client_id: ClientId,
        time_micros: u64,
    ) -> Result<Outcome, Rejection> {
        let iteration_id = self.clients.remove(&client_id).ok_or_else(|| {
            Rejection::NotFound(format!("Iteration client id not found: {client_id}"))
        })?;
        let iteration = self.iteration_mut(iteration_id);
        iteration.num_clients = iteration.num_clients.saturating_sub(1);
        iteration.last_client_released_micros = Some(time_micros);
        self.client_left(client_id, iteration_id);
        Ok(Outcome::ClientReleased)
    }

    /// An iteration finishes when every task is finished and at least one reached its end: an
    /// iteration whose every worker was removed waits for a worker to come (back) instead.
    ///
    /// An iteration of an infinite dataset finishes only when every task reached its end: a
    /// dropped task (its worker removed) never ends it, so it goes on with the workers left and,
    /// with none left, waits for one to register (as in tf.data, where a worker leaving never
    /// ends an epoch). A finite or unknown cardinality keeps the rule above, so that an epoch
    /// with a dead worker's task still ends with the others.
    pub(super) fn update_finished(&mut self, iteration_id: IterationId) {
        let iteration = &self.iterations[&iteration_id];
        let tasks = &iteration.tasks;
        let all_finished = tasks.iter().all(|t| self.tasks[t].finished);
        let ended = tasks.iter().filter(|t| !self.tasks[t].dropped).count();
        let finished = if self.infinite(iteration.job_id) {
            all_finished && ended == tasks.len() && ended > 0
        } else {
            all_finished && ended > 0
        };
        if finished && !self.has_moving_lineage(iteration_id) {
            self.iteration_mut(iteration_id).finished = true;
        }
    }

    /// Whether the job's dataset is infinite (by the cardinality computed at registration); a
    /// job or dataset no longer known is not.
    fn infinite(&self, job_id: JobId) -> bool {
        self.jobs
            .get(&job_id)
            .and_then(|job| self.datasets.get(&job.dataset_id))
            .is_some_and(|dataset| dataset.metadata.is_infinite())
    }

    pub(super) fn garbage_collect(
        &mut self,
        iteration_id: IterationId,
    ) -> Result<Outcome, Rejection> {
        let iteration = self
            .iterations
            .get(&iteration_id)
            .ok_or_else(|| Rejection::NotFound(format!("Iteration id {iteration_id} not found")))?;
        if iteration.finished || iteration.num_clients > 0 {
            // Decided on an older view; finished iterations are kept, busy ones are not idle.
            return Ok(Outcome::IterationCollected);
        }
        let key = (
            self.jobs
                .get(&iteration.job_id)
                .map(|j| j.name.clone())
                .unwrap_or_default(),
            iteration.repetition,
        );
        let pending = iteration.pending_tasks.iter().map(|p| p.task_id);
        for task_id in iteration
            .tasks
            .iter()
            .copied()
            .chain(pending)
            .collect::<Vec<_>>()
        {
            self.mark_finished(task_id, true);
        }
        if self.iteration_keys.get(&key) == Some(&iteration_id) {
            self.iteration_keys.remove(&key);
        }
        let iteration = self.iteration_mut(iteration_id);
        iteration.finished = true;
        iteration.garbage_collected = true;
        iteration.pending_tasks.clear();
        Ok(Outcome::IterationCollected)
    }

    /// Every change of an iteration goes through here, and touches it for its waiters.
    pub(super) fn iteration_mut(&mut self, id: IterationId) -> &mut Iteration {
        self.changes.touch(Watched::Iteration(id));
        self.iterations
            .get_mut(&id)
            .expect("ids stored in the state name existing iterations")
    }
}
