//! `WorkerState`: the tasks a worker holds, shared by its heartbeat loop and its fetch service,
//! and (as a [`LocalWorker`]) by clients running in the same process.

use crate::task_runner::TaskRunner;
use sluice_rpc::{LocalWorker, TaskId};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

pub struct WorkerState {
    /// The address registered with the dispatcher (the bound address).
    pub address: String,
    /// A std mutex: lookups and inserts only, never held across `.await`.
    inner: Mutex<Tasks>,
    /// Tasks whose end a reader saw, to report to the dispatcher.
    completed: mpsc::UnboundedSender<u64>,
}

#[derive(Default)]
struct Tasks {
    running: HashMap<u64, Arc<TaskRunner>>,
    /// Tasks deleted by the dispatcher (finished): later readers get end of sequence.
    finished: HashSet<u64>,
    /// Tasks whose completion was already queued for reporting.
    reported: HashSet<u64>,
    /// Tasks a client in this process deleted when it went away: later readers get an error,
    /// and the dispatcher's re-sends of them are ignored.
    deleted: HashSet<u64>,
}

impl WorkerState {
    pub fn new(address: String, completed: mpsc::UnboundedSender<u64>) -> Self {
        WorkerState {
            address,
            inner: Mutex::new(Tasks::default()),
            completed,
        }
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, Tasks> {
        self.inner.lock().expect("worker task lock poisoned")
    }

    /// Ids of the tasks held, as reported in heartbeats.
    pub fn task_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.tasks().running.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    pub fn get(&self, task_id: u64) -> Option<Arc<TaskRunner>> {
        self.tasks().running.get(&task_id).cloned()
    }

    pub fn is_finished(&self, task_id: u64) -> bool {
        self.tasks().finished.contains(&task_id)
    }

    pub fn is_deleted(&self, task_id: u64) -> bool {
        self.tasks().deleted.contains(&task_id)
    }

    /// Adds a task the dispatcher assigned, unless it is known already.
    pub fn add(&self, runner: TaskRunner) {
        let mut tasks = self.tasks();
        let id = runner.task_id();
        if !tasks.running.contains_key(&id)
            && !tasks.finished.contains(&id)
            && !tasks.deleted.contains(&id)
        {
            tasks.running.insert(id, Arc::new(runner));
        }
    }

    /// Drops a task the dispatcher no longer assigns to this worker.
    pub fn delete(&self, task_id: u64) {
        let mut tasks = self.tasks();
        if let Some(runner) = tasks.running.remove(&task_id) {
            runner.cancel();
        }
        tasks.finished.insert(task_id);
    }

    /// Drops a task its only reader, a client in this process, no longer reads (tf.data's
    /// `DeleteLocalTask`): the task stops and is reported finished to the dispatcher. A task
    /// not held (finished, or never started here) is left alone.
    pub fn delete_local(&self, task_id: u64) {
        let runner = {
            let mut tasks = self.tasks();
            let runner = tasks.running.remove(&task_id);
            if runner.is_some() {
                tasks.deleted.insert(task_id);
            }
            runner
        };
        if let Some(runner) = runner {
            runner.cancel();
            self.complete(task_id);
        }
    }

    /// Records that a reader saw the task's end; reported to the dispatcher once.
    pub fn complete(&self, task_id: u64) {
        if self.tasks().reported.insert(task_id) {
            let _ = self.completed.send(task_id);
        }
    }

    /// Stops every task (worker shutdown).
    pub fn cancel_all(&self) {
        for runner in self.tasks().running.values() {
            runner.cancel();
        }
    }
}

impl LocalWorker for WorkerState {
    fn delete_local_task(&self, task_id: TaskId) {
        self.delete_local(task_id.0);
    }
}

#[cfg(test)]
#[path = "task_removal_tests.rs"]
mod task_removal_tests;
