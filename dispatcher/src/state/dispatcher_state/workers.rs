//! Registering and removing workers: a (re)registered worker gets a task in every unfinished
//! iteration it lacks one in; a removed worker's unfinished tasks are dropped.
//!
//! An address belongs to the identity that registered it (the name it authenticated as), while
//! it is registered and after its worker was removed, so that another worker's credential
//! cannot take it while its worker is down; the identity's next registration, at that address
//! or another, releases its departed addresses.

use super::DispatcherState;
use crate::state::changes::Watched;
use crate::state::entities::{Iteration, Worker};
use crate::state::update::{Outcome, Rejection};
use sluice_types::{IterationId, TaskId};

impl DispatcherState {
    pub(super) fn register_worker(
        &mut self,
        address: &str,
        tags: &[String],
        worker_addresses: &[String],
        owner: &str,
    ) -> Result<Outcome, Rejection> {
        if let Some(registered) = self.workers.get(address) {
            if registered.owner != owner {
                return Err(Rejection::PermissionDenied(format!(
                    "worker address {address} is registered by '{}', not '{owner}'",
                    registered.owner
                )));
            }
        }
        if let Some(departed) = self.departed_workers.get(address) {
            if departed != owner {
                return Err(Rejection::PermissionDenied(format!(
                    "worker address {address} belongs to worker '{departed}', which registered \
                     it and is down; '{owner}' may not take it"
                )));
            }
        }
        self.worker_indices.record_config(worker_addresses)?;
        self.worker_indices.add_worker(address)?;
        // The identity is back: the addresses its departed registrations held are its no more
        // (a re-registration replaces the old one, wherever it was).
        if !owner.is_empty() {
            self.departed_workers
                .retain(|_, departed| departed != owner);
        }
        self.changes.touch(Watched::Worker(address.to_string()));
        self.workers.insert(
            address.to_string(),
            Worker {
                address: address.to_string(),
                tags: tags.to_vec(),
                owner: owner.to_string(),
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
        // Lineages waiting for a worker may run here now.
        self.assign_ready_lineages();
        Ok(Outcome::WorkerRegistered { tasks })
    }

    /// Whether `worker` should get a task of the iteration: it is unfinished and every task the
    /// worker had in it was dropped (worker removed, task removed) or there was none. A task
    /// that ended normally is not run again.
    pub(super) fn lacks_task(&self, iteration: &Iteration, worker: &str) -> bool {
        let pending = iteration
            .pending_tasks
            .iter()
            .map(|p| p.task_id)
            .chain(iteration.tasks.iter().copied());
        // A static shard read by a lineage is read wherever the lineage runs now.
        let shard_read_elsewhere = self
            .jobs
            .get(&iteration.job_id)
            .is_some_and(|job| job.sharding.is_static())
            && self.shard_taken(iteration.id, worker);
        !iteration.finished
            && !self.iteration_failures.contains_key(&iteration.id)
            && !shard_read_elsewhere
            && !pending
                .map(|t| &self.tasks[&t])
                .any(|t| t.worker == worker && !t.dropped)
    }

    pub(super) fn remove_worker(&mut self, address: &str) {
        let Some(removed) = self.workers.remove(address) else {
            return;
        };
        if !removed.owner.is_empty() {
            self.departed_workers
                .insert(address.to_string(), removed.owner);
        }
        self.changes.touch(Watched::Worker(address.to_string()));
        self.exactly_once.incarnations.remove(address);
        // Lineages move first, so that dropping their tasks does not end their iterations.
        self.move_lineages_of_worker(address);
        let dropped: Vec<TaskId> = self
            .active_tasks_of_worker(address)
            .iter()
            .copied()
            .collect();
        for task_id in dropped {
            self.drop_task(task_id);
        }
        self.assign_ready_lineages();
    }
}
