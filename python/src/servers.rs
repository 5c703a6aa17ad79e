//! `DispatchServer` and `WorkerServer`: a dispatcher replica and a worker, the real Rust
//! servers, running in this Python process on the module's runtime threads. A server serves
//! from construction until `stop()` (or the process exits); `join()` waits for that.

use pyo3::prelude::*;
use sluice_client::ClientError;
use sluice_dispatcher::state::Rejection;
use sluice_dispatcher::{DispatcherConfig, DispatcherError, DispatcherHandle};
use sluice_security::{SecurityError, ServerSecurity, ServerSecurityFiles};
use sluice_worker::{PoolConfig, WorkerConfig, WorkerError, WorkerHandle};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use crate::errors::{client_error, error};
use crate::runtime::{runtime, wait};

/// How long a one-node dispatcher may take to elect itself.
const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The class in `sluice.errors` for a dispatcher replica that could not start or serve; every
/// variant chooses its class (no catch-all), as the servers' own status maps do.
fn dispatcher_error(e: DispatcherError) -> PyErr {
    let class = match &e {
        DispatcherError::InvalidArgument(_) => "InvalidArgumentError",
        DispatcherError::Rejected(Rejection::InvalidArgument(_)) => "InvalidArgumentError",
        DispatcherError::Rejected(Rejection::NotFound(_)) => "NotFoundError",
        DispatcherError::Rejected(Rejection::FailedPrecondition(_)) => "FailedPreconditionError",
        DispatcherError::Rejected(Rejection::PermissionDenied(_)) => "PermissionDeniedError",
        DispatcherError::Rejected(Rejection::ResourceExhausted(_) | Rejection::Busy(_)) => {
            "ResourceExhaustedError"
        }
        DispatcherError::NotLeader { .. }
        | DispatcherError::QuorumUnavailable(_)
        | DispatcherError::RaftStopped(_) => "UnavailableError",
        DispatcherError::Startup(_) => "FailedPreconditionError",
        DispatcherError::FileRefused(_) => "PermissionDeniedError",
        DispatcherError::Journal(_) => "DataLossError",
        DispatcherError::UnexpectedOutcome { .. } => "InternalError",
    };
    error(class, e.to_string())
}

/// The class in `sluice.errors` for a worker that could not start or serve (no catch-all).
fn worker_error(e: WorkerError) -> PyErr {
    let class = match &e {
        WorkerError::Dispatcher(rpc) => return client_error(ClientError::from(rpc.clone())),
        WorkerError::Config(_) => "InvalidArgumentError",
        WorkerError::Bind { .. } => "UnavailableError",
        WorkerError::Registration(_) => "FailedPreconditionError",
        WorkerError::Task { .. } => "InternalError",
        WorkerError::TaskNotHereYet { .. } => "UnavailableError",
        WorkerError::TaskDeleted { .. } => "NotFoundError",
        WorkerError::NoFirstRequest
        | WorkerError::EmptyTrainerId
        | WorkerError::NotRoundRobin { .. }
        | WorkerError::Ack { .. } => "InvalidArgumentError",
        WorkerError::Round(_) => "FailedPreconditionError",
        WorkerError::TooManyRequests { .. } => "ResourceExhaustedError",
        WorkerError::Reader(_) => "CancelledError",
        WorkerError::RawVersion { .. } => "FailedPreconditionError",
        WorkerError::Security(SecurityError::Exposed(_)) => "FailedPreconditionError",
        WorkerError::Security(
            SecurityError::Tokens(_) | SecurityError::Tls(_) | SecurityError::Certs(_),
        ) => "InvalidArgumentError",
        WorkerError::Unauthenticated(_) => "UnauthenticatedError",
        WorkerError::PermissionDenied(_) | WorkerError::NotAdmitted { .. } => {
            "PermissionDeniedError"
        }
        WorkerError::NoFetchKey { .. } => "UnavailableError",
    };
    error(class, e.to_string())
}

/// The lifetime of a running server: `stop` asks it to stop, `done` tells it has.
struct Lifetime {
    stop: CancellationToken,
    done: CancellationToken,
}

impl Lifetime {
    fn new() -> Lifetime {
        Lifetime {
            stop: CancellationToken::new(),
            done: CancellationToken::new(),
        }
    }

    fn join(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, self.done.clone().cancelled_owned())
    }

    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.stop.cancel();
        self.join(py)
    }
}

/// A dispatcher replica serving in this process.
#[pyclass(frozen, module = "sluice._native")]
pub struct DispatchServer {
    /// The client API's address.
    addr: String,
    /// The Raft peer listener's address.
    peer_addr: String,
    /// This replica's Raft handle, for `leader_id`.
    raft: sluice_dispatcher::Raft,
    lifetime: Lifetime,
    /// The journal's directory when the caller gave none; removed after the server stops.
    temp_dir: Mutex<Option<TempDir>>,
}

#[pymethods]
impl DispatchServer {
    /// `peers`: every replica's `(node_id, "host:port")` peer address, the same on every
    /// replica; empty for a one-node quorum. `peer_listen`: where Raft traffic is served; `None`
    /// is this replica's own entry in `peers`, else any free port on `host`.
    /// `join`: start with an empty journal and wait to be added to a running quorum
    /// (`add_node`), instead of creating one. `tls_cert`, `tls_key`, `tls_ca`,
    /// `auth_token_file`, `insecure`: the replica's TLS and tokens, as `sluice dispatcher`'s
    /// flags of the same names. `max_definition_size`: bytes, as `--max-definition-size`.
    /// `gc_dynamic_sharding_jobs`: collect unused `distributed_epoch` jobs too.
    /// `object_store_config`: the per-store settings file, as `--object-store-config`.
    #[new]
    #[pyo3(signature = (host, port, work_dir, node_id, peers, worker_addresses,
        worker_timeout_ms=None, client_timeout_ms=None, job_gc_timeout_ms=None, join=false,
        data_roots=Vec::new(), peer_listen=None, tls_cert=None, tls_key=None, tls_ca=None,
        auth_token_file=None, insecure=false, max_definition_size=None, max_pipeline_ops=None,
        max_pipeline_depth=None, gc_dynamic_sharding_jobs=false, object_store_config=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        host: String,
        port: u16,
        work_dir: Option<PathBuf>,
        node_id: u64,
        peers: Vec<(u64, String)>,
        worker_addresses: Vec<String>,
        worker_timeout_ms: Option<u64>,
        client_timeout_ms: Option<u64>,
        job_gc_timeout_ms: Option<i64>,
        join: bool,
        data_roots: Vec<PathBuf>,
        peer_listen: Option<String>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
        tls_ca: Option<PathBuf>,
        auth_token_file: Option<PathBuf>,
        insecure: bool,
        max_definition_size: Option<u64>,
        max_pipeline_ops: Option<usize>,
        max_pipeline_depth: Option<usize>,
        gc_dynamic_sharding_jobs: bool,
        object_store_config: Option<PathBuf>,
    ) -> PyResult<DispatchServer> {
        let security = ServerSecurity::load(&ServerSecurityFiles {
            tls_cert,
            tls_key,
            tls_ca,
            token_file: auth_token_file,
            insecure,
        })
        .map_err(|e| dispatcher_error(DispatcherError::Startup(e.to_string())))?;
        let peers: BTreeMap<u64, String> = peers.into_iter().collect();
        let listen = format!("{host}:{port}");
        let peer_listen = match (peer_listen, peers.get(&node_id)) {
            (Some(peer_listen), _) => peer_listen,
            (None, Some(own)) => own.clone(),
            (None, None) => format!("{host}:0"),
        };
        let (data_dir, temp_dir) = match work_dir {
            Some(dir) => (dir, None),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("sluice-dispatcher-")
                    .tempdir()
                    .map_err(|e| error("UnknownError", format!("temporary work_dir: {e}")))?;
                (dir.path().to_path_buf(), Some(dir))
            }
        };
        let defaults = DispatcherConfig::default();
        let one_node = peers.is_empty() && !join;
        let config = DispatcherConfig {
            id: node_id,
            listen,
            peer_listen,
            join,
            // As tf.data's dispatcher creates its work_dir: a replica that is not joining
            // creates its journal in a missing or empty work_dir (and restarts from one there).
            init: !join,
            data_dir,
            peers,
            worker_addresses,
            data_roots,
            object_store_config,
            security,
            worker_timeout: worker_timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.worker_timeout),
            client_timeout: client_timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.client_timeout),
            // tf.data's convention: a negative timeout never collects.
            job_gc_timeout: match job_gc_timeout_ms {
                None => defaults.job_gc_timeout,
                Some(ms) => u64::try_from(ms).ok().map(Duration::from_millis),
            },
            max_definition_size: max_definition_size.unwrap_or(defaults.max_definition_size),
            max_pipeline_ops: max_pipeline_ops.unwrap_or(defaults.max_pipeline_ops),
            max_pipeline_depth: max_pipeline_depth.unwrap_or(defaults.max_pipeline_depth),
            gc_dynamic_jobs: gc_dynamic_sharding_jobs,
            ..defaults
        };
        let handle = wait(py, async move {
            let handle = DispatcherHandle::start(config).await?;
            if one_node {
                handle.wait_for_leader(LEADER_TIMEOUT).await?;
            }
            Ok::<_, DispatcherError>(handle)
        })?
        .map_err(dispatcher_error)?;
        let addr = handle.addr().to_string();
        let peer_addr = handle.peer_addr().to_string();
        let raft = handle.raft().clone();
        let lifetime = Lifetime::new();
        let (stop, done) = (lifetime.stop.clone(), lifetime.done.clone());
        runtime().spawn(async move {
            let _ = handle.run_until(stop).await;
            done.cancel();
        });
        Ok(DispatchServer {
            addr,
            peer_addr,
            raft,
            lifetime,
            temp_dir: Mutex::new(temp_dir),
        })
    }

    /// `host:port` the replica serves clients and workers on.
    #[getter]
    fn address(&self) -> &str {
        &self.addr
    }

    /// `host:port` the replica serves Raft on, for the other replicas only.
    #[getter]
    fn peer_address(&self) -> &str {
        &self.peer_addr
    }

    /// The leader this replica knows of (`None` while there is none, or once stopped).
    #[getter]
    fn leader_id(&self) -> Option<u64> {
        if self.lifetime.done.is_cancelled() {
            return None;
        }
        self.raft.metrics().borrow().current_leader
    }

    fn join(&self, py: Python<'_>) -> PyResult<()> {
        self.lifetime.join(py)
    }

    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.lifetime.stop(py)?;
        if let Ok(mut dir) = self.temp_dir.lock() {
            dir.take();
        }
        Ok(())
    }

    fn running(&self) -> bool {
        !self.lifetime.done.is_cancelled()
    }
}

/// A worker serving in this process.
#[pyclass(frozen, module = "sluice._native")]
pub struct WorkerServer {
    addr: String,
    lifetime: Lifetime,
}

#[pymethods]
impl WorkerServer {
    /// `tls_cert`, `tls_key`, `tls_ca`, `auth_token_file`, `insecure`: the worker's TLS and
    /// credentials, as `sluice worker`'s flags. `python`: the interpreter of the worker's
    /// Python executors (`None`: no executors, Python functions refused), `python_executors`
    /// how many (`None`: one per core). `worker_address`: the address to register under
    /// (`%port%`: the bound port; `None`: the bound address). `memory_budget`: bytes all tasks'
    /// buffers may hold (`None`: half the machine's memory); `memory_reserve`: the part of it
    /// only a task within its fair share may take (`None`: an eighth).
    /// `cross_trainer_cache_size`: bytes each cross-trainer cache task may hold (`None`: 10 GiB,
    /// or half the memory budget if that is less). `object_store_config`: the per-store
    /// settings file, as `--object-store-config`. `compress_local_readers`: as
    /// `--compress-local-readers`. `shared_memory`: false as `--no-shared-memory`.
    #[new]
    #[pyo3(signature = (dispatcher_address, host, port, worker_tags, heartbeat_interval_ms=None,
        data_roots=Vec::new(), tls_cert=None, tls_key=None, tls_ca=None, auth_token_file=None,
        insecure=false, python=None, python_executors=None, worker_address=None,
        memory_budget=None, memory_reserve=None, max_pipeline_ops=None, max_pipeline_depth=None,
        cross_trainer_cache_size=None, object_store_config=None, compress_local_readers=false,
        shared_memory=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dispatcher_address: String,
        host: String,
        port: u16,
        worker_tags: Vec<String>,
        heartbeat_interval_ms: Option<u64>,
        data_roots: Vec<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
        tls_ca: Option<PathBuf>,
        auth_token_file: Option<PathBuf>,
        insecure: bool,
        python: Option<PathBuf>,
        python_executors: Option<usize>,
        worker_address: Option<String>,
        memory_budget: Option<u64>,
        memory_reserve: Option<u64>,
        max_pipeline_ops: Option<usize>,
        max_pipeline_depth: Option<usize>,
        cross_trainer_cache_size: Option<u64>,
        object_store_config: Option<PathBuf>,
        compress_local_readers: bool,
        shared_memory: bool,
    ) -> PyResult<WorkerServer> {
        let security = ServerSecurity::load(&ServerSecurityFiles {
            tls_cert,
            tls_key,
            tls_ca,
            token_file: auth_token_file,
            insecure,
        })
        .map_err(|e| worker_error(WorkerError::Security(e)))?;
        let defaults = WorkerConfig::default();
        let config = WorkerConfig {
            dispatcher: dispatcher_address,
            listen: format!("{host}:{port}"),
            tags: worker_tags,
            data_roots,
            object_store_config,
            compress_local_readers,
            share_memory_with_local_readers: shared_memory,
            heartbeat_poll: heartbeat_interval_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.heartbeat_poll),
            security,
            python: python.map(|python| {
                let mut pool = PoolConfig::with_cores(python);
                pool.executors = python_executors.unwrap_or(pool.executors);
                pool
            }),
            advertise_address: worker_address,
            memory_budget_bytes: memory_budget.unwrap_or(defaults.memory_budget_bytes),
            memory_reserve_bytes: memory_reserve,
            max_pipeline_ops: max_pipeline_ops.unwrap_or(defaults.max_pipeline_ops),
            max_pipeline_depth: max_pipeline_depth.unwrap_or(defaults.max_pipeline_depth),
            cross_trainer_cache_size_bytes: cross_trainer_cache_size,
            ..defaults
        };
        let handle = wait(py, WorkerHandle::start(config))?.map_err(worker_error)?;
        let addr = handle.advertised_address().to_string();
        let lifetime = Lifetime::new();
        let (stop, done) = (lifetime.stop.clone(), lifetime.done.clone());
        runtime().spawn(async move {
            handle.run_until(stop).await;
            done.cancel();
        });
        Ok(WorkerServer { addr, lifetime })
    }

    #[getter]
    fn address(&self) -> &str {
        &self.addr
    }

    fn join(&self, py: Python<'_>) -> PyResult<()> {
        self.lifetime.join(py)
    }

    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.lifetime.stop(py)
    }

    fn running(&self) -> bool {
        !self.lifetime.done.is_cancelled()
    }
}

/// Writes a cluster's CA, certificates and tokens into `out` (as `sluice certs`); returns the
/// files written.
#[pyfunction]
#[pyo3(signature = (out, hosts=Vec::new(), workers=Vec::new(), days=365, worker_hosts=Vec::new()))]
pub fn make_credentials(
    out: PathBuf,
    hosts: Vec<String>,
    workers: Vec<String>,
    days: u32,
    worker_hosts: Vec<String>,
) -> PyResult<Vec<PathBuf>> {
    sluice_security::certs::generate(&sluice_security::certs::CertsPlan {
        out,
        hosts,
        worker_hosts,
        workers,
        days,
    })
    .map_err(|e| error("FailedPreconditionError", e.to_string()))
}
