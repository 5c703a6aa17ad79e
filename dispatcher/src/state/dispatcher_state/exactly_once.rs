//! Exactly-once delivery: lineages start with their first task, record the leases their tasks
//! get and the elements their readers received, move when their worker is removed or restarts,
//! and are taken over by a new task once every client let go of the old one (see
//! `state::lineage` for the model).

use super::jobs::effective_delivery;
use super::DispatcherState;
use crate::state::changes::Watched;
use crate::state::lineage::{
    DeliveryReport, Lineage, LineageKey, RecordedLease, MAX_LINEAGE_RUNS, MAX_REPORT_RUNS,
    MAX_REPORT_TASKS,
};
use crate::state::update::{Outcome, Rejection};
use sluice_types::{ClientId, Delivery, IndexRuns, IterationId, JobId, SplitLease, TaskId};
use std::collections::BTreeSet;

impl DispatcherState {
    pub(super) fn exactly_once_job(&self, job_id: JobId) -> bool {
        self.exactly_once.jobs.contains(&job_id)
    }

    /// Records how a newly created job delivers: exactly once only where it means something (a
    /// job whose workers share out the data, without coordinated reads or a cross-trainer
    /// cache, which have their own rules).
    pub(super) fn set_job_delivery(&mut self, job_id: JobId, delivery: Delivery) {
        let Some(job) = self.jobs.get(&job_id) else {
            return;
        };
        if effective_delivery(job.sharding, job.options, delivery) == Delivery::ExactlyOnce {
            self.exactly_once.jobs.insert(job_id);
        }
    }

    /// How the job delivers, as recorded.
    pub fn job_delivery(&self, job_id: JobId) -> Delivery {
        if self.exactly_once_job(job_id) {
            Delivery::ExactlyOnce
        } else {
            Delivery::AtMostOnce
        }
    }

    /// A task just created in `iteration_id` for `worker` starts a lineage when its job
    /// delivers exactly once.
    pub(super) fn start_lineage(
        &mut self,
        iteration_id: IterationId,
        task_id: TaskId,
        worker: &str,
    ) {
        let Some(iteration) = self.iterations.get(&iteration_id) else {
            return;
        };
        if !self.exactly_once_job(iteration.job_id) {
            return;
        }
        let key = (iteration_id, task_id);
        self.exactly_once
            .lineages
            .insert(key, Lineage::new(task_id, worker));
        self.exactly_once.tasks.insert(task_id, key);
    }

    /// A lease of split provider `provider` was granted to `task_id`: its lineage's tasks
    /// consume that provider's leases in this order.
    pub(super) fn record_lease(&mut self, task_id: TaskId, provider: u32, lease: &SplitLease) {
        if lease.end_of_splits || lease.start >= lease.end {
            return;
        }
        if let Some(lineage) = self
            .exactly_once
            .tasks
            .get(&task_id)
            .and_then(|key| self.exactly_once.lineages.get_mut(key))
        {
            lineage.leases.push(RecordedLease {
                provider,
                repetition: lease.repetition,
                start: lease.start,
                end: lease.end,
            });
        }
    }

    /// The lineage `task_id` runs now, if any.
    pub fn lineage_of_task(&self, task_id: TaskId) -> Option<&Lineage> {
        let key = self.exactly_once.tasks.get(&task_id)?;
        self.exactly_once
            .lineages
            .get(key)
            .filter(|lineage| lineage.task == task_id)
    }

    /// Whether `task_id`'s stream moved (or is moving) to another task: nobody is to read it.
    pub fn task_moved(&self, task_id: TaskId) -> bool {
        self.exactly_once
            .tasks
            .get(&task_id)
            .and_then(|key| self.exactly_once.lineages.get(key))
            .is_some_and(|l| l.task != task_id || !l.running)
    }

    /// The worker whose static shard `task_id` reads: its lineage's first worker, else its own.
    pub fn shard_worker_of<'a>(&'a self, task_id: TaskId, worker: &'a str) -> &'a str {
        self.lineage_of_task(task_id)
            .map_or(worker, |lineage| lineage.origin_worker.as_str())
    }

    /// Whether a lineage of the iteration moves (the iteration is not finished meanwhile).
    pub(super) fn has_moving_lineage(&self, iteration_id: IterationId) -> bool {
        self.lineages_of(iteration_id).any(|(_, l)| !l.running)
    }

    /// Whether some lineage of the iteration started on `worker` (static sharding: its shard is
    /// read, wherever the lineage runs now).
    pub(super) fn shard_taken(&self, iteration_id: IterationId, worker: &str) -> bool {
        self.lineages_of(iteration_id)
            .any(|(_, l)| l.origin_worker == worker)
    }

    pub(super) fn lineages_of(
        &self,
        iteration_id: IterationId,
    ) -> impl Iterator<Item = (&LineageKey, &Lineage)> {
        self.exactly_once
            .lineages
            .range((iteration_id, TaskId(0))..=(iteration_id, TaskId(u64::MAX)))
    }

    /// The lineages `worker`'s unfinished tasks run start to move; returns their tasks, which
    /// the caller drops after this (so the iteration does not finish meanwhile).
    pub(super) fn move_lineages_of_worker(&mut self, worker: &str) -> Vec<TaskId> {
        let tasks: Vec<TaskId> = self
            .active_tasks_of_worker(worker)
            .iter()
            .copied()
            .filter(|t| self.lineage_of_task(*t).is_some_and(|l| l.running))
            .collect();
        for task_id in &tasks {
            let key = self.exactly_once.tasks[task_id];
            let clients: BTreeSet<ClientId> = self
                .clients
                .iter()
                .filter(|(_, it)| **it == key.0)
                .map(|(c, _)| *c)
                .collect();
            let lineage = self
                .exactly_once
                .lineages
                .get_mut(&key)
                .expect("a task's lineage is stored");
            lineage.running = false;
            lineage.waiting = clients;
            lineage.moves = lineage.moves.saturating_add(1);
            self.changes.touch(Watched::Iteration(key.0));
        }
        tasks
    }

    /// What a client received, and which moving tasks it let go of.
    pub(super) fn report_delivered(
        &mut self,
        client_id: ClientId,
        reports: &[DeliveryReport],
    ) -> Result<Outcome, Rejection> {
        let iteration_id = *self.clients.get(&client_id).ok_or_else(|| {
            Rejection::NotFound(format!("Iteration client id not found: {client_id}"))
        })?;
        if reports.len() > MAX_REPORT_TASKS {
            return Err(Rejection::InvalidArgument(format!(
                "a delivery report names {} tasks, more than {MAX_REPORT_TASKS}",
                reports.len()
            )));
        }
        // Everything is checked before anything changes.
        let mut merged = Vec::new();
        for report in reports {
            let task_id = report.task_id;
            if report.runs.len() > MAX_REPORT_RUNS {
                return Err(Rejection::InvalidArgument(format!(
                    "the delivery report of task {task_id} has {} runs, more than \
                     {MAX_REPORT_RUNS}",
                    report.runs.len()
                )));
            }
            if let Some((start, end)) = report.runs.iter().find(|(s, e)| s >= e) {
                return Err(Rejection::InvalidArgument(format!(
                    "the delivery report of task {task_id} has an empty or reversed run \
                     [{start}, {end})"
                )));
            }
            // A task the state no longer tracks (its lineage ended with its iteration) has
            // nothing to learn.
            let Some(key) = self.exactly_once.tasks.get(&task_id).copied() else {
                continue;
            };
            if key.0 != iteration_id {
                return Err(Rejection::InvalidArgument(format!(
                    "task {task_id} is not a task of iteration {iteration_id}, which client \
                     {client_id} reads"
                )));
            }
            let Some(lineage) = self.exactly_once.lineages.get(&key) else {
                continue;
            };
            let mut delivered = lineage.delivered.clone();
            for &(start, end) in &report.runs {
                delivered.insert(start, end);
            }
            if delivered.num_runs() > MAX_LINEAGE_RUNS {
                return Err(Rejection::ResourceExhausted(format!(
                    "the elements received from task {task_id} would take {} runs to record, \
                     more than {MAX_LINEAGE_RUNS}",
                    delivered.num_runs()
                )));
            }
            merged.push((key, task_id, delivered, report.released));
        }
        let mut let_go = false;
        for (key, task_id, delivered, released) in merged {
            let lineage = self
                .exactly_once
                .lineages
                .get_mut(&key)
                .expect("checked above");
            lineage.delivered = delivered;
            if released && !lineage.running && lineage.task == task_id {
                lineage.waiting.remove(&client_id);
                self.changes.touch(Watched::Iteration(key.0));
                let_go = true;
            }
        }
        // Most reports only record what arrived: only a release can make a lineage ready, and
        // looking for ready ones scans every lineage.
        if let_go {
            self.assign_ready_lineages();
        }
        Ok(Outcome::DeliveryRecorded)
    }

    /// A client left its iteration: no lineage waits for it any more.
    pub(super) fn client_left(&mut self, client_id: ClientId, iteration_id: IterationId) {
        let keys: Vec<LineageKey> = self
            .lineages_of(iteration_id)
            .filter(|(_, l)| l.waiting.contains(&client_id))
            .map(|(k, _)| *k)
            .collect();
        if keys.is_empty() {
            return;
        }
        for key in keys {
            if let Some(lineage) = self.exactly_once.lineages.get_mut(&key) {
                lineage.waiting.remove(&client_id);
            }
            self.changes.touch(Watched::Iteration(key.0));
        }
        self.assign_ready_lineages();
    }

    /// The tasks `client_id` must let go of: those its iteration's moving lineages wait on.
    pub fn tasks_to_release(&self, client_id: ClientId) -> Vec<TaskId> {
        let Some(iteration_id) = self.clients.get(&client_id) else {
            return Vec::new();
        };
        self.lineages_of(*iteration_id)
            .filter(|(_, l)| !l.running && l.waiting.contains(&client_id))
            .map(|(_, l)| l.task)
            .collect()
    }

    /// Gives every lineage that is ready to move a new task on the registered worker with the
    /// fewest unfinished tasks (the lowest address among equals). With no worker registered
    /// they wait for one. Lineages of iterations that ended, failed or were collected stay
    /// where they are.
    pub(super) fn assign_ready_lineages(&mut self) {
        let ready: Vec<LineageKey> = self
            .exactly_once
            .lineages
            .iter()
            .filter(|(_, l)| l.ready_to_move())
            .map(|(k, _)| *k)
            .collect();
        for key in ready {
            let live = self.iterations.get(&key.0).is_some_and(|it| {
                !it.finished
                    && !it.garbage_collected
                    && !self.iteration_failures.contains_key(&it.id)
            });
            if !live {
                continue;
            }
            let Some(worker) = self
                .workers
                .keys()
                .min_by_key(|w| (self.active_tasks_of_worker(w).len(), (*w).clone()))
                .cloned()
            else {
                return;
            };
            let task_id = self.new_task(key.0, &worker, 0);
            self.iteration_mut(key.0).tasks.push(task_id);
            self.exactly_once.tasks.insert(task_id, key);
            let lineage = self
                .exactly_once
                .lineages
                .get_mut(&key)
                .expect("listed above");
            lineage.task = task_id;
            lineage.running = true;
        }
    }

    /// A worker reported the process it runs in. Another process than the one recorded under
    /// its address restarted there: what the old one ran is gone, and its lineages move (its
    /// other tasks are run again from the start, as tf.data does).
    pub(super) fn worker_incarnation(&mut self, address: &str, incarnation: u64) -> Outcome {
        if !self.workers.contains_key(address) {
            return Outcome::WorkerRestarted { moved: Vec::new() };
        }
        let previous = self
            .exactly_once
            .incarnations
            .insert(address.to_string(), incarnation);
        let restarted = previous.is_some_and(|p| p != incarnation);
        let moved = if restarted {
            let moved = self.move_lineages_of_worker(address);
            for task_id in &moved {
                self.drop_task(*task_id);
            }
            self.assign_ready_lineages();
            moved
        } else {
            Vec::new()
        };
        Outcome::WorkerRestarted { moved }
    }

    /// The process recorded for the worker at `address`.
    pub fn worker_incarnation_of(&self, address: &str) -> Option<u64> {
        self.exactly_once.incarnations.get(address).copied()
    }

    /// The iteration is gone: so are its lineages.
    pub(super) fn forget_lineages(&mut self, iteration_id: IterationId) {
        let keys: Vec<LineageKey> = self.lineages_of(iteration_id).map(|(k, _)| *k).collect();
        for key in keys {
            self.exactly_once.lineages.remove(&key);
        }
        self.exactly_once
            .tasks
            .retain(|_, key| key.0 != iteration_id);
        self.forget_restore(iteration_id);
    }

    /// What a worker taking `task_id` over needs: the leases to consume first, and the indices
    /// to skip. `None` for a task without a lineage.
    pub fn replay_of(&self, task_id: TaskId) -> Option<(&[RecordedLease], &IndexRuns)> {
        self.lineage_of_task(task_id)
            .map(|l| (l.leases.as_slice(), &l.delivered))
    }
}
