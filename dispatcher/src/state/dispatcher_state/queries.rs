//! Read-only queries of the state, used by the services after a linearizable read.

use super::DispatcherState;
use crate::state::changes::Changes;
use crate::state::entities::{Dataset, Iteration, Job, Task, Worker};
use serde::Serialize;
use sluice_types::{ClientId, DatasetId, IterationId, JobId, TaskId};
use std::collections::BTreeSet;
use std::ops::Bound;

/// Counts of what the state holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StateSizes {
    pub datasets: usize,
    pub definitions: usize,
    pub definition_bytes: usize,
    pub workers: usize,
    pub jobs: usize,
    pub iterations: usize,
    pub clients: usize,
    pub tasks: usize,
    pub recorded_outcomes: usize,
    pub requesters: usize,
}

impl DispatcherState {
    pub fn dataset(&self, id: &DatasetId) -> Option<&Dataset> {
        self.datasets.get(id)
    }

    pub fn datasets(&self) -> impl Iterator<Item = &Dataset> {
        self.datasets.values()
    }

    /// Datasets in id order, after `after` (all with `None`): a page of them.
    pub fn datasets_after<'a>(
        &'a self,
        after: Option<&DatasetId>,
    ) -> impl Iterator<Item = &'a Dataset> + 'a {
        let start = after.map_or(Bound::Unbounded, |id| Bound::Excluded(id.clone()));
        self.datasets
            .range((start, Bound::Unbounded))
            .map(|(_, d)| d)
    }

    /// Workers in address order, after `after`.
    pub fn workers_after<'a>(
        &'a self,
        after: Option<&str>,
    ) -> impl Iterator<Item = &'a Worker> + 'a {
        let start = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.to_string()));
        self.workers
            .range((start, Bound::Unbounded))
            .map(|(_, w)| w)
    }

    /// Jobs in id order, after `after`.
    pub fn jobs_after(&self, after: Option<JobId>) -> impl Iterator<Item = &Job> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.jobs.range((start, Bound::Unbounded)).map(|(_, j)| j)
    }

    /// Iterations in id order, after `after`.
    pub fn iterations_after(&self, after: Option<IterationId>) -> impl Iterator<Item = &Iteration> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.iterations
            .range((start, Bound::Unbounded))
            .map(|(_, it)| it)
    }

    pub fn worker(&self, address: &str) -> Option<&Worker> {
        self.workers.get(address)
    }

    /// The identity `address` belongs to: its registered worker's owner, or the owner of the
    /// worker last registered there if it was removed and its identity has not come back.
    pub fn address_owner(&self, address: &str) -> Option<&str> {
        self.workers
            .get(address)
            .map(|w| w.owner.as_str())
            .or_else(|| self.departed_workers.get(address).map(String::as_str))
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

    /// Why iteration `id` was failed (one of its tasks crashed its worker); `None` while it
    /// was not.
    pub fn iteration_failure(&self, id: IterationId) -> Option<&str> {
        self.iteration_failures.get(&id).map(String::as_str)
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

    /// What the entries applied since the last take touched (see `Changes`).
    pub fn changes(&self) -> &Changes {
        &self.changes
    }

    /// The iteration a client is attached to.
    pub fn client_iteration(&self, client_id: ClientId) -> Option<&Iteration> {
        self.clients.get(&client_id).map(|id| &self.iterations[id])
    }

    /// The tasks the worker should be running now: its unfinished tasks, all stored (the
    /// state's index of them, so a worker's heartbeat looks up none of its tasks).
    pub fn active_tasks_of_worker(&self, address: &str) -> &BTreeSet<TaskId> {
        static NONE: BTreeSet<TaskId> = BTreeSet::new();
        self.worker_tasks.get(address).unwrap_or(&NONE)
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

    /// A stored dataset definition (the prost encoding of its `DatasetDef`).
    pub fn dataset_def(&self, dataset: &Dataset) -> Option<&[u8]> {
        self.definitions
            .get(&dataset.definition)
            .map(|d| d.bytes.as_slice())
    }

    /// What the state holds, for status and the bounded-state checks.
    pub fn sizes(&self) -> StateSizes {
        StateSizes {
            datasets: self.datasets.len(),
            definitions: self.definitions.len(),
            definition_bytes: self.definitions.values().map(|d| d.bytes.len()).sum(),
            workers: self.workers.len(),
            jobs: self.jobs.len(),
            iterations: self.iterations.len(),
            clients: self.clients.len(),
            tasks: self.tasks.len(),
            recorded_outcomes: self.requests.len(),
            requesters: self.requests.requesters(),
        }
    }

    /// The tasks of an iteration in creation order.
    pub fn tasks_of_iteration(&self, iteration: &Iteration) -> Vec<&Task> {
        iteration.tasks.iter().map(|t| &self.tasks[t]).collect()
    }
}
