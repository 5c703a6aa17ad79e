//! `DispatcherState`: every dataset, worker, job, iteration, task, split cursor and recorded
//! request outcome of the dispatcher, and `apply`, the only function that changes them.
//!
//! Invariants (checked by the table tests):
//! - a task is in its iteration's `tasks` list and names a registered worker;
//! - at most one iteration per `(job name, repetition)`;
//! - an iteration is finished iff it has tasks and all of them are finished; a finished
//!   iteration never gets new tasks;
//! - a split index of a provider and repetition is leased at most once;
//! - a request id seen again returns the outcome recorded the first time.

use crate::ids::{ClientId, DatasetId, IterationId, JobId, TaskId};
use crate::state::entities::{Dataset, Iteration, Job, PendingTask, Task, Worker};
use crate::state::split_cursor::SplitCursor;
use crate::state::update::{
    DatasetMetadata, JobOptions, Outcome, Rejection, Request, RequestId, ShardingPolicy, Update,
};
use crate::state::worker_index_resolver::WorkerIndexResolver;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How many outcomes are kept per requester, so concurrent requests of one requester can all be
/// retried; a retry older than the window is rejected instead of applied twice.
pub const DEDUP_WINDOW: usize = 64;

/// What `apply` may know about the entry being applied.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApplyContext {
    /// Index of the log entry.
    pub log_index: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DispatcherState {
    datasets: BTreeMap<DatasetId, Dataset>,
    workers: BTreeMap<String, Worker>,
    jobs: BTreeMap<JobId, Job>,
    job_names: BTreeMap<String, JobId>,
    iterations: BTreeMap<IterationId, Iteration>,
    iteration_keys: BTreeMap<(String, u64), IterationId>,
    clients: BTreeMap<ClientId, IterationId>,
    tasks: BTreeMap<TaskId, Task>,
    /// Static sharding: the configured worker list and the index each worker took in it.
    worker_indices: WorkerIndexResolver,
    /// Recorded outcomes per requester, by sequence number (the last `DEDUP_WINDOW`).
    requests: BTreeMap<u64, BTreeMap<u64, Outcome>>,
    next_dataset_id: u64,
    next_job_id: u64,
    next_iteration_id: u64,
    next_client_id: u64,
    next_task_id: u64,
}

impl Default for DispatcherState {
    fn default() -> Self {
        DispatcherState {
            datasets: BTreeMap::new(),
            workers: BTreeMap::new(),
            jobs: BTreeMap::new(),
            job_names: BTreeMap::new(),
            iterations: BTreeMap::new(),
            iteration_keys: BTreeMap::new(),
            clients: BTreeMap::new(),
            tasks: BTreeMap::new(),
            worker_indices: WorkerIndexResolver::default(),
            requests: BTreeMap::new(),
            next_dataset_id: 1000,
            next_job_id: 5000,
            next_iteration_id: 2000,
            next_client_id: 3000,
            next_task_id: 4000,
        }
    }
}

impl DispatcherState {
    /// Applies one request: returns the recorded outcome for a repeated request id, otherwise
    /// applies the update and records its outcome.
    pub fn apply(&mut self, _ctx: ApplyContext, request: &Request) -> Outcome {
        if let Some(id) = request.id {
            if let Some(outcome) = self.recorded(id) {
                return outcome;
            }
        }
        let outcome = match self.apply_update(&request.update) {
            Ok(outcome) => outcome,
            Err(rejection) => Outcome::Rejected(rejection),
        };
        if let Some(id) = request.id {
            self.record(id, outcome.clone());
        }
        outcome
    }

    fn recorded(&self, id: RequestId) -> Option<Outcome> {
        let seen = self.requests.get(&id.requester)?;
        if let Some(outcome) = seen.get(&id.seq) {
            return Some(outcome.clone());
        }
        let window_full = seen.len() >= DEDUP_WINDOW;
        let oldest = seen.keys().next().copied().unwrap_or(0);
        (window_full && id.seq < oldest).then(|| {
            Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "request {} of requester {} is older than the {DEDUP_WINDOW} requests remembered; \
                 it was not applied",
                id.seq, id.requester
            )))
        })
    }

    fn record(&mut self, id: RequestId, outcome: Outcome) {
        let seen = self.requests.entry(id.requester).or_default();
        seen.insert(id.seq, outcome);
        while seen.len() > DEDUP_WINDOW {
            seen.pop_first();
        }
    }

    fn apply_update(&mut self, update: &Update) -> Result<Outcome, Rejection> {
        match update {
            Update::RegisterDataset {
                dataset_id,
                def,
                metadata,
                num_splits,
            } => self.register_dataset(dataset_id.clone(), def, metadata, num_splits),
            Update::RegisterWorker {
                address,
                tags,
                worker_addresses,
            } => self.register_worker(address, tags, worker_addresses),
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
            ),
            Update::GetOrCreateIteration { job_id, repetition } => {
                self.get_or_create_iteration(*job_id, *repetition)
            }
            Update::LeaseSplits {
                iteration_id,
                provider,
                repetition,
                max,
                task_id,
            } => self.lease_splits(*iteration_id, *provider, *repetition, *max, *task_id),
            Update::ReleaseIterationClient {
                client_id,
                time_micros,
            } => self.release_client(*client_id, *time_micros),
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
        }
    }

    fn register_dataset(
        &mut self,
        requested: Option<DatasetId>,
        def: &[u8],
        metadata: &DatasetMetadata,
        num_splits: &[u64],
    ) -> Result<Outcome, Rejection> {
        if let Some(id) = &requested {
            if let Some(existing) = self.datasets.get(id) {
                return if existing.def == def && existing.metadata == *metadata {
                    Ok(Outcome::DatasetRegistered {
                        dataset_id: id.clone(),
                    })
                } else {
                    Err(Rejection::InvalidArgument(format!(
                        "Datasets with the same ID should have the same structure, got diff for \
                         dataset ID {id}. To fix this error, make sure you're registering the same \
                         dataset with the same ID."
                    )))
                };
            }
        }
        let id = requested.unwrap_or_else(|| DatasetId(self.next_dataset_id.to_string()));
        self.datasets.insert(
            id.clone(),
            Dataset {
                id: id.clone(),
                def: def.to_vec(),
                metadata: metadata.clone(),
                num_splits: num_splits.to_vec(),
            },
        );
        // Skip generated ids that a user took explicitly.
        while self
            .datasets
            .contains_key(&DatasetId(self.next_dataset_id.to_string()))
        {
            self.next_dataset_id += 1;
        }
        Ok(Outcome::DatasetRegistered { dataset_id: id })
    }

    fn register_worker(
        &mut self,
        address: &str,
        tags: &[String],
        worker_addresses: &[String],
    ) -> Result<Outcome, Rejection> {
        self.worker_indices.record_config(worker_addresses)?;
        self.worker_indices.add_worker(address)?;
        self.workers.insert(
            address.to_string(),
            Worker {
                address: address.to_string(),
                tags: tags.to_vec(),
            },
        );
        let needing_task: Vec<IterationId> = self
            .iterations
            .values()
            .filter(|it| self.lacks_task(it, address))
            .map(|it| it.id)
            .collect();
        let tasks = needing_task
            .into_iter()
            .map(|it| {
                if self.coordinated(it) {
                    self.create_pending_task(it, address)
                } else {
                    self.create_task(it, address, 0)
                }
            })
            .collect();
        Ok(Outcome::WorkerRegistered { tasks })
    }

    /// Whether `worker` should get a task of the iteration: it is unfinished and every task the
    /// worker had in it was dropped (worker removed, task removed) or there was none. A task
    /// that ended normally is not run again.
    fn lacks_task(&self, iteration: &Iteration, worker: &str) -> bool {
        let pending = iteration
            .pending_tasks
            .iter()
            .map(|p| p.task_id)
            .chain(iteration.tasks.iter().copied());
        !iteration.finished
            && !pending
                .map(|t| &self.tasks[&t])
                .any(|t| t.worker == worker && !t.dropped)
    }

    fn coordinated(&self, iteration_id: IterationId) -> bool {
        let job_id = self.iterations[&iteration_id].job_id;
        self.jobs[&job_id].options.num_consumers.is_some()
    }

    fn get_or_create_job(
        &mut self,
        dataset_id: &DatasetId,
        sharding: ShardingPolicy,
        job_name: Option<&str>,
        anonymous_suffix: u64,
        options: JobOptions,
    ) -> Result<Outcome, Rejection> {
        if !self.datasets.contains_key(dataset_id) {
            return Err(Rejection::NotFound(format!(
                "Dataset id {dataset_id} not found"
            )));
        }
        if let Some(name) = job_name {
            if name.is_empty() {
                return Err(Rejection::InvalidArgument(
                    "`job_name` must not be empty".into(),
                ));
            }
            if let Some(job) = self.job_names.get(name).map(|id| &self.jobs[id]) {
                let mut diff = String::new();
                if job.sharding != sharding {
                    diff += &format!(
                        "Existing processing mode: <{}>; got <{}>. ",
                        job.sharding, sharding
                    );
                }
                let enabled = |on: bool| if on { "enabled" } else { "disabled" };
                if job.options.use_cross_trainer_cache != options.use_cross_trainer_cache {
                    diff += &format!(
                        "Existing cross-trainer cache: <{}>; got <{}>. ",
                        enabled(job.options.use_cross_trainer_cache),
                        enabled(options.use_cross_trainer_cache)
                    );
                }
                if job.options.target_workers != options.target_workers {
                    diff += &format!(
                        "Existing target workers: <{}>; got <{}>. ",
                        job.options.target_workers, options.target_workers
                    );
                }
                // tf.data ignores a different number of consumers; rounds of another
                // size cannot be shared, so Sluice rejects it.
                if job.options.num_consumers != options.num_consumers {
                    let show = |n: Option<u32>| n.map_or("none".to_string(), |n| n.to_string());
                    diff += &format!(
                        "Existing number of consumers: <{}>; got <{}>. ",
                        show(job.options.num_consumers),
                        show(options.num_consumers)
                    );
                }
                // Consumers of a shared job each register the dataset (and get their own id),
                // so datasets are compared by definition; another definition is another
                // dataset (tf.data silently serves the first one).
                if self.datasets[&job.dataset_id].def != self.datasets[dataset_id].def {
                    diff += &format!(
                        "Existing dataset: {}; got {}, whose definition differs. ",
                        job.dataset_id, dataset_id
                    );
                }
                return if diff.is_empty() {
                    Ok(Outcome::Job { job_id: job.id })
                } else {
                    Err(Rejection::InvalidArgument(format!(
                        "Tried to create job with name {name}, but found an existing job with \
                         different parameters: {diff}"
                    )))
                };
            }
        }
        let id = JobId(self.next_job_id);
        self.next_job_id += 1;
        let name = match job_name {
            Some(name) => name.to_string(),
            None => format!("anonymous_job_{id}_{anonymous_suffix}"),
        };
        self.job_names.insert(name.clone(), id);
        self.jobs.insert(
            id,
            Job {
                id,
                name,
                dataset_id: dataset_id.clone(),
                sharding,
                options,
            },
        );
        Ok(Outcome::Job { job_id: id })
    }

    fn get_or_create_iteration(
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
                let cursors = match job.sharding {
                    ShardingPolicy::Dynamic => self.datasets[&job.dataset_id]
                        .num_splits
                        .iter()
                        .map(|n| SplitCursor::new(*n))
                        .collect(),
                    _ => Vec::new(),
                };
                let id = IterationId(self.next_iteration_id);
                self.next_iteration_id += 1;
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
                self.iteration_keys.insert(key, id);
                let workers: Vec<String> = self.workers.keys().cloned().collect();
                for worker in workers {
                    self.create_task(id, &worker, 0);
                }
                id
            }
        };
        let client_id = ClientId(self.next_client_id);
        self.next_client_id += 1;
        self.clients.insert(client_id, iteration_id);
        self.iteration_mut(iteration_id).num_clients += 1;
        Ok(Outcome::Iteration {
            iteration_id,
            client_id,
        })
    }

    fn lease_splits(
        &mut self,
        iteration_id: IterationId,
        provider: u32,
        repetition: u64,
        max: u64,
        task_id: TaskId,
    ) -> Result<Outcome, Rejection> {
        let iteration = self
            .iterations
            .get_mut(&iteration_id)
            .ok_or_else(|| Rejection::NotFound(format!("Iteration id {iteration_id} not found")))?;
        let job = &self.jobs[&iteration.job_id];
        if job.sharding != ShardingPolicy::Dynamic {
            return Err(Rejection::FailedPrecondition(format!(
                "Cannot get split for iteration {iteration_id}, since it is not a \
                 distributed_epoch iteration."
            )));
        }
        match self.tasks.get(&task_id) {
            Some(task) if task.iteration_id == iteration_id => {}
            _ => {
                return Err(Rejection::NotFound(format!(
                    "Task {task_id} of iteration {iteration_id} not found"
                )))
            }
        }
        let num_providers = iteration.cursors.len();
        let cursor = iteration
            .cursors
            .get_mut(provider as usize)
            .ok_or_else(|| {
                Rejection::InvalidArgument(format!(
                    "split provider index {provider} out of range: iteration {iteration_id} has \
                 {num_providers}"
                ))
            })?;
        Ok(Outcome::Splits(cursor.lease(repetition, max)))
    }

    fn release_client(
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
        Ok(Outcome::ClientReleased)
    }

    /// Unknown ids and ids of other workers are ignored one by one (tf.data aborts the whole
    /// report on the first unknown id, which wedges the worker: tensorflow#52252).
    fn finish_tasks(&mut self, worker: &str, task_ids: &[TaskId]) {
        for task_id in task_ids {
            let Some(task) = self.tasks.get_mut(task_id) else {
                continue;
            };
            if task.worker != worker || task.finished {
                continue;
            }
            task.finished = true;
            let iteration_id = task.iteration_id;
            self.update_finished(iteration_id);
        }
    }

    fn remove_worker(&mut self, address: &str) {
        if self.workers.remove(address).is_none() {
            return;
        }
        let dropped: Vec<TaskId> = self.active_tasks_of_worker(address).map(|t| t.id).collect();
        for task_id in dropped {
            self.drop_task(task_id);
        }
    }

    /// Ends a task that did not reach its end: it leaves its iteration's pending queue, and its
    /// iteration may now be finished.
    fn drop_task(&mut self, task_id: TaskId) {
        let task = self
            .tasks
            .get_mut(&task_id)
            .expect("callers pass stored tasks");
        task.finished = true;
        task.dropped = true;
        let iteration_id = task.iteration_id;
        self.iteration_mut(iteration_id)
            .pending_tasks
            .retain(|p| p.task_id != task_id);
        self.update_finished(iteration_id);
    }

    fn client_rounds(
        &mut self,
        client_id: ClientId,
        current_round: u64,
        blocked_round: Option<u64>,
    ) -> Result<Outcome, Rejection> {
        let iteration_id = *self.clients.get(&client_id).ok_or_else(|| {
            Rejection::NotFound(format!("Iteration client id not found: {client_id}"))
        })?;
        let num_consumers = {
            let job_id = self.iterations[&iteration_id].job_id;
            self.jobs[&job_id].options.num_consumers.unwrap_or(0) as usize
        };
        let iteration = self.iteration_mut(iteration_id);
        iteration.round_estimate = iteration.round_estimate.max(current_round);
        let estimate = iteration.round_estimate;
        let Some(pending) = iteration.pending_tasks.front_mut() else {
            return Ok(Outcome::Rounds { block_round: None });
        };
        if current_round >= pending.target_round {
            // This consumer already started the target round: try a later one, exponentially
            // further, until every consumer can hold before it.
            let offset = 2u64 << pending.failures.min(32);
            pending.target_round = estimate + offset;
            pending.failures += 1;
            pending.ready_clients.clear();
        }
        if blocked_round.is_some_and(|b| b <= pending.target_round) {
            pending.ready_clients.insert(client_id);
        }
        if pending.ready_clients.len() >= num_consumers {
            let promoted = iteration
                .pending_tasks
                .pop_front()
                .expect("the front was just read");
            iteration.tasks.push(promoted.task_id);
            let task = self
                .tasks
                .get_mut(&promoted.task_id)
                .expect("pending tasks are stored tasks");
            task.starting_round = promoted.target_round;
        }
        let block_round = self.iterations[&iteration_id]
            .pending_tasks
            .front()
            .map(|p| p.target_round);
        Ok(Outcome::Rounds { block_round })
    }

    fn remove_task(&mut self, task_id: TaskId) -> Result<Outcome, Rejection> {
        let task = self
            .tasks
            .get(&task_id)
            .ok_or_else(|| Rejection::NotFound(format!("Task {task_id} not found")))?;
        let iteration_id = task.iteration_id;
        if !self.coordinated(iteration_id) {
            return Err(Rejection::FailedPrecondition(
                "MaybeRemoveTask called on a non-round-robin task.".into(),
            ));
        }
        if !task.finished {
            self.iteration_mut(iteration_id)
                .tasks
                .retain(|t| *t != task_id);
            self.drop_task(task_id);
        }
        Ok(Outcome::TaskRemoved)
    }

    /// An iteration finishes when every task is finished and at least one reached its end: an
    /// iteration whose every worker was removed waits for a worker to come (back) instead.
    fn update_finished(&mut self, iteration_id: IterationId) {
        let tasks = &self.iterations[&iteration_id].tasks;
        let all_finished = tasks.iter().all(|t| self.tasks[t].finished);
        let one_ended = tasks.iter().any(|t| !self.tasks[t].dropped);
        if all_finished && one_ended {
            self.iteration_mut(iteration_id).finished = true;
        }
    }

    fn garbage_collect(&mut self, iteration_id: IterationId) -> Result<Outcome, Rejection> {
        let iteration = self
            .iterations
            .get(&iteration_id)
            .ok_or_else(|| Rejection::NotFound(format!("Iteration id {iteration_id} not found")))?;
        if iteration.finished || iteration.num_clients > 0 {
            // Decided on an older view; finished iterations are kept, busy ones are not idle.
            return Ok(Outcome::IterationCollected);
        }
        let key = (
            self.jobs[&iteration.job_id].name.clone(),
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
            let task = self.tasks.get_mut(&task_id).expect("iteration tasks exist");
            if !task.finished {
                task.finished = true;
                task.dropped = true;
            }
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

    fn create_task(
        &mut self,
        iteration_id: IterationId,
        worker: &str,
        starting_round: u64,
    ) -> TaskId {
        let id = self.new_task(iteration_id, worker, starting_round);
        self.iteration_mut(iteration_id).tasks.push(id);
        id
    }

    /// A task for a worker joining a coordinated iteration: its worker runs it at once, but
    /// consumers read it only from the round they all agree on (see `client_rounds`).
    fn create_pending_task(&mut self, iteration_id: IterationId, worker: &str) -> TaskId {
        let iteration = &self.iterations[&iteration_id];
        let target_round = iteration.round_estimate + 1;
        let id = self.new_task(iteration_id, worker, target_round);
        self.iteration_mut(iteration_id)
            .pending_tasks
            .push_back(PendingTask {
                task_id: id,
                target_round,
                ready_clients: Default::default(),
                failures: 0,
            });
        id
    }

    fn new_task(&mut self, iteration_id: IterationId, worker: &str, starting_round: u64) -> TaskId {
        let id = TaskId(self.next_task_id);
        self.next_task_id += 1;
        self.tasks.insert(
            id,
            Task {
                id,
                iteration_id,
                worker: worker.to_string(),
                starting_round,
                finished: false,
                dropped: false,
            },
        );
        id
    }

    fn iteration_mut(&mut self, id: IterationId) -> &mut Iteration {
        self.iterations
            .get_mut(&id)
            .expect("ids stored in the state name existing iterations")
    }

    // ---- read-only queries (used by the services after a linearizable read) ----

    pub fn dataset(&self, id: &DatasetId) -> Option<&Dataset> {
        self.datasets.get(id)
    }

    pub fn datasets(&self) -> impl Iterator<Item = &Dataset> {
        self.datasets.values()
    }

    pub fn worker(&self, address: &str) -> Option<&Worker> {
        self.workers.get(address)
    }

    pub fn workers(&self) -> impl Iterator<Item = &Worker> {
        self.workers.values()
    }

    /// The worker's index in the static-sharding worker list; `None` when no list is
    /// configured (a registered worker always has one otherwise).
    pub fn worker_index(&self, address: &str) -> Option<u64> {
        self.worker_indices.index(address)
    }

    /// The static-sharding worker list (placeholders replaced by registered workers).
    pub fn static_workers(&self) -> &[String] {
        self.worker_indices.addresses()
    }

    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    pub fn iteration(&self, id: IterationId) -> Option<&Iteration> {
        self.iterations.get(&id)
    }

    pub fn iterations(&self) -> impl Iterator<Item = &Iteration> {
        self.iterations.values()
    }

    pub fn task(&self, id: TaskId) -> Option<&Task> {
        self.tasks.get(&id)
    }

    /// Clients attached to unfinished iterations (the ones whose liveness matters).
    pub fn active_clients(&self) -> impl Iterator<Item = (ClientId, &Iteration)> {
        self.clients
            .iter()
            .map(|(c, it)| (*c, &self.iterations[it]))
            .filter(|(_, it)| !it.finished)
    }

    /// The iteration a client is attached to.
    pub fn client_iteration(&self, client_id: ClientId) -> Option<&Iteration> {
        self.clients.get(&client_id).map(|id| &self.iterations[id])
    }

    /// Tasks the worker should be running now: unfinished tasks assigned to it.
    pub fn active_tasks_of_worker<'a>(
        &'a self,
        address: &'a str,
    ) -> impl Iterator<Item = &'a Task> + 'a {
        self.tasks
            .values()
            .filter(move |t| t.worker == address && !t.finished)
    }

    /// Whether the worker is registered but lacks a task of a coordinated iteration (its task
    /// there was removed): its next heartbeat registers it again to get a pending task.
    pub fn worker_lacks_coordinated_task(&self, address: &str) -> bool {
        self.workers.contains_key(address)
            && self
                .iterations
                .values()
                .filter(|it| !it.finished && self.coordinated(it.id))
                .any(|it| self.lacks_task(it, address))
    }

    /// The tasks of an iteration in creation order.
    pub fn tasks_of_iteration(&self, iteration: &Iteration) -> Vec<&Task> {
        iteration.tasks.iter().map(|t| &self.tasks[t]).collect()
    }
}
