//! `ClientError`: what the client library reports to its caller.

use sluice_element::DatasetError;
use sluice_rpc::{is_retryable_code, RpcError};
use sluice_types::InvalidValue;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The caller's input is malformed (names the argument).
    #[error("{0}")]
    InvalidArgument(String),
    /// An id the caller named does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but cannot be served in the current state; says why.
    #[error("{0}")]
    FailedPrecondition(String),
    /// No dispatcher replica answered within the retry deadline.
    #[error("dispatcher unavailable after {attempts} attempts: {message}")]
    Unavailable { attempts: u32, message: String },
    /// A worker failed to produce elements for a task. `code` is the failure's class, as the
    /// worker gave it (`NotFound` for a missing file, `FailedPrecondition` for a deleted task,
    /// ...): tf.data keeps a worker error's code and prefixes its message.
    #[error("Failed to get element from worker {address}: {message}")]
    Worker {
        address: String,
        message: String,
        code: tonic::Code,
    },
    /// A worker's pipeline failed with an error the reader raises again as its own kind: a
    /// user's Python function raised (`DatasetError::Python`, its type, message and traceback
    /// as the worker's executor saw them). Boxed for the same reason as `Dataset`.
    #[error("Failed to get element from worker {address}: {error}")]
    WorkerPipeline {
        address: String,
        error: Box<DatasetError>,
    },
    /// The dataset definition or an element was bad (parse, unknown function, codec). Boxed, so
    /// a `Result<Element, ClientError>` is no larger than an element: the result is built in
    /// place rather than moved into a wider layout, once per element.
    #[error(transparent)]
    Dataset(Box<DatasetError>),
    /// The end of the input was reached where an element was required (a distributed
    /// iterator's `get_next`; tf raises `OutOfRangeError` there).
    #[error("{0}")]
    OutOfRange(String),
    /// Any other gRPC failure.
    #[error("{code}: {message}")]
    Rpc { code: tonic::Code, message: String },
}

impl From<DatasetError> for ClientError {
    fn from(e: DatasetError) -> ClientError {
        ClientError::Dataset(Box::new(e))
    }
}

impl ClientError {
    /// A worker's failure of its own (not its pipeline's): `Internal`.
    pub fn worker(address: impl Into<String>, message: impl Into<String>) -> ClientError {
        ClientError::Worker {
            address: address.into(),
            message: message.into(),
            code: tonic::Code::Internal,
        }
    }

    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::InvalidArgument(_) => false,
            ClientError::NotFound(_) => false,
            ClientError::FailedPrecondition(_) => false,
            ClientError::Unavailable { .. } => true,
            ClientError::Worker { .. } => false,
            ClientError::WorkerPipeline { error, .. } => error.is_retryable(),
            ClientError::Dataset(e) => e.is_retryable(),
            ClientError::OutOfRange(_) => false,
            ClientError::Rpc { code, .. } => is_retryable_code(*code),
        }
    }
}

/// A dispatcher call's failure, as the client reports it.
impl From<RpcError> for ClientError {
    fn from(e: RpcError) -> ClientError {
        match e {
            RpcError::InvalidArgument(message) => ClientError::InvalidArgument(message),
            RpcError::NotFound(message) => ClientError::NotFound(message),
            RpcError::FailedPrecondition(message) => ClientError::FailedPrecondition(message),
            RpcError::Unavailable { attempts, message } => {
                ClientError::Unavailable { attempts, message }
            }
            RpcError::Status { code, message } => ClientError::Rpc { code, message },
        }
    }
}

/// A value a shared enum (`ShardingPolicy`, `TargetWorkers`) does not have.
impl From<InvalidValue> for ClientError {
    fn from(e: InvalidValue) -> ClientError {
        ClientError::InvalidArgument(e.0)
    }
}

/// Whether a status from a worker means the worker could not be reached or went away (retry
/// later) rather than an answer of the worker. A worker dying mid-call surfaces as transport
/// errors of any code (`h2 protocol error` is `Internal`); a worker's own refusals use these.
pub(crate) fn is_worker_refusal(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::InvalidArgument
            | tonic::Code::FailedPrecondition
            | tonic::Code::NotFound
            | tonic::Code::OutOfRange
            | tonic::Code::Unimplemented
            | tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
    )
}

/// A worker's refusal, as the reader reports it: a refused credential keeps its code
/// (`Unauthenticated`, `PermissionDenied`), so callers (and Python's error classes) tell it from
/// a failed pipeline; anything else is the worker's failure to produce elements.
pub(crate) fn worker_refusal(address: &str, status: tonic::Status) -> ClientError {
    match status.code() {
        code @ (tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) => ClientError::Rpc {
            code,
            message: format!("worker {address}: {}", status.message()),
        },
        code => ClientError::Worker {
            address: address.to_string(),
            message: status.message().to_string(),
            code,
        },
    }
}
