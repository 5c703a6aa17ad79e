//! `WorkerConfig`: what a worker needs to start, validated once.
//!
//! The memory budget bounds what a definition can make the worker hold in buffers (batches
//! being built, shuffle buffers, prefetch queues, cross-trainer caches), across all its tasks;
//! its default is half of the machine's memory (`MemTotal` in /proc/meminfo), or 8 GiB where
//! that cannot be read. The cross-trainer cache size must fit in it, checked at start.

use crate::cross_trainer_cache::DEFAULT_CACHE_SIZE_BYTES;
use sluice_pyexec::PoolConfig;
use sluice_security::ServerSecurity;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A split lease a worker got from the dispatcher, as reported to a [`LeaseObserver`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseEvent {
    pub worker: String,
    pub task_id: u64,
    pub iteration_id: u64,
    pub provider: u32,
    pub repetition: u64,
    /// Splits `[start, end)`; empty with `end_of_splits`.
    pub start: u64,
    pub end: u64,
    pub end_of_splits: bool,
}

/// Called for every lease a worker gets (a chaos harness records them in its history).
#[derive(Clone)]
pub struct LeaseObserver(pub Arc<dyn Fn(LeaseEvent) + Send + Sync>);

impl fmt::Debug for LeaseObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseObserver")
    }
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Dispatcher replicas, `host:port` comma-separated.
    pub dispatcher: String,
    /// Address to serve on; port 0 binds a free port. The bound address is the worker's
    /// identity: a worker restarted at the same address is the same worker.
    pub listen: String,
    /// Tags reported to the dispatcher (e.g. `COLOCATED`).
    pub tags: Vec<String>,
    /// How long a heartbeat may wait at the dispatcher for new work (long poll).
    pub heartbeat_poll: Duration,
    /// Elements a task buffers ahead of its readers at most.
    pub task_buffer: usize,
    /// Bytes a task buffers ahead of its readers at most (an element larger than this is still
    /// buffered, alone): with `task_buffer`, the worker's memory bound per task.
    pub task_buffer_bytes: usize,
    /// First and largest number of splits leased at once in distributed_epoch mode; the lease
    /// doubles from the first to the largest while leases last less than
    /// `split_leaser::LEASE_TARGET`, and one lease is always requested ahead.
    pub split_lease: (u32, u32),
    /// Told of every split lease (for test harnesses); usually `None`.
    pub lease_observer: Option<LeaseObserver>,
    /// Cross-trainer cache jobs: bytes of encoded elements each task keeps for its trainers.
    /// `None`: tf.data's 10 GiB, or half the memory budget if that is less
    /// (`cross_trainer_cache_size`).
    pub cross_trainer_cache_size_bytes: Option<u64>,
    /// Bytes the buffers of all this worker's pipelines may hold together (`--memory-budget`);
    /// an op that would hold more fails its task with `ResourceExhausted`.
    pub memory_budget_bytes: u64,
    /// Bytes of the memory budget that only a task within its fair share may take
    /// (`--memory-reserve`), so that one task's buffers cannot fail another's small ones.
    /// `None`: an eighth of the budget (`memory_reserve`).
    pub memory_reserve_bytes: Option<u64>,
    /// Called on a task's pipeline thread once its pipeline has ended, to give what it freed
    /// back to the operating system (the `sluice` binary's allocator keeps freed pages for
    /// reuse: after a task that filled the budget and failed, the worker stayed at its peak
    /// resident size). `None`: nothing is called.
    pub release_memory: Option<fn()>,
    /// The address the worker registers under and clients dial (`--advertise-address`):
    /// `HOST:PORT`, where `%port%` stands for the bound port (tf.data's `worker_address`).
    /// `None`: the bound address, refused if it is unspecified (0.0.0.0 or [::]).
    pub advertise_address: Option<String>,
    /// Register in this process's `LocalWorkers`, so clients here treat the worker as local
    /// (target workers, local task deletion), as tf.data does for every in-process worker.
    /// Tests turn it off to stand in for a worker on another host.
    pub local: bool,
    /// TLS and credentials of the worker's port (gRPC and raw fetch streams alike), and what it
    /// presents to the dispatcher (its certificate, its `worker` token). Default: open, which
    /// serves on loopback only.
    pub security: ServerSecurity,
    /// The only directories a task may read files from (canonicalized at start; each must be
    /// an existing directory). Checked before each file is opened, whatever the dispatcher
    /// allowed. Empty: every file is refused, the safe default.
    pub data_roots: Vec<PathBuf>,
    /// Per-store settings of object stores (`--object-store-config`): the JSON file of
    /// endpoints, regions and credentials by bucket (see `sluice_formats::ObjectStoreSettings`),
    /// loaded at start. `None`: the environment's only.
    pub object_store_config: Option<PathBuf>,
    /// Compress elements of datasets registered with `Auto` compression for readers on this
    /// machine too (`--compress-local-readers`). By default a task is compressed only once a
    /// reader from another machine reads it: set this when readers reach the worker through a
    /// local proxy (a service mesh's sidecar, an SSH tunnel), so they look local and are not.
    pub compress_local_readers: bool,
    /// Hand large elements to readers on this machine through a shared memory region of each
    /// stream rather than over the socket, when they ask (`--no-shared-memory` turns it off).
    /// Only processes of the worker's user can map a region.
    pub share_memory_with_local_readers: bool,
    /// The Python executors that run the Python functions of pipelines, started with the
    /// worker. `None`: pipelines with Python functions are refused.
    pub python: Option<PoolConfig>,
    /// Where the operations listener serves `/metrics`, `/live` and `/ready` (plain HTTP,
    /// read-only); port 0 binds a free port. `None`: no such listener.
    pub metrics_listen: Option<String>,
    /// The most ops a task's definition may have (`--max-pipeline-ops`), checked before its
    /// pipeline is built; more fails the task with the count and the limit.
    pub max_pipeline_ops: usize,
    /// The deepest nesting of tuples and dicts a task's definition may hold
    /// (`--max-pipeline-depth`).
    pub max_pipeline_depth: usize,
    /// Where the worker keeps what must outlive it (`--state-dir`): the record of the tasks a
    /// fatal signal interrupted, reported by the next run so their iterations fail rather than
    /// crash another worker. `None`: no records.
    pub state_dir: Option<PathBuf>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            dispatcher: String::new(),
            listen: "127.0.0.1:0".into(),
            tags: Vec::new(),
            heartbeat_poll: Duration::from_secs(1),
            // Four chunks of tiny elements (see `task_buffer`), or 16 MiB.
            task_buffer: 16384,
            task_buffer_bytes: 16 << 20,
            split_lease: (8, 1 << 16),
            lease_observer: None,
            cross_trainer_cache_size_bytes: None,
            memory_budget_bytes: default_memory_budget(),
            memory_reserve_bytes: None,
            release_memory: None,
            advertise_address: None,
            local: true,
            security: ServerSecurity::default(),
            data_roots: Vec::new(),
            compress_local_readers: false,
            share_memory_with_local_readers: true,
            object_store_config: None,
            python: None,
            metrics_listen: None,
            max_pipeline_ops: sluice_pipeline::DEFAULT_MAX_PIPELINE_OPS,
            max_pipeline_depth: sluice_pipeline::DEFAULT_MAX_PIPELINE_DEPTH,
            state_dir: None,
        }
    }
}

impl WorkerConfig {
    /// The bytes each cross-trainer cache task keeps: as configured, or tf.data's default
    /// within half the memory budget.
    pub fn cross_trainer_cache_size(&self) -> u64 {
        self.cross_trainer_cache_size_bytes.unwrap_or_else(|| {
            DEFAULT_CACHE_SIZE_BYTES
                .min(self.memory_budget_bytes / 2)
                .max(1)
        })
    }

    /// The bytes of the memory budget kept for tasks within their fair share: as configured,
    /// or an eighth of the budget.
    pub fn memory_reserve(&self) -> u64 {
        self.memory_reserve_bytes
            .unwrap_or(self.memory_budget_bytes / 8)
    }

    /// The pipeline limits each task's definition is checked against.
    pub fn pipeline_limits(&self) -> sluice_pipeline::PipelineLimits {
        sluice_pipeline::PipelineLimits {
            max_ops: self.max_pipeline_ops,
            max_depth: self.max_pipeline_depth,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.dispatcher.trim().is_empty() {
            return Err("a dispatcher address is required".into());
        }
        if self.max_pipeline_ops == 0 || self.max_pipeline_depth == 0 {
            return Err(format!(
                "--max-pipeline-ops {} and --max-pipeline-depth {} must be positive",
                self.max_pipeline_ops, self.max_pipeline_depth
            ));
        }
        if let Some(listen) = &self.metrics_listen {
            let valid = listen
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !valid {
                return Err(format!("--metrics-listen '{listen}' is not HOST:PORT"));
            }
        }
        if self.tags.iter().any(|t| t.is_empty()) {
            return Err(format!(
                "Worker tags cannot be empty. Got tags {:?}",
                self.tags
            ));
        }
        if self.task_buffer == 0 || self.task_buffer_bytes == 0 {
            return Err("task buffer must hold at least one element".into());
        }
        if self.memory_budget_bytes == 0 {
            return Err("the memory budget (--memory-budget) must be positive".into());
        }
        if self.memory_reserve() >= self.memory_budget_bytes {
            return Err(format!(
                "the memory reserve ({} bytes, --memory-reserve) must be less than the memory \
                 budget ({} bytes, --memory-budget)",
                self.memory_reserve(),
                self.memory_budget_bytes
            ));
        }
        let cache = self.cross_trainer_cache_size();
        if cache == 0 {
            return Err("the cross-trainer cache size must be positive".into());
        }
        if cache > self.memory_budget_bytes {
            return Err(format!(
                "the cross-trainer cache size ({cache} bytes, --cross-trainer-cache-size) is \
                 larger than the worker's memory budget ({} bytes, --memory-budget); lower the \
                 one or raise the other",
                self.memory_budget_bytes
            ));
        }
        let (first, max) = self.split_lease;
        if first == 0 || max < first {
            return Err(format!(
                "split lease sizes {first}..{max} must be positive and increasing"
            ));
        }
        if let Some(python) = &self.python {
            python.validate().map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The memory budget when none is configured: half of the machine's memory (the rest is for the
/// task buffers, Python executors and everything else), or 8 GiB if /proc/meminfo cannot say.
pub fn default_memory_budget() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total_bytes(&text))
        .map(|total| total / 2)
        .filter(|budget| *budget > 0)
        .unwrap_or(FALLBACK_MEMORY_BUDGET)
}

/// The default memory budget where the machine's memory is unknown.
pub const FALLBACK_MEMORY_BUDGET: u64 = 8 << 30;

/// `MemTotal` of /proc/meminfo's text, in bytes (the file says kB, meaning KiB).
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let kib: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => kib.checked_mul(1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_kib() {
        let meminfo = "MemTotal:       16303252 kB\nMemFree:         1016084 kB\n";
        assert_eq!(mem_total_bytes(meminfo), Some(16303252 * 1024));
        assert_eq!(mem_total_bytes("MemTotal: lots\n"), None);
        assert_eq!(mem_total_bytes("MemFree: 1 kB\n"), None);
        assert!(default_memory_budget() > 0);
    }

    #[test]
    fn the_cross_trainer_cache_must_fit_in_the_memory_budget() {
        let config = |cache: Option<u64>, budget: u64| WorkerConfig {
            dispatcher: "127.0.0.1:1".into(),
            cross_trainer_cache_size_bytes: cache,
            memory_budget_bytes: budget,
            ..WorkerConfig::default()
        };
        // (cache size, memory budget, the cache size used or the error)
        let cases: Vec<(Option<u64>, u64, Result<u64, &str>)> =
            vec![
            (None, 64 << 30, Ok(10 << 30)),
            (None, 4 << 30, Ok(2 << 30)),
            (Some(1 << 30), 1 << 30, Ok(1 << 30)),
            (
                Some(2 << 30),
                1 << 30,
                Err("the cross-trainer cache size (2147483648 bytes, --cross-trainer-cache-size) \
                     is larger than the worker's memory budget (1073741824 bytes, \
                     --memory-budget); lower the one or raise the other"),
            ),
            (Some(1), 0, Err("the memory budget (--memory-budget) must be positive")),
        ];
        for (cache, budget, want) in cases {
            let config = config(cache, budget);
            let got = config
                .validate()
                .map(|()| config.cross_trainer_cache_size());
            assert_eq!(got, want.map_err(String::from), "{cache:?} {budget}");
        }
    }
}
