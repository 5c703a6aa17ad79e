//! `Hosts`: the runtimes the simulated fleet runs on, one thread each.
//!
//! The workers and clients the scale workload simulates stand for thousands of processes,
//! each with a runtime of its own. On one multi-threaded runtime they shared a single run
//! queue of 140,000 tasks, and its threads woke each other for every task they could steal:
//! a heartbeat's reply waited behind every lease loop of every worker, and the bench spent a
//! quarter of its CPU on waking threads. Spread over one single-threaded runtime per core,
//! each "host" runs its share of the fleet with its own queue, and the operating system shares
//! the cores between them as it would between processes.

use std::future::Future;
use tokio::runtime::{Builder, Handle, Runtime};
use tokio::task::JoinSet;

pub(crate) struct Hosts {
    runtimes: Vec<Runtime>,
}

impl Hosts {
    /// `n` runtimes (at least one), each on one thread of its own.
    pub(crate) fn new(n: usize) -> anyhow::Result<Hosts> {
        let runtimes = (0..n.max(1))
            .map(|i| {
                Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name(format!("sim-host-{i}"))
                    .enable_all()
                    .build()
            })
            .collect::<Result<_, _>>()?;
        Ok(Hosts { runtimes })
    }

    /// One host per core the machine offers.
    pub(crate) fn per_core() -> anyhow::Result<Hosts> {
        Hosts::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// The host of the `i`th simulated process.
    pub(crate) fn of(&self, i: usize) -> &Handle {
        self.runtimes[i % self.runtimes.len()].handle()
    }

    /// Calls `make` inside the `i`th process's host (what it creates, such as a client's
    /// connection tasks, runs there), and runs the future it makes there, in `tasks`.
    pub(crate) fn spawn<F, T>(
        &self,
        tasks: &mut JoinSet<T>,
        i: usize,
        make: impl FnOnce() -> anyhow::Result<F>,
    ) -> anyhow::Result<()>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let host = self.of(i);
        let future = {
            let _inside = host.enter();
            make()?
        };
        tasks.spawn_on(future, host);
        Ok(())
    }
}

impl Drop for Hosts {
    /// Dropped in async code, where a runtime may not block to shut down: its tasks were
    /// joined or aborted before, so nothing is left to wait for.
    fn drop(&mut self) {
        for runtime in self.runtimes.drain(..) {
            runtime.shutdown_background();
        }
    }
}
