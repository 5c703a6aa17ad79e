//! `WorkerState`: the tasks a worker holds, shared by its heartbeat loop and its fetch service,
//! and (as a [`LocalWorker`]) by clients running in the same process; and the ledgers of what
//! each task's readers were sent and have not acknowledged (see `reader_ledger`).
//!
//! A ledger outlives the streams that fill it (a reader whose connection broke reconnects to
//! it) and its task's runner (a reader may reconnect after the task ended, to get what it had
//! not received and the end). It goes when its reader acknowledged the end, when the task is
//! deleted for its reader, or, for a finished task, once nothing used it for `LEDGER_TTL` (a
//! reader that received the end but whose last acknowledgement was lost).
//!
//! Admissions: the state keeps the cluster's fetch key, the latest the dispatcher sent, and the
//! iteration of every task it was given, so that a reader's admission to a task's iteration
//! is checked here, before anything of the task is served (`check_admission`).

use crate::error::WorkerError;
use crate::reader_ledger::ReaderLedger;
use crate::task_runner::TaskRunner;
use crate::worker_stats::WorkerStats;
use sluice_rpc::LocalWorker;
use sluice_security::FetchKey;
use sluice_types::TaskId;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};

/// How long a finished task's ledger is kept after its last use.
const LEDGER_TTL: Duration = Duration::from_secs(600);

/// Whose ledger: a task, a reader (its iteration client id) and, for cross-trainer cache jobs,
/// the trainer whose cursor the reader reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LedgerKey {
    pub task_id: u64,
    pub client_id: u64,
    pub trainer_id: String,
}

/// A ledger, shared by the streams of its reader. A std mutex: held to record, acknowledge or
/// copy out one message, never across `.await`.
pub type SharedLedger = Arc<Mutex<ReaderLedger>>;

struct LedgerEntry {
    ledger: SharedLedger,
    last_used: Instant,
}

/// How long an exactly-once task's completion waits for its readers' acknowledgements at most
/// (a reader silent that long is gone).
const END_ACK_GRACE: Duration = Duration::from_secs(30);
/// It looks again at every acknowledgement and recorded message, and at least this often.
const ACK_POLL: Duration = Duration::from_millis(20);

pub struct WorkerState {
    /// The address registered with the dispatcher (the bound address).
    pub address: String,
    /// A std mutex: lookups and inserts only, never held across `.await`.
    inner: Mutex<Tasks>,
    /// Tasks whose end a reader saw, to report to the dispatcher.
    completed: mpsc::UnboundedSender<u64>,
    /// This process's number, different from any other run's: sequence numbers count in it, so
    /// a reader tells a restarted worker (which numbers from 0 again) from a resumed stream.
    pub incarnation: u64,
    /// A std mutex: lookups and inserts only, never held across `.await`.
    ledgers: Mutex<HashMap<LedgerKey, LedgerEntry>>,
    /// Elements and bytes served, pipeline time (for `/metrics`).
    pub stats: Arc<WorkerStats>,
    /// The cluster's fetch key, as the dispatcher's last heartbeat reply gave it (`None` until
    /// one did). A std lock: read or replaced, never held across `.await`.
    fetch_key: RwLock<Option<FetchKey>>,
    /// Told when a reader acknowledges elements or a stream records what it took: what an
    /// exactly-once task's end waits for.
    progress: Arc<Notify>,
    /// Told when the dispatcher recorded completions (`confirm`), and when the worker stops.
    confirmations: Notify,
    /// Set when the worker stops: nothing it has not reported will be confirmed any more.
    stopping: std::sync::atomic::AtomicBool,
    /// `WorkerConfig::compress_local_readers`: readers on this machine count as elsewhere.
    compress_local_readers: bool,
    /// `WorkerConfig::share_memory_with_local_readers`.
    share_memory: bool,
}

#[derive(Default)]
struct Tasks {
    running: HashMap<u64, Arc<TaskRunner>>,
    /// Tasks deleted by the dispatcher (finished): later readers get end of sequence.
    finished: HashSet<u64>,
    /// Tasks whose completion was already queued for reporting.
    reported: HashSet<u64>,
    /// Tasks whose completion the dispatcher recorded.
    confirmed: HashSet<u64>,
    /// Tasks a client in this process deleted when it went away: later readers get an error,
    /// and the dispatcher's re-sends of them are ignored.
    deleted: HashSet<u64>,
    /// The iteration of every task added, kept after it finished or was deleted (a reader may
    /// come back for what it had not received), as `finished` is.
    iterations: HashMap<u64, u64>,
}

impl WorkerState {
    pub fn new(address: String, completed: mpsc::UnboundedSender<u64>) -> Self {
        WorkerState {
            address,
            inner: Mutex::new(Tasks::default()),
            completed,
            // Never 0, which means "none" on the wire.
            incarnation: rand::random::<u64>().max(1),
            ledgers: Mutex::new(HashMap::new()),
            stats: Arc::default(),
            fetch_key: RwLock::new(None),
            progress: Arc::new(Notify::new()),
            confirmations: Notify::new(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            compress_local_readers: false,
            share_memory: true,
        }
    }

    /// The same, compressing for readers on this machine too (see
    /// `WorkerConfig::compress_local_readers`).
    pub fn compressing_local_readers(mut self, compress: bool) -> Self {
        self.compress_local_readers = compress;
        self
    }

    /// The same, offering readers on this machine a shared memory region or not (see
    /// `WorkerConfig::share_memory_with_local_readers`).
    pub fn sharing_memory(mut self, share: bool) -> Self {
        self.share_memory = share;
        self
    }

    /// Whether raw fetch streams from readers on this machine may use a shared memory region.
    pub fn shares_memory(&self) -> bool {
        self.share_memory
    }

    /// A reader, on this machine (`same_host`) or not, reads `runner`'s task: one from
    /// elsewhere (or any, with `compress_local_readers`) turns on its `Auto` compression (see
    /// `TaskBuffer::reader_elsewhere`).
    pub fn reader_of(&self, runner: &TaskRunner, same_host: bool) {
        if !same_host || self.compress_local_readers {
            runner.buffer().reader_elsewhere();
        }
    }

    /// Keeps `key`, the cluster's fetch key as the dispatcher sent it.
    pub fn set_fetch_key(&self, key: FetchKey) {
        *self.fetch_key.write().expect("fetch key lock poisoned") = Some(key);
    }

    /// Whether `admission` admits client `client_id` to the iteration of task `task_id`: the
    /// check before anything of the task is served to a reader. A task this worker was never
    /// given passes (nothing of it can be served; the caller answers as for any unknown
    /// task). Refused: no admission, or one that is not the dispatcher's for this client and
    /// iteration (`PermissionDenied`); a worker that has no fetch key yet refuses everyone
    /// with `Unavailable`, which readers retry.
    pub fn check_admission(
        &self,
        task_id: u64,
        client_id: u64,
        admission: &[u8],
    ) -> Result<(), WorkerError> {
        let Some(iteration_id) = self.tasks().iterations.get(&task_id).copied() else {
            return Ok(());
        };
        let key = self.fetch_key.read().expect("fetch key lock poisoned");
        let Some(key) = key.as_ref() else {
            return Err(WorkerError::NoFetchKey { task_id });
        };
        key.verify(iteration_id, client_id, admission)
            .map_err(|refusal| WorkerError::NotAdmitted {
                task_id,
                iteration_id,
                client_id,
                refusal,
            })
    }

    fn ledgers(&self) -> std::sync::MutexGuard<'_, HashMap<LedgerKey, LedgerEntry>> {
        self.ledgers.lock().expect("worker ledger lock poisoned")
    }

    /// The reader's ledger, made when it has none. Also drops the ledgers of finished tasks
    /// unused for `LEDGER_TTL`.
    pub fn ledger(&self, key: LedgerKey) -> SharedLedger {
        let now = Instant::now();
        let finished: HashSet<u64> = {
            let ledgers = self.ledgers();
            let stale: Vec<u64> = ledgers
                .iter()
                .filter(|(_, e)| now.duration_since(e.last_used) >= LEDGER_TTL)
                .map(|(k, _)| k.task_id)
                .collect();
            drop(ledgers);
            let tasks = self.tasks();
            stale
                .into_iter()
                .filter(|id| tasks.finished.contains(id))
                .collect()
        };
        let mut ledgers = self.ledgers();
        if !finished.is_empty() {
            ledgers.retain(|k, e| {
                !finished.contains(&k.task_id) || now.duration_since(e.last_used) < LEDGER_TTL
            });
        }
        let entry = ledgers.entry(key).or_insert_with(|| LedgerEntry {
            ledger: SharedLedger::default(),
            last_used: now,
        });
        entry.last_used = now;
        entry.ledger.clone()
    }

    /// The reader's ledger, if it has one.
    pub fn existing_ledger(&self, key: &LedgerKey) -> Option<SharedLedger> {
        self.ledgers().get(key).map(|e| e.ledger.clone())
    }

    /// Drops `ledger` (its reader acknowledged everything up to the task's end), unless a
    /// newer one took its place.
    pub fn forget_ledger(&self, key: &LedgerKey, ledger: &SharedLedger) {
        let mut ledgers = self.ledgers();
        if ledgers
            .get(key)
            .is_some_and(|e| Arc::ptr_eq(&e.ledger, ledger))
        {
            ledgers.remove(key);
        }
    }

    /// Ledgers held, for tests.
    #[cfg(test)]
    pub fn ledger_count(&self) -> usize {
        self.ledgers().len()
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
            tasks.iterations.insert(id, runner.iteration_id());
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
            // Its reader is gone: nobody will acknowledge what it was sent.
            self.ledgers().retain(|k, _| k.task_id != task_id);
        }
    }

    /// Records that a reader saw the task's end; reported to the dispatcher once.
    pub fn complete(&self, task_id: u64) {
        if self.tasks().reported.insert(task_id) {
            let _ = self.completed.send(task_id);
        }
    }

    /// Records that the dispatcher took the completions of `task_ids`.
    pub fn confirm(&self, task_ids: &[u64]) {
        self.tasks().confirmed.extend(task_ids);
        self.confirmations.notify_waiters();
    }

    /// Waits until the dispatcher recorded the completion of `task_id` (queued by
    /// `complete`); false if the worker stops first.
    pub async fn until_reported(&self, task_id: u64) -> bool {
        loop {
            let confirmed = self.confirmations.notified();
            tokio::pin!(confirmed);
            // Registered before looking, so a confirmation in between is not missed.
            confirmed.as_mut().enable();
            if self.tasks().confirmed.contains(&task_id) {
                return true;
            }
            if self.stopping.load(std::sync::atomic::Ordering::Acquire) {
                return false;
            }
            confirmed.await;
        }
    }

    /// Wakes what waits for readers' acknowledgements (`complete_when_acknowledged`).
    pub(crate) fn progress(&self) {
        self.progress.notify_waiters();
    }

    /// What [`WorkerState::progress`] notifies, for the streams that acknowledge.
    pub(crate) fn progress_notify(&self) -> Arc<Notify> {
        self.progress.clone()
    }

    /// `complete` for an exactly-once task: reported once every element its streams took is
    /// recorded in a reader's ledger and every reader acknowledged what it was sent of the
    /// task, or after `END_ACK_GRACE`. A task reported finished is not moved when its worker
    /// dies, so what a reader had not received yet would be lost with it. It looks at once,
    /// then again at every acknowledgement or recorded message (`progress`), so the end is
    /// reported as soon as the last acknowledgement arrives.
    pub fn complete_when_acknowledged(self: &Arc<Self>, runner: Arc<TaskRunner>) {
        let task_id = runner.task_id();
        if !self.tasks().reported.insert(task_id) {
            return;
        }
        let state = self.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + END_ACK_GRACE;
            loop {
                let progress = state.progress.notified();
                tokio::pin!(progress);
                // Registered before looking, so a notification in between is not missed.
                progress.as_mut().enable();
                // Taken elements first: a stream that took the task's last elements just
                // before the end was taken records them in its ledger right after.
                let settled = runner.unrecorded() == 0 && state.unacknowledged(task_id) == 0;
                if settled || Instant::now() >= deadline {
                    break;
                }
                let _ = tokio::time::timeout(ACK_POLL, progress).await;
            }
            let _ = state.completed.send(task_id);
        });
    }

    /// Elements of `task_id` sent to readers and not acknowledged.
    fn unacknowledged(&self, task_id: u64) -> u64 {
        self.ledgers()
            .iter()
            .filter(|(key, _)| key.task_id == task_id)
            .map(|(_, e)| e.ledger.lock().map_or(0, |l| l.unacked()))
            .sum()
    }

    /// Stops every task (worker shutdown).
    pub fn cancel_all(&self) {
        for runner in self.tasks().running.values() {
            runner.cancel();
        }
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
        self.confirmations.notify_waiters();
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

#[cfg(test)]
#[path = "task_end_tests.rs"]
mod task_end_tests;
