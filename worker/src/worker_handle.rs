//! Starting and stopping a worker: bind, register with the dispatcher (the first heartbeat),
//! serve the fetch service, and keep heartbeating and reporting finished tasks. A worker that
//! would listen beyond loopback without TLS and authentication refuses to start (unless its
//! security says `insecure`); it calls the dispatcher as its security's `worker` caller. A started worker
//! is also registered in this process's `LocalWorkers` (unless configured not to be) until it
//! shuts down, so clients in the process read it as a local worker.

use crate::config::WorkerConfig;
use crate::crash_record;
use crate::error::WorkerError;
use crate::raw_fetch;
use crate::task_runner::{TaskResources, TaskRunner};
use crate::worker_ops::WorkerOps;
use crate::worker_state::WorkerState;
use sluice_element::PythonRunner;
use sluice_executor::MemoryBudget;
use sluice_formats::DataRoots;
use sluice_ops::{OpsServer, RpcMetricsLayer};
use sluice_proto::dispatcher::CrashReport;
use sluice_pyexec::ExecutorPool;
use sluice_rpc::{
    DispatcherClient, LocalWorker, LocalWorkers, RetryConfig, RpcError, WorkerHeartbeat,
};
use sluice_security::{FetchKey, Role};
use sluice_types::{TaskId, WorkerId};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// A running worker.
pub struct WorkerHandle {
    addr: SocketAddr,
    state: Arc<WorkerState>,
    cancel: CancellationToken,
    tasks: JoinSet<()>,
    /// This worker's entry in `LocalWorkers`, while registered.
    local: Option<Arc<dyn LocalWorker>>,
    /// The metrics listener's address (`--metrics-listen`), if it has one.
    metrics_addr: Option<SocketAddr>,
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.unregister_local();
    }
}

impl WorkerHandle {
    /// Binds, registers with the dispatcher (waiting for it as long as it takes), and serves.
    pub async fn start(config: WorkerConfig) -> Result<WorkerHandle, WorkerError> {
        config.validate().map_err(WorkerError::Config)?;
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .map_err(|e| WorkerError::Bind {
                addr: config.listen.clone(),
                message: e.to_string(),
            })?;
        Self::start_on(listener, config).await
    }

    /// Like [`WorkerHandle::start`], serving on an already bound listener.
    pub async fn start_on(
        listener: tokio::net::TcpListener,
        config: WorkerConfig,
    ) -> Result<WorkerHandle, WorkerError> {
        config.validate().map_err(WorkerError::Config)?;
        let addr = listener.local_addr().map_err(|e| WorkerError::Bind {
            addr: config.listen.clone(),
            message: e.to_string(),
        })?;
        config.security.check_exposure("worker port", &addr)?;
        let advertised = advertised_address(config.advertise_address.as_deref(), addr)?;
        let retry = RetryConfig {
            retry_timeout: Duration::from_secs(365 * 24 * 3600),
            ..RetryConfig::default()
        };
        let data_roots =
            DataRoots::new(&config.data_roots).map_err(|e| WorkerError::Config(e.to_string()))?;
        if let Some(path) = &config.object_store_config {
            sluice_formats::load_object_store_settings(path).map_err(WorkerError::Config)?;
        }
        // Python executors start before registration: a worker that cannot run them does not
        // join the cluster. Starting them waits on child processes, off the async threads.
        let python = match config.python.clone() {
            None => None,
            Some(pool) => {
                let started = tokio::task::spawn_blocking(move || ExecutorPool::start(&pool))
                    .await
                    .map_err(|e| WorkerError::Config(format!("python executors: {e}")))?
                    .map_err(|e| WorkerError::Config(e.to_string()))?;
                Some(Arc::new(started) as Arc<dyn PythonRunner>)
            }
        };
        // Before registering: a previous run's crash is reported with the first heartbeat.
        let crash = match &config.state_dir {
            None => None,
            Some(dir) => crash_record::arm(dir, &advertised).map_err(WorkerError::Config)?,
        };
        if let Some(crash) = &crash {
            warn!(
                signal = %crash.signal,
                tasks = ?crash.task_ids,
                "the previous run of this worker crashed; reporting it to the dispatcher"
            );
        }
        let client = DispatcherClient::connect(
            &config.dispatcher,
            retry,
            config.security.caller(Role::Worker)?,
        )?;
        let (completed_tx, completed_rx) = mpsc::unbounded_channel();
        let state = Arc::new(
            WorkerState::new(advertised.clone(), completed_tx)
                .compressing_local_readers(config.compress_local_readers)
                .sharing_memory(config.share_memory_with_local_readers),
        );
        let cancel = CancellationToken::new();
        let memory = MemoryBudget::with_reserve(
            config.memory_budget_bytes,
            config.memory_reserve(),
            "--memory-budget",
        );
        // The metrics listener opens before registration: `/ready` says the worker waits.
        let registered = Arc::new(AtomicBool::new(false));
        let (ops, rpc) = match &config.metrics_listen {
            None => (None, None),
            Some(listen) => {
                let listener = OpsServer::bind(listen)
                    .await
                    .map_err(|e| WorkerError::Config(e.to_string()))?;
                let (node, rpc) = WorkerOps::new(state.clone(), memory.clone(), registered.clone());
                let server = OpsServer::serve(listener, Arc::new(node), cancel.clone())
                    .map_err(|e| WorkerError::Config(e.to_string()))?;
                (Some(server), Some(rpc))
            }
        };
        // Cancelled if registration fails, so the listener does not outlive a refused start.
        let stop_ops = cancel.clone().drop_guard();

        // Registration: the first heartbeat, answered at once. A refusal is final: the worker
        // does not start.
        let heartbeat = Heartbeat {
            client: client.clone(),
            state: state.clone(),
            config: config.clone(),
            resources: TaskResources {
                data_roots,
                python,
                memory,
                stats: state.stats.clone(),
            },
            crash: std::sync::Mutex::new(crash),
        };
        heartbeat.beat(Duration::ZERO).await.map_err(|e| match e {
            WorkerError::Dispatcher(RpcError::FailedPrecondition(message)) => {
                WorkerError::Registration(message)
            }
            other => other,
        })?;
        registered.store(true, Ordering::Relaxed);
        let cancel = stop_ops.disarm();

        let mut tasks = JoinSet::new();
        // One port for gRPC and raw fetch streams, in TLS or not (see `raw_fetch`).
        raw_fetch::serve_port(
            listener,
            &config.security,
            state.clone(),
            RpcMetricsLayer::new(rpc),
            cancel.clone(),
            &mut tasks,
        )?;
        let metrics_addr = ops.map(|ops| {
            let addr = ops.addr();
            tasks.spawn(ops.join());
            addr
        });
        tasks.spawn(heartbeat.run(cancel.clone()));
        tasks.spawn(report_completions(
            client,
            state.clone(),
            completed_rx,
            cancel.clone(),
        ));
        info!(%addr, advertised = %advertised, "worker serving");
        let local = config.local.then(|| {
            let local: Arc<dyn LocalWorker> = state.clone();
            LocalWorkers::global().add(&advertised, local.clone());
            local
        });
        Ok(WorkerHandle {
            addr,
            state,
            cancel,
            tasks,
            local,
            metrics_addr,
        })
    }

    fn unregister_local(&mut self) {
        if let Some(local) = self.local.take() {
            LocalWorkers::global().remove(&self.state.address, &local);
        }
    }

    /// The metrics listener's address (`--metrics-listen`), if it has one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The address the worker serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the worker is registered under and clients dial: its advertise address, or
    /// the bound address.
    pub fn advertised_address(&self) -> &str {
        &self.state.address
    }

    /// Ids of the tasks this worker holds.
    pub fn task_ids(&self) -> Vec<u64> {
        self.state.task_ids()
    }

    /// Stops at once: open fetch streams are cut (readers see the worker gone, as after a
    /// crash) and every task's pipeline stops.
    pub async fn shutdown(mut self) {
        self.unregister_local();
        self.cancel.cancel();
        self.state.cancel_all();
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }

    /// Serves until `stop` is cancelled.
    pub async fn run_until(self, stop: CancellationToken) {
        stop.cancelled().await;
        self.shutdown().await;
    }
}

/// The address to register under: `advertise` with `%port%` replaced by the bound port, or the
/// bound address, which must then be one a client can dial (not 0.0.0.0 or [::]).
fn advertised_address(advertise: Option<&str>, bound: SocketAddr) -> Result<String, WorkerError> {
    let Some(advertise) = advertise else {
        if bound.ip().is_unspecified() {
            return Err(WorkerError::Config(format!(
                "the worker listens on {bound}, an address no client can dial; give the address \
                 it is reached at with --advertise-address HOST:PORT (WorkerConfig.worker_address \
                 in Python)"
            )));
        }
        return Ok(bound.to_string());
    };
    let address = advertise.replace("%port%", &bound.port().to_string());
    sluice_rpc::check_worker_address(&address)
        .map_err(|e| WorkerError::Config(format!("--advertise-address {advertise}: {e}")))?;
    Ok(address)
}

struct Heartbeat {
    client: DispatcherClient,
    state: Arc<WorkerState>,
    config: WorkerConfig,
    /// What every task shares: data roots, Python executors, the memory budget.
    resources: TaskResources,
    /// A previous run's crash, sent with every heartbeat until one is answered.
    crash: std::sync::Mutex<Option<CrashReport>>,
}

impl Heartbeat {
    /// One heartbeat: report held tasks, start new ones, drop deleted ones.
    async fn beat(&self, poll: Duration) -> Result<(), WorkerError> {
        let heartbeat = WorkerHeartbeat {
            worker: WorkerId(self.state.address.clone()),
            current_tasks: self.state.task_ids().into_iter().map(TaskId).collect(),
            tags: self.config.tags.clone(),
            incarnation: self.state.incarnation,
        };
        let crash = self.crash.lock().expect("crash lock poisoned").clone();
        let response = self
            .client
            .worker_heartbeat_reporting(&heartbeat, crash.as_ref(), poll)
            .await?;
        if let Some(crash) = crash {
            if let Some(dir) = &self.config.state_dir {
                crash_record::forget(dir, &crash);
            }
            *self.crash.lock().expect("crash lock poisoned") = None;
        }
        // Before the new tasks: a task is never held without the key to check its readers.
        if let Some(key) = FetchKey::from_bytes(&response.fetch_key) {
            self.state.set_fetch_key(key);
        }
        for task in response.new_tasks {
            debug!(
                task = task.task_id,
                iteration = task.iteration_id,
                "new task"
            );
            let runner = TaskRunner::new(
                task,
                self.client.clone(),
                tokio::runtime::Handle::current(),
                self.config.clone(),
                self.state.address.clone(),
                self.resources.clone(),
            );
            self.state.add(runner);
        }
        for task_id in response.tasks_to_delete {
            debug!(task = task_id, "task deleted");
            self.state.delete(task_id);
        }
        Ok(())
    }

    async fn run(self, cancel: CancellationToken) {
        loop {
            let result = tokio::select! {
                _ = cancel.cancelled() => return,
                result = self.beat(self.config.heartbeat_poll) => result,
            };
            if let Err(e) = result {
                warn!(error = %e, "heartbeat failed");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        }
    }
}

/// Reports tasks whose end a reader saw, batched, until the dispatcher took them.
async fn report_completions(
    client: DispatcherClient,
    state: Arc<WorkerState>,
    mut completed: mpsc::UnboundedReceiver<u64>,
    cancel: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            _ = cancel.cancelled() => return,
            first = completed.recv() => match first { Some(id) => id, None => return },
        };
        let mut task_ids = vec![TaskId(first)];
        while let Ok(id) = completed.try_recv() {
            task_ids.push(TaskId(id));
        }
        let worker = WorkerId(state.address.clone());
        loop {
            let sent = tokio::select! {
                _ = cancel.cancelled() => return,
                sent = client.worker_update(&worker, &task_ids) => sent,
            };
            match sent {
                Ok(_) => {
                    let ids: Vec<u64> = task_ids.iter().map(|id| id.0).collect();
                    state.confirm(&ids);
                    break;
                }
                Err(e) => {
                    warn!(error = %e, "failed to send task updates to the dispatcher; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registered_address_is_the_advertised_one_or_a_dialable_bound_one() {
        let bound = |s: &str| s.parse::<SocketAddr>().expect("a socket address");
        // (advertise address, bound address, what the worker registers under or the error)
        let cases: Vec<(Option<&str>, &str, Result<&str, &str>)> = vec![
            (None, "127.0.0.1:5000", Ok("127.0.0.1:5000")),
            (
                Some("worker-3.example.com:%port%"),
                "0.0.0.0:5000",
                Ok("worker-3.example.com:5000"),
            ),
            (Some("10.0.0.7:7000"), "[::]:5000", Ok("10.0.0.7:7000")),
            (
                None,
                "0.0.0.0:5000",
                Err(
                    "the worker listens on 0.0.0.0:5000, an address no client can dial; give \
                     the address it is reached at with --advertise-address HOST:PORT \
                     (WorkerConfig.worker_address in Python)",
                ),
            ),
            (
                Some("0.0.0.0:%port%"),
                "0.0.0.0:5000",
                Err(
                    "--advertise-address 0.0.0.0:%port%: worker address '0.0.0.0:5000' is not \
                     HOST:PORT with a host clients can dial and a nonzero port: the host is \
                     unspecified (a worker listening on every interface must advertise the \
                     address it is reached at)",
                ),
            ),
        ];
        for (advertise, addr, want) in cases {
            let got = advertised_address(advertise, bound(addr)).map_err(|e| e.to_string());
            assert_eq!(
                got,
                want.map(String::from).map_err(String::from),
                "{advertise:?} {addr}"
            );
        }
    }
}
