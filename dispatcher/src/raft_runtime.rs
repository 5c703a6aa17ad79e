//! `RaftRuntime`: the tokio runtime a replica's Raft runs on, with a thread of its own.
//!
//! openraft's core (elections, heartbeats to followers, commits), its replication tasks, its
//! state machine worker and the Raft peer listener run here; the client API, the proposer, the
//! timers and every long poll run on the process's main runtime. Thousands of client calls
//! queued on the main runtime therefore cannot hold a heartbeat to a follower back past an
//! election timeout, which under load deposed leaders that were working: the threads are
//! scheduled by the OS, each getting its share of the cores.
//!
//! Calls from the main runtime into Raft (client writes, linearizable reads, metrics) go
//! through openraft's tokio channels, which work across runtimes.

use crate::error::DispatcherError;
use sluice_types::NodeId;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::runtime::{Handle, Runtime};

/// How long a shutdown waits for Raft's tasks to end (they hold the journal).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Threads for the journal's blocking work (log appends and reads, snapshot encoding and
/// files). Two, so a snapshot being built leaves one to the log. Without a bound the leader ran
/// six, each with the allocator's pages of its own: after 100,000 short jobs it held 37-39 MiB
/// resident, with two 35.4-35.8 MiB, at the same rate of jobs.
const BLOCKING_THREADS: usize = 2;

pub struct RaftRuntime {
    /// `None` once shut down.
    runtime: Option<Runtime>,
}

impl RaftRuntime {
    pub fn new(node: NodeId) -> Result<RaftRuntime, DispatcherError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(BLOCKING_THREADS)
            .thread_name(format!("raft-{node}"))
            .enable_all()
            .build()
            .map_err(|e| DispatcherError::Startup(format!("start the raft runtime: {e}")))?;
        Ok(RaftRuntime {
            runtime: Some(runtime),
        })
    }

    fn handle(&self) -> &Handle {
        self.runtime
            .as_ref()
            .expect("the raft runtime runs until shut down")
            .handle()
    }

    /// Runs `future` on this runtime (what it spawns stays here) and waits for its output.
    pub async fn run<F>(&self, future: F) -> Result<F::Output, DispatcherError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle()
            .spawn(future)
            .await
            .map_err(|e| DispatcherError::RaftStopped(format!("raft runtime task: {e}")))
    }

    /// Calls `f` with this runtime as the current one, so what it spawns runs here.
    pub fn enter<T>(&self, f: impl FnOnce() -> T) -> T {
        let _entered = self.handle().enter();
        f()
    }

    /// `listener`, registered with this runtime's reactor instead of the caller's.
    pub fn adopt(&self, listener: TcpListener) -> Result<TcpListener, DispatcherError> {
        let failed = |e: std::io::Error| DispatcherError::Startup(format!("peer listener: {e}"));
        let listener = listener.into_std().map_err(failed)?;
        self.enter(|| TcpListener::from_std(listener))
            .map_err(failed)
    }

    /// Stops the runtime and waits (up to a bound) for its tasks to be dropped, so the journal
    /// they hold is closed when this returns.
    pub async fn shutdown(mut self) {
        if let Some(runtime) = self.runtime.take() {
            let _ = tokio::task::spawn_blocking(move || runtime.shutdown_timeout(SHUTDOWN_TIMEOUT))
                .await;
        }
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        // Dropped without `shutdown` (a handle dropped in a test, a failed start): a runtime
        // may not block inside another one.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
