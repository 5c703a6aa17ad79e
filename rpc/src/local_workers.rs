//! `LocalWorkers`: the workers running in this process (tf.data's `LocalWorkers`), by address.
//!
//! A worker started in a training process registers here, and a client in the same process
//! uses the registry twice: to choose which tasks to read (`target_workers`: `LOCAL` reads only
//! tasks of registered workers, `AUTO` skips tasks of workers tagged `COLOCATED` unless they
//! are registered), and, when it goes away, to delete the tasks only it was reading straight
//! from the worker, without a round trip through the dispatcher.
//!
//! The registry lives here, below both, because worker and client do not know each other: a
//! worker registers itself through the [`LocalWorker`] trait, a client looks it up by address.
//! It is process-wide state ([`LocalWorkers::global`]): tests that need an empty one run in their
//! own process (cargo nextest runs each test in one).

use sluice_types::TaskId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// What a client may ask of a worker running in its process.
pub trait LocalWorker: Send + Sync {
    /// Deletes a task that only this process's client reads: the worker stops it, reports it
    /// finished to the dispatcher, and answers later readers of it with tf.data's "which has been
    /// deleted" error.
    fn delete_local_task(&self, task_id: TaskId);
}

/// The registry of in-process workers; [`LocalWorkers::global`] is the process's one.
#[derive(Default)]
pub struct LocalWorkers {
    /// A std mutex: lookups and inserts only, never held across an `.await`.
    workers: Mutex<HashMap<String, Arc<dyn LocalWorker>>>,
}

impl LocalWorkers {
    /// The registry workers and clients of this process share.
    pub fn global() -> &'static LocalWorkers {
        static REGISTRY: OnceLock<LocalWorkers> = OnceLock::new();
        REGISTRY.get_or_init(LocalWorkers::default)
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<dyn LocalWorker>>> {
        self.workers
            .lock()
            .expect("local worker registry lock poisoned")
    }

    /// Registers the worker serving at `address` (a restarted worker replaces its old entry).
    pub fn add(&self, address: &str, worker: Arc<dyn LocalWorker>) {
        self.workers().insert(address.to_string(), worker);
    }

    /// Unregisters `worker`, if it is still the one registered at `address` (a worker restarted
    /// at the same address may have replaced it already).
    pub fn remove(&self, address: &str, worker: &Arc<dyn LocalWorker>) {
        let mut workers = self.workers();
        if workers
            .get(address)
            .is_some_and(|registered| Arc::ptr_eq(registered, worker))
        {
            workers.remove(address);
        }
    }

    /// The worker at `address`, if it runs in this process.
    pub fn get(&self, address: &str) -> Option<Arc<dyn LocalWorker>> {
        self.workers().get(address).cloned()
    }

    pub fn contains(&self, address: &str) -> bool {
        self.workers().contains_key(address)
    }

    pub fn is_empty(&self) -> bool {
        self.workers().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Default)]
    struct Recorder(AtomicU64);

    impl LocalWorker for Recorder {
        fn delete_local_task(&self, task_id: TaskId) {
            self.0.store(task_id.0, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_replaced_worker_does_not_unregister_its_successor() {
        let old: Arc<dyn LocalWorker> = Arc::new(Recorder::default());
        let new = Arc::new(Recorder::default());
        let new_dyn: Arc<dyn LocalWorker> = new.clone();
        let registry = LocalWorkers::default();
        registry.add("w:1", old.clone());
        registry.add("w:1", new_dyn.clone());
        registry.remove("w:1", &old);
        assert!(registry.contains("w:1"));
        registry
            .get("w:1")
            .expect("registered")
            .delete_local_task(TaskId(7));
        assert_eq!(new.0.load(Ordering::Relaxed), 7);
        registry.remove("w:1", &new_dyn);
        assert!(registry.is_empty());
    }
}
