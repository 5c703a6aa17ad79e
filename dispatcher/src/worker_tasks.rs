//! `WorkerTasks`: the active tasks of every worker, an index the leader derives from the
//! applied state for worker heartbeats. Leader-local and soft: never replicated, rebuilt from
//! the state whenever it is too old.
//!
//! Without it, every waiting worker heartbeat scanned every task for its own after every
//! applied entry: a thousand workers and a hundred thousand tasks made that 10^8 visits per
//! entry. One rebuild serves every heartbeat that reads the index until the state moves on,
//! and rebuilds happen at most once per `REBUILD_INTERVAL`: between two, a heartbeat may read
//! an index older than the latest entry, and then checks again once a rebuild is allowed.
//!
//! Invariant (what keeps replies linearizable): a heartbeat reads an index built at an applied
//! index no older than the one its linearizable read waited for, so its reply reflects a state
//! that existed after the request arrived.

use crate::state::DispatcherState;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Least time between two rebuilds.
const REBUILD_INTERVAL: Duration = Duration::from_millis(20);

#[derive(Default)]
pub struct WorkerTasks {
    /// A std mutex: a rebuild is synchronous (under the state's read lock), never held across
    /// `.await`.
    built: Mutex<Built>,
}

#[derive(Default)]
struct Built {
    /// The applied index the index was built at; `None` before the first build.
    applied: Option<Option<u64>>,
    at: Option<Instant>,
    by_worker: HashMap<String, BTreeSet<u64>>,
}

/// How current an index read was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// Built at the state's applied index.
    Current,
    /// Older than the state, no older than required; current again after `Instant`.
    Behind(Instant),
}

impl WorkerTasks {
    /// Calls `f` with the active (assigned, unfinished) task ids of `worker`, from an index
    /// built at `applied` (the applied index of `state`) or, while rebuilds are rate limited,
    /// at an index no older than `at_least`.
    pub fn with_active<T>(
        &self,
        state: &DispatcherState,
        applied: Option<u64>,
        at_least: Option<u64>,
        worker: &str,
        f: impl FnOnce(&BTreeSet<u64>) -> T,
    ) -> (T, Freshness) {
        let mut built = self.built.lock().expect("worker task index lock poisoned");
        let now = Instant::now();
        let freshness = match (built.applied, built.at) {
            (Some(at_applied), _) if at_applied == applied => Freshness::Current,
            (Some(at_applied), Some(at))
                if at_applied >= at_least && now < at + REBUILD_INTERVAL =>
            {
                Freshness::Behind(at + REBUILD_INTERVAL)
            }
            _ => {
                *built = Built {
                    applied: Some(applied),
                    at: Some(now),
                    by_worker: index(state),
                };
                Freshness::Current
            }
        };
        let empty = BTreeSet::new();
        let active = built.by_worker.get(worker).unwrap_or(&empty);
        (f(active), freshness)
    }
}

/// Every worker's active tasks. Every task is in its iteration's task list or, while it waits
/// for its round, in its pending queue.
fn index(state: &DispatcherState) -> HashMap<String, BTreeSet<u64>> {
    let mut by_worker: HashMap<String, BTreeSet<u64>> = HashMap::new();
    for iteration in state.iterations() {
        let pending = iteration.pending_tasks.iter().map(|p| p.task_id);
        for id in iteration.tasks.iter().copied().chain(pending) {
            let Some(task) = state.task(id) else { continue };
            if task.finished {
                continue;
            }
            match by_worker.get_mut(&task.worker) {
                Some(tasks) => {
                    tasks.insert(id.0);
                }
                None => {
                    by_worker.insert(task.worker.clone(), BTreeSet::from([id.0]));
                }
            }
        }
    }
    by_worker
}

#[cfg(test)]
#[path = "worker_tasks_tests.rs"]
mod tests;
