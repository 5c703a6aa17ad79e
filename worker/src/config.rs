//! `WorkerConfig`: what a worker needs to start, validated once.

use std::time::Duration;

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
    /// Elements a task buffers ahead of its readers.
    pub task_buffer: usize,
    /// First and largest number of splits leased at once in distributed_epoch mode; the lease
    /// doubles from the first to the largest while the task keeps consuming.
    pub split_lease: (u32, u32),
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            dispatcher: String::new(),
            listen: "127.0.0.1:0".into(),
            tags: Vec::new(),
            heartbeat_poll: Duration::from_secs(1),
            task_buffer: 64,
            split_lease: (8, 1024),
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
        if self.task_buffer == 0 {
            return Err("task buffer must hold at least one element".into());
        }
        let (first, max) = self.split_lease;
        if first == 0 || max < first {
            return Err(format!(
                "split lease sizes {first}..{max} must be positive and increasing"
            ));
        }
        Ok(())
    }
}
