//! Coordinated reads: pending tasks joining at a round every consumer agreed to hold before, and
//! the removal of a task every consumer gave up on in the same round.

use super::{DispatcherState, FIRST_TASK_ID};
use crate::state::entities::PendingTask;
use crate::state::update::{Outcome, Rejection};
use sluice_types::{ClientId, IterationId, TaskId};

/// The largest round a client may report (2^62).
pub const MAX_ROUND: u64 = 1 << 62;

/// Rounds count elements read, one per round: far below [`MAX_ROUND`], which keeps every target
/// round computed from them (estimate + 2^33 at most) from overflowing. The leader checks this
/// before proposing, and `apply` again.
pub fn check_rounds(current_round: u64, blocked_round: Option<u64>) -> Result<(), Rejection> {
    for (name, round) in [
        ("current_round", Some(current_round)),
        ("blocked_round", blocked_round),
    ] {
        if let Some(round) = round.filter(|r| *r > MAX_ROUND) {
            return Err(Rejection::InvalidArgument(format!(
                "{name} {round} is past the largest round, {MAX_ROUND}"
            )));
        }
    }
    Ok(())
}

impl DispatcherState {
    pub(super) fn client_rounds(
        &mut self,
        client_id: ClientId,
        current_round: u64,
        blocked_round: Option<u64>,
    ) -> Result<Outcome, Rejection> {
        let iteration_id = *self.clients.get(&client_id).ok_or_else(|| {
            Rejection::NotFound(format!("Iteration client id not found: {client_id}"))
        })?;
        check_rounds(current_round, blocked_round)?;
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
            pending.failures = pending.failures.saturating_add(1);
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

    pub(super) fn remove_task(&mut self, task_id: TaskId) -> Result<Outcome, Rejection> {
        let Some(task) = self.tasks.get(&task_id) else {
            // Task ids are never reused: one below the next id existed and was removed (by an
            // earlier `RemoveTask`, or with its iteration).
            return if task_id.0 < self.next_task_id && task_id.0 >= FIRST_TASK_ID {
                Ok(Outcome::TaskRemoved)
            } else {
                Err(Rejection::NotFound(format!("Task {task_id} not found")))
            };
        };
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
            // Out of its iteration, nothing refers to it any more.
            self.tasks.remove(&task_id);
        }
        Ok(Outcome::TaskRemoved)
    }

    /// A task for a worker joining a coordinated iteration: its worker runs it at once, but
    /// consumers read it only from the round they all agree on (see `client_rounds`).
    pub(super) fn create_pending_task(
        &mut self,
        iteration_id: IterationId,
        worker: &str,
    ) -> TaskId {
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
}
