//! `WorkerConfig`: what a worker needs to start, validated once.

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
    pub cross_trainer_cache_size_bytes: u64,
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
    /// The Python executors that run the Python functions of pipelines, started with the
    /// worker. `None`: pipelines with Python functions are refused.
    pub python: Option<PoolConfig>,
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
            cross_trainer_cache_size_bytes: DEFAULT_CACHE_SIZE_BYTES,
            local: true,
            security: ServerSecurity::default(),
            data_roots: Vec::new(),
            python: None,
        }
    }
}

impl WorkerConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.dispatcher.trim().is_empty() {
            return Err("a dispatcher address is required".into());
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
        if self.cross_trainer_cache_size_bytes == 0 {
            return Err("the cross-trainer cache size must be positive".into());
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
