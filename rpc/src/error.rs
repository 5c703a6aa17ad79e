//! `RpcError`: how a call to the dispatcher quorum failed, as its caller needs to tell.
//!
//! The variants follow the status codes a caller acts on: the caller's input was wrong
//! (`InvalidArgument`), an id it named is unknown (`NotFound`), the request cannot be served in
//! the current state (`FailedPrecondition`), no replica answered within the retry deadline
//! (`Unavailable`), and any other status as it came. Messages are the dispatcher's texts as they
//! are (tf.data's, where it has one): the client and worker pass them on to their callers.

/// A failed dispatcher call, or an argument of one that could not be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
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
    /// Any other status.
    #[error("{code}: {message}")]
    Status { code: tonic::Code, message: String },
}

impl RpcError {
    /// Whether the same call may succeed later or on another replica.
    pub fn is_retryable(&self) -> bool {
        match self {
            RpcError::InvalidArgument(_) => false,
            RpcError::NotFound(_) => false,
            RpcError::FailedPrecondition(_) => false,
            RpcError::Unavailable { .. } => true,
            RpcError::Status { code, .. } => is_retryable_code(*code),
        }
    }

    /// The error a non-retryable status stands for.
    pub fn from_status(status: &tonic::Status) -> RpcError {
        let message = status.message().to_string();
        match status.code() {
            tonic::Code::InvalidArgument => RpcError::InvalidArgument(message),
            tonic::Code::NotFound => RpcError::NotFound(message),
            tonic::Code::FailedPrecondition => RpcError::FailedPrecondition(message),
            code => RpcError::Status { code, message },
        }
    }
}

/// Codes after which the same request may succeed later or on another replica. Exhaustive, so a
/// code added to tonic must be placed on one side.
pub fn is_retryable_code(code: tonic::Code) -> bool {
    match code {
        tonic::Code::Unavailable
        | tonic::Code::Unknown
        | tonic::Code::Cancelled
        | tonic::Code::Aborted
        | tonic::Code::DeadlineExceeded
        | tonic::Code::ResourceExhausted => true,
        tonic::Code::Ok
        | tonic::Code::InvalidArgument
        | tonic::Code::NotFound
        | tonic::Code::AlreadyExists
        | tonic::Code::PermissionDenied
        | tonic::Code::FailedPrecondition
        | tonic::Code::OutOfRange
        | tonic::Code::Unimplemented
        | tonic::Code::Internal
        | tonic::Code::DataLoss
        | tonic::Code::Unauthenticated => false,
    }
}
