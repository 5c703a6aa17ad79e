//! `WorkerError`: why a worker could not start or a task could not run.

use sluice_dataset::DatasetError;
use sluice_rpc::RpcError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{0}")]
    Config(String),
    #[error("bind {addr}: {message}")]
    Bind { addr: String, message: String },
    #[error("dispatcher: {0}")]
    Dispatcher(#[from] RpcError),
    /// The dispatcher refused to register this worker (e.g. its address has no free entry in
    /// the static-sharding worker list); the dispatcher's message as is.
    #[error("{0}")]
    Registration(String),
    #[error("task {task_id}: {source}")]
    Task { task_id: u64, source: DatasetError },
}

impl WorkerError {
    pub fn is_retryable(&self) -> bool {
        match self {
            WorkerError::Config(_) => false,
            WorkerError::Bind { .. } => false,
            WorkerError::Dispatcher(e) => e.is_retryable(),
            WorkerError::Registration(_) => false,
            WorkerError::Task { source, .. } => source.is_retryable(),
        }
    }
}
