//! Tasks: creation, the finish reports of workers, and dropping a task that did not reach its
//! end.

use super::DispatcherState;
use crate::state::changes::Watched;
use crate::state::entities::Task;
use crate::state::Outcome;
use sluice_types::{IterationId, TaskId};

impl DispatcherState {
    /// Unknown ids and ids of other workers are ignored one by one (tf.data aborts the whole
    /// report on the first unknown id, which wedges the worker: tensorflow#52252).
    pub(super) fn finish_tasks(&mut self, worker: &str, task_ids: &[TaskId]) {
        for task_id in task_ids {
            let Some(task) = self.tasks.get_mut(task_id) else {
                continue;
            };
            if task.worker != worker || task.finished {
                continue;
            }
            let iteration_id = task.iteration_id;
            self.mark_finished(*task_id, false);
            self.update_finished(iteration_id);
        }
    }

    /// Fails the iteration of each of `worker`'s `task_ids` that is neither finished nor failed
    /// already: it records why, and drops the iteration's unfinished tasks (their workers stop
    /// them; `lacks_task` gives no worker a new one).
    pub(super) fn fail_crashed_tasks(
        &mut self,
        worker: &str,
        task_ids: &[TaskId],
        signal: &str,
    ) -> Outcome {
        let mut failed = Vec::new();
        for task_id in task_ids {
            let Some(task) = self.tasks.get(task_id) else {
                continue;
            };
            if task.worker != worker {
                continue;
            }
            let iteration_id = task.iteration_id;
            let Some(iteration) = self.iterations.get_mut(&iteration_id) else {
                continue;
            };
            if iteration.finished || self.iteration_failures.contains_key(&iteration_id) {
                continue;
            }
            self.iteration_failures.insert(
                iteration_id,
                format!(
                    "task {task_id} of iteration {iteration_id} crashed worker {worker} (signal \
                     {signal}); the iteration is failed rather than run on another worker"
                ),
            );
            let unfinished = self.unfinished_tasks(iteration_id);
            self.changes.touch(Watched::Iteration(iteration_id));
            for task in unfinished {
                self.drop_task(task);
            }
            failed.push(iteration_id);
        }
        Outcome::IterationsFailed { iterations: failed }
    }

    /// The tasks of `iteration_id`, pending ones included, that have not finished.
    pub(super) fn unfinished_tasks(&self, iteration_id: IterationId) -> Vec<TaskId> {
        let Some(iteration) = self.iterations.get(&iteration_id) else {
            return Vec::new();
        };
        iteration
            .tasks
            .iter()
            .chain(iteration.pending_tasks.iter().map(|p| &p.task_id))
            .copied()
            .filter(|t| self.tasks.get(t).is_some_and(|t| !t.finished))
            .collect()
    }

    /// Ends a task that did not reach its end: it leaves its iteration's pending queue, and its
    /// iteration may now be finished.
    pub(super) fn drop_task(&mut self, task_id: TaskId) {
        let Some(iteration_id) = self.tasks.get(&task_id).map(|t| t.iteration_id) else {
            return;
        };
        self.mark_finished(task_id, true);
        self.iteration_mut(iteration_id)
            .pending_tasks
            .retain(|p| p.task_id != task_id);
        self.update_finished(iteration_id);
    }

    /// Marks an unfinished task finished (`dropped`: without reaching its end) and takes it
    /// out of its worker's unfinished tasks.
    pub(super) fn mark_finished(&mut self, task_id: TaskId, dropped: bool) {
        let Some(task) = self.tasks.get_mut(&task_id) else {
            return;
        };
        if task.finished {
            return;
        }
        task.finished = true;
        task.dropped = dropped;
        self.changes.touch(Watched::Worker(task.worker.clone()));
        if let Some(tasks) = self.worker_tasks.get_mut(&task.worker) {
            tasks.remove(&task_id);
            if tasks.is_empty() {
                self.worker_tasks.remove(&task.worker);
            }
        }
    }

    pub(super) fn create_task(
        &mut self,
        iteration_id: IterationId,
        worker: &str,
        starting_round: u64,
    ) -> TaskId {
        let id = self.new_task(iteration_id, worker, starting_round);
        self.iteration_mut(iteration_id).tasks.push(id);
        self.start_lineage(iteration_id, id, worker);
        id
    }

    pub(super) fn new_task(
        &mut self,
        iteration_id: IterationId,
        worker: &str,
        starting_round: u64,
    ) -> TaskId {
        let id = TaskId(self.next_task_id);
        self.next_task_id = self.next_task_id.saturating_add(1);
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
        self.changes.touch(Watched::Worker(worker.to_string()));
        self.worker_tasks
            .entry(worker.to_string())
            .or_default()
            .insert(id);
        id
    }
}
