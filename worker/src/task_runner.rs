//! `TaskRunner`: one task's pipeline, run on its own thread, feeding a bounded buffer that every
//! reader of the task shares first-come-first-served.
//!
//! The pipeline starts on the first read (as tf.data's lazy task initialization), so a task no
//! client reads never leases splits. Elements are encoded (and compressed) on the pipeline
//! thread, off the async runtime, into a `TaskBuffer` that readers take chunks from. The end of
//! the buffer (pipeline ended, buffer empty) is the task's end of sequence; a pipeline error is
//! kept and reported to every later reader.
//!
//! Files are opened only below this worker's own data roots, checked again before each open:
//! the dispatcher checked its roots at registration, but they need not be this worker's. A
//! refused file is the task's pipeline error, naming the path and the roots.
//!
//! The task names its dataset by id: the definition is fetched from the dispatcher when the
//! pipeline starts, on the pipeline thread (see `definition_fetch`); a failed fetch is the
//! task's pipeline error.
//!
//! Static sharding (FILE, DATA, FILE_OR_DATA, HINT) happens here too, when the pipeline starts:
//! the definition is rewritten with `auto_shard` for shard `worker_index` of `num_workers`
//! (tf.data's `AutoShardRewriter` at task initialization). A failed rewrite is the task's
//! pipeline error.
//!
//! A deleted task stops within one upstream element whatever its pipeline does: the task's
//! cancellation flag reaches every op through `ExecOptions`, so a filter that drops everything
//! stops too. Its buffering ops hold their elements against the worker's memory budget, shared
//! by every task; an op past it fails its own task only.

use crate::config::WorkerConfig;
use crate::cross_trainer_cache::CrossTrainerCache;
use crate::definition_fetch::fetch_definition;
use crate::index_list::IndexList;
use crate::replay::ReplaySupplier;
use crate::round_robin::RoundRobin;
use crate::split_leaser::SplitLeaser;
use crate::task_buffer::{Producer, TaskBuffer};
use crate::task_failure::TaskFailure;
use crate::worker_stats::WorkerStats;
use bytes::BytesMut;
use sluice_element::{pb as dpb, Cancellation, Compression, DatasetError, PythonRunner};
use sluice_executor::{ExecOptions, MemoryBudget, MemoryShare, Reservation, SplitSupplier};
use sluice_formats::{DataRoots, FileAccess};
use sluice_pipeline::AutoShardPolicy;
use sluice_proto::dispatcher::TaskDef;
use sluice_rpc::{DispatcherClient, FromProto};
use sluice_types::{IndexRuns, InvalidValue, IterationId, ShardingPolicy, TaskId};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::runtime::Handle;
use tracing::{debug, warn};

/// What a worker shares with every task it runs.
#[derive(Clone)]
pub struct TaskResources {
    /// This worker's canonical data roots.
    pub data_roots: DataRoots,
    /// The worker's Python executors, for pipelines with Python functions.
    pub python: Option<Arc<dyn PythonRunner>>,
    /// The bytes all tasks' buffers may hold together (`--memory-budget`).
    pub memory: Arc<MemoryBudget>,
    /// Where pipeline time is counted.
    pub stats: Arc<WorkerStats>,
}

pub struct TaskRunner {
    def: TaskDef,
    client: DispatcherClient,
    runtime: Handle,
    config: WorkerConfig,
    /// This worker's address (for lease events).
    worker: String,
    resources: TaskResources,
    /// The buffer, created with the thread on first read.
    buffer: OnceLock<Arc<TaskBuffer>>,
    /// Coordinated reads: the round server over the buffer, created on first use.
    round_robin: OnceLock<Arc<RoundRobin>>,
    /// Cross-trainer cache jobs: the window over the buffer, created on first use.
    cache: OnceLock<Arc<CrossTrainerCache>>,
    /// This task's share of the worker's memory budget, for its pipeline's buffers and its
    /// cross-trainer cache.
    memory: Arc<MemoryShare>,
    /// Set when the task is deleted: every op of the pipeline checks it (`Cancellation`).
    cancelled: Arc<AtomicBool>,
    /// Disconnected once the pipeline thread has ended (its sender lives in the thread).
    ended: Mutex<Option<Receiver<()>>>,
    /// The pipeline's error, once seen by a reader, for every later reader; shared with the
    /// memory share's give-back call, which fails the task from another task's thread.
    error: Arc<Mutex<Option<TaskFailure>>>,
    /// Exactly-once tasks: the indices of the stream's elements that its readers received
    /// from earlier tasks of the stream (skipped here); `None` for other tasks.
    skip: Option<Arc<IndexRuns>>,
    /// Elements streams took from the buffer and have not yet recorded in their readers'
    /// ledgers: while there are any, a reader may still be sent elements the ledgers do not
    /// show yet, so an exactly-once task does not report its end.
    unrecorded: AtomicU64,
}

impl TaskRunner {
    pub fn new(
        def: TaskDef,
        client: DispatcherClient,
        runtime: Handle,
        config: WorkerConfig,
        worker: String,
        resources: TaskResources,
    ) -> Self {
        let memory = resources.memory.share(format!(
            "task {} (iteration {})",
            def.task_id, def.iteration_id
        ));
        let skip = def.exactly_once.then(|| {
            let runs = IndexRuns::from_runs(def.skip_runs.chunks_exact(2).map(|r| (r[0], r[1])));
            #[cfg(feature = "planted-resume-bug")]
            let runs = planted_resume_bug(runs);
            Arc::new(runs)
        });
        TaskRunner {
            memory,
            skip,
            def,
            client,
            runtime,
            config,
            worker,
            resources,
            buffer: OnceLock::new(),
            round_robin: OnceLock::new(),
            cache: OnceLock::new(),
            cancelled: Arc::new(AtomicBool::new(false)),
            ended: Mutex::new(None),
            error: Arc::new(Mutex::new(None)),
            unrecorded: AtomicU64::new(0),
        }
    }

    pub fn task_id(&self) -> u64 {
        self.def.task_id
    }

    /// Whether the task's elements are delivered exactly once (a lineage's).
    pub fn exactly_once(&self) -> bool {
        self.skip.is_some()
    }

    /// The stream indices of `n` elements taken from the buffer after `first` others: empty for
    /// a task that does not number its elements.
    pub fn stream_indices(&self, first: u64, n: u64) -> IndexList {
        match &self.skip {
            Some(skip) => IndexList::from_runs(skip.complement_runs(first, n)),
            None => IndexList::default(),
        }
    }

    /// A stream took `n` elements from the buffer, to record in its reader's ledger.
    pub fn took(&self, n: u64) {
        self.unrecorded.fetch_add(n, Ordering::SeqCst);
    }

    /// A stream recorded `n` elements it took in its reader's ledger.
    pub fn recorded(&self, n: u64) {
        self.unrecorded.fetch_sub(n, Ordering::SeqCst);
    }

    /// Elements taken from the buffer and not yet recorded in a ledger.
    pub fn unrecorded(&self) -> u64 {
        self.unrecorded.load(Ordering::SeqCst)
    }

    /// The iteration the task belongs to: the one its readers must be admitted to.
    pub fn iteration_id(&self) -> u64 {
        self.def.iteration_id
    }

    /// The shared buffer, starting the pipeline on first use.
    pub fn buffer(&self) -> Arc<TaskBuffer> {
        self.buffer.get_or_init(|| self.start()).clone()
    }

    /// The shared buffer if a reader started the pipeline; never starts it.
    pub fn started_buffer(&self) -> Option<Arc<TaskBuffer>> {
        self.buffer.get().cloned()
    }

    /// The round server of a coordinated task; `None` for other tasks.
    pub fn round_robin(&self) -> Option<Arc<RoundRobin>> {
        let num_consumers = self.def.num_consumers?;
        Some(
            self.round_robin
                .get_or_init(|| RoundRobin::new(num_consumers, self.buffer()))
                .clone(),
        )
    }

    /// The window trainers read a cross-trainer cache task through; `None` for other tasks.
    pub fn cross_trainer_cache(&self) -> Option<Arc<CrossTrainerCache>> {
        if !self.def.use_cross_trainer_cache {
            return None;
        }
        Some(
            self.cache
                .get_or_init(|| {
                    let max_bytes = self.config.cross_trainer_cache_size();
                    let held = Reservation::new(Some(self.memory.clone()), "cross-trainer cache");
                    Arc::new(CrossTrainerCache::new(max_bytes, self.buffer(), held))
                })
                .clone(),
        )
    }

    pub fn error(&self) -> Option<TaskFailure> {
        self.error.lock().expect("error lock poisoned").clone()
    }

    pub fn set_error(&self, failure: TaskFailure) {
        self.error
            .lock()
            .expect("error lock poisoned")
            .get_or_insert(failure);
    }

    /// Waits at most `timeout` for the pipeline thread to end; `true` once it has, or if it
    /// never started.
    pub fn wait_pipeline_ended(&self, timeout: Duration) -> bool {
        let ended = self.ended.lock().expect("pipeline end lock poisoned");
        match ended.as_ref() {
            None => true,
            Some(rx) => matches!(
                rx.recv_timeout(timeout),
                Err(RecvTimeoutError::Disconnected)
            ),
        }
    }

    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
        if let Some(buffer) = self.buffer.get() {
            buffer.close();
        }
        if let Some(round_robin) = self.round_robin.get() {
            round_robin.stop();
        }
    }

    fn start(&self) -> Arc<TaskBuffer> {
        let (tx, buffer) =
            TaskBuffer::channel(self.config.task_buffer, self.config.task_buffer_bytes);
        // Past its fair share of the memory budget when another task found it full: the task
        // fails with that reason, and its pipeline stops (also if it is waiting for its
        // reader), dropping what it holds.
        let (error, cancelled, stopped) =
            (self.error.clone(), self.cancelled.clone(), buffer.clone());
        self.memory.on_give_back(move |reason| {
            error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(reason.into());
            cancelled.store(true, Ordering::Relaxed);
            stopped.close();
        });
        let def = self.def.clone();
        // A policy this worker does not know fails the task when its pipeline starts.
        let policy = ShardingPolicy::from_proto(def.sharding_policy);
        let dynamic = policy == Ok(ShardingPolicy::Dynamic);
        let splits: Option<Arc<dyn SplitSupplier>> = dynamic.then(|| {
            let leaser = Arc::new(SplitLeaser::new(
                self.client.clone(),
                IterationId(def.iteration_id),
                TaskId(def.task_id),
                self.runtime.clone(),
                self.config.split_lease,
                self.config
                    .lease_observer
                    .clone()
                    .map(|o| (o, self.worker.clone())),
            )) as Arc<dyn SplitSupplier>;
            if def.replay_leases.is_empty() {
                leaser
            } else {
                Arc::new(ReplaySupplier::new(
                    &def.replay_leases,
                    &def.replay_providers,
                    leaser,
                )) as Arc<dyn SplitSupplier>
            }
        });
        let cancelled = self.cancelled.clone();
        let options = ExecOptions {
            splits,
            file_access: FileAccess::Roots(self.resources.data_roots.clone()),
            python: self.resources.python.clone(),
            memory: Some(self.memory.clone()),
            cancel: Cancellation::from_flag(cancelled.clone()),
            limits: self.config.pipeline_limits(),
            ..ExecOptions::default()
        };
        let pipeline = Pipeline {
            def,
            policy,
            client: self.client.clone(),
            runtime: self.runtime.clone(),
            options,
            stats: self.resources.stats.clone(),
            skip: self.skip.clone(),
        };
        let (ended_tx, ended_rx) = std::sync::mpsc::channel::<()>();
        let release_memory = self.config.release_memory;
        let spawned = std::thread::Builder::new()
            .name(format!("sluice-task-{}", self.def.task_id))
            .spawn(move || {
                let _ended = ended_tx;
                produce(pipeline, tx, cancelled);
                if let Some(release) = release_memory {
                    release();
                }
            });
        match spawned {
            Ok(_) => *self.ended.lock().expect("pipeline end lock poisoned") = Some(ended_rx),
            Err(e) => {
                warn!(task = self.def.task_id, error = %e, "could not start the pipeline thread");
                self.set_error(format!("could not start the pipeline thread: {e}").into());
            }
        }
        buffer
    }
}

impl Drop for TaskRunner {
    /// The last reference (deleted task, every reader gone): the pipeline thread stops.
    fn drop(&mut self) {
        self.cancelled.store(true, Ordering::Relaxed);
        if let Some(buffer) = self.buffer.get() {
            buffer.close();
        }
    }
}

/// The planted bug of the chaos harness's self-test: a task taking over a stream its readers
/// received elements of resumes one element too late: the first index after the last run
/// received counts as received too, so that element is skipped (never produced, and numbered
/// as the readers expect, so nothing else shows it). An off-by-one in the restored position,
/// as a real resume bug would be.
#[cfg(feature = "planted-resume-bug")]
fn planted_resume_bug(mut runs: IndexRuns) -> IndexRuns {
    if let Some((_, end)) = runs.iter().last() {
        runs.insert(end, end + 1);
    }
    runs
}

/// What the pipeline thread needs to run one task.
struct Pipeline {
    def: TaskDef,
    /// The task's sharding policy, or why the worker does not know it.
    policy: Result<ShardingPolicy, InvalidValue>,
    /// For fetching the definition.
    client: DispatcherClient,
    runtime: Handle,
    options: ExecOptions,
    stats: Arc<WorkerStats>,
    /// Output indices not to push (see `TaskRunner::skip`).
    skip: Option<Arc<IndexRuns>>,
}

/// Runs the pipeline into `tx`; its end (or error) is recorded there however it returns.
fn produce(pipeline: Pipeline, mut tx: Producer, cancelled: Arc<AtomicBool>) {
    let _running = crate::crash_record::running(pipeline.def.task_id);
    let end = run_pipeline(pipeline, &mut tx, &cancelled);
    tx.finish(end);
}

fn run_pipeline(
    pipeline: Pipeline,
    tx: &mut Producer,
    cancelled: &AtomicBool,
) -> Result<(), TaskFailure> {
    let def = pipeline.def;
    let task_id = def.task_id;
    // A sharding policy or compression this worker does not know is the task's error, never a
    // silent default.
    let policy = pipeline
        .policy
        .map_err(|e| format!("task {task_id}: {e}"))?;
    let compression =
        Compression::from_proto(def.compression).map_err(|e| format!("task {task_id}: {e}"))?;
    let fetched = fetch_definition(
        &pipeline.client,
        &pipeline.runtime,
        task_id,
        &def.dataset_id,
        cancelled,
    )?;
    let Some(dataset) = fetched else {
        debug!(
            task = task_id,
            "task cancelled before its definition arrived"
        );
        return Ok(());
    };
    let dataset = sharded_definition(&def, policy, &dataset)?;
    let options = pipeline.options;
    // Exactly-once: readers received these outputs from an earlier task of the stream. Past
    // the last of them, nothing is skipped any more.
    let skip = pipeline.skip.filter(|s| !s.is_empty());
    let skip_below = skip
        .as_ref()
        .and_then(|s| s.iter().last())
        .map_or(0, |(_, end)| end);
    let mut index = 0u64;
    let mut elements = sluice_executor::iterate(&dataset, &options)?;
    let mut clock = pipeline.stats.pipeline_clock();
    let mut produced = 0u64;
    // Room to encode large elements outside the open chunk (see `push_element`).
    let mut scratch = BytesMut::new();
    loop {
        // Borrowed where the executor put it: moving a 64-byte element out of its `Option` and
        // `Result` cost as much as encoding a tiny one (a store-forwarding stall per move).
        let timed = clock.as_mut().is_some_and(|clock| clock.due());
        let started = timed.then(std::time::Instant::now);
        let next = elements.next();
        if let (Some(clock), Some(started)) = (clock.as_mut(), started) {
            clock.add(started.elapsed());
        }
        let element = match &next {
            Some(Ok(element)) => element,
            // The task was deleted: a stop, not a failure.
            Some(Err(DatasetError::Cancelled)) if cancelled.load(Ordering::Relaxed) => {
                debug!(task = task_id, produced, "task cancelled");
                return Ok(());
            }
            Some(Err(e)) => return Err(TaskFailure::from(e.clone())),
            None => break,
        };
        if cancelled.load(Ordering::Relaxed) {
            debug!(task = task_id, produced, "task cancelled");
            return Ok(());
        }
        if index < skip_below {
            index += 1;
            if skip.as_ref().is_some_and(|s| s.contains(index - 1)) {
                continue;
            }
        }
        if !tx.push_element(element, compression, &mut scratch) {
            debug!(task = task_id, produced, "every reader is gone");
            return Ok(()); // the task was deleted
        }
        produced += 1;
    }
    debug!(task = task_id, produced, "task reached its end");
    Ok(())
}

/// tf.data's mapping from sharding policy to auto-shard policy (`ToAutoShardPolicy`).
fn auto_shard_policy(policy: ShardingPolicy) -> AutoShardPolicy {
    match policy {
        ShardingPolicy::File => AutoShardPolicy::File,
        ShardingPolicy::Data => AutoShardPolicy::Data,
        ShardingPolicy::FileOrData => AutoShardPolicy::Auto,
        ShardingPolicy::Hint => AutoShardPolicy::Hint,
        ShardingPolicy::Off | ShardingPolicy::Dynamic => AutoShardPolicy::Off,
    }
}

/// The definition this task runs: under a static sharding policy (`policy`, the task's), the
/// worker's shard of it.
fn sharded_definition(
    task: &TaskDef,
    policy: ShardingPolicy,
    dataset: &dpb::DatasetDef,
) -> Result<dpb::DatasetDef, TaskFailure> {
    let policy = auto_shard_policy(policy);
    if policy == AutoShardPolicy::Off {
        return Ok(dataset.clone());
    }
    let index = match task.worker_index {
        Some(index) if task.num_workers > 0 => index,
        // tf.data's text: the dispatcher has no worker list, so workers have no index.
        // Both tf.data's `NotFound`.
        _ if task.num_workers == 0 => {
            return Err(TaskFailure::with_code(
                tonic::Code::NotFound,
                format!(
                    "Failed to shard dataset in tf.data service: Worker {} is not in the workers \
                     list. Got workers list .",
                    task.worker_address
                ),
            ))
        }
        _ => {
            return Err(TaskFailure::with_code(
                tonic::Code::NotFound,
                format!(
                    "Failed to shard dataset in tf.data service: Worker {} has no index among the \
                     {} configured workers.",
                    task.worker_address, task.num_workers
                ),
            ))
        }
    };
    sluice_pipeline::auto_shard(dataset, policy, task.num_workers, index).map_err(TaskFailure::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_rpc::ToProto;

    fn task(policy: ShardingPolicy, worker_index: Option<u64>, num_workers: u64) -> TaskDef {
        TaskDef {
            sharding_policy: policy.to_proto() as i32,
            worker_index,
            num_workers,
            worker_address: "127.0.0.1:7".into(),
            ..TaskDef::default()
        }
    }

    fn text(def: &dpb::DatasetDef) -> String {
        sluice_pipeline::render_def(def)
    }

    /// The planted bug of the chaos self-test: a task taking a stream over skips the element
    /// after the last run its readers received, and the indices it sends skip it too.
    #[cfg(feature = "planted-resume-bug")]
    #[test]
    fn the_planted_bug_skips_one_element_more_on_resume() {
        let runs = planted_resume_bug(IndexRuns::from_runs([(0, 10), (12, 20)]));
        assert_eq!(runs.iter().collect::<Vec<_>>(), vec![(0, 10), (12, 21)]);
        assert!(planted_resume_bug(IndexRuns::new()).is_empty());
    }

    #[test]
    fn static_policies_rewrite_the_definition_for_the_worker() {
        use ShardingPolicy::*;
        let range = sluice_pipeline::parse("range(20).shard(SHARD_HINT, SHARD_HINT)")
            .unwrap()
            .into_def();
        // (policy, worker index, number of workers, rewritten definition or error and its code)
        type Case = (
            ShardingPolicy,
            Option<u64>,
            u64,
            Result<&'static str, (tonic::Code, &'static str)>,
        );
        use tonic::Code::NotFound;
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            (Off, None, 0, Ok("range(20).shard(SHARD_HINT, SHARD_HINT)")),
            (Dynamic, None, 0, Ok("range(20).shard(SHARD_HINT, SHARD_HINT)")),
            (Hint, Some(1), 3, Ok("range(20).shard(3, 1)")),
            (Data, Some(2), 3, Ok("range(20).shard(SHARD_HINT, SHARD_HINT).shard(3, 2)")),
            (FileOrData, Some(0), 2, Ok("range(20).shard(SHARD_HINT, SHARD_HINT).shard(2, 0)")),
            (File, Some(0), 2, Err((NotFound, "Found an unshardable source dataset: range(20)"))),
            (Data, None, 0, Err((NotFound, "Failed to shard dataset in tf.data service: Worker 127.0.0.1:7 is not in the workers list. Got workers list ."))),
            (Hint, None, 0, Err((NotFound, "Failed to shard dataset in tf.data service: Worker 127.0.0.1:7 is not in the workers list. Got workers list ."))),
        ];
        for (policy, index, n, want) in cases {
            let got = sharded_definition(&task(policy, index, n), policy, &range);
            assert_eq!(
                got.as_ref()
                    .map(text)
                    .map_err(|f| (f.code, f.message.as_str())),
                want.map(String::from),
                "{policy:?}"
            );
        }
    }
}
