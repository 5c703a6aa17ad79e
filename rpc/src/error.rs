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

/// Whether a failed attempt may be retried: its code is retryable, or its HTTP/2 stream broke
/// under it. tonic reports a stream the peer reset (a replica killed or cut mid-call) as
/// `Internal`, though no server answered; every mutating call carries a request id, so sending
/// it again cannot apply it twice.
/// A status whose server said not to send the request again is not retried either (see
/// `refuse_retry`).
pub fn is_retryable_status(status: &tonic::Status) -> bool {
    (is_retryable_code(status.code()) && !retry_refused(status)) || broken_stream(status)
}

/// gRPC's retry pushback header: milliseconds to wait before a retry, or a negative value
/// when the request must not be retried (gRPC's retry design, proposal A6).
pub const RETRY_PUSHBACK_METADATA_KEY: &str = "grpc-retry-pushback-ms";

/// `status`, telling clients not to retry the request: for a `ResourceExhausted` that sending
/// the same request again cannot get past (a full store, a request over a fixed limit), which
/// would otherwise be retried until the caller's deadline and end as `Unavailable`.
pub fn refuse_retry(mut status: tonic::Status) -> tonic::Status {
    status.metadata_mut().insert(
        RETRY_PUSHBACK_METADATA_KEY,
        tonic::metadata::MetadataValue::from_static("-1"),
    );
    status
}

/// Whether `status` carries a retry pushback that refuses retries: a negative number, or
/// anything that is not a number, as gRPC's own clients read it.
fn retry_refused(status: &tonic::Status) -> bool {
    status
        .metadata()
        .get(RETRY_PUSHBACK_METADATA_KEY)
        .is_some_and(|value| {
            value
                .to_str()
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .is_none()
        })
}

/// An `Internal` status that tonic made from an HTTP/2 error rather than one a server sent.
fn broken_stream(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<h2::Error>() {
            return status.code() == tonic::Code::Internal;
        }
        source = error.source();
    }
    false
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

/// The status code a pipeline's failure travels with from a worker to its readers, so a reader
/// raises it with its own class (tf.errors has one class per code), as tf.data keeps the code of
/// a worker's error and only prefixes its message.
pub fn dataset_error_code(e: &sluice_element::DatasetError) -> tonic::Code {
    use sluice_element::DatasetError;
    use tonic::Code;
    match e {
        DatasetError::Parse { .. }
        | DatasetError::UnknownFunction { .. }
        | DatasetError::InvalidArgument(_)
        | DatasetError::Function { .. }
        | DatasetError::LineTooLong { .. }
        | DatasetError::Image { .. }
        | DatasetError::BadExample { .. }
        // A user's Python exception is raised again with its own class; this is the fallback.
        | DatasetError::Python(_) => Code::InvalidArgument,
        DatasetError::AtRecord { error, .. } => dataset_error_code(error),
        DatasetError::FileRefused { .. } => Code::PermissionDenied,
        // tf.data's classes for its auto-shard texts.
        DatasetError::UnshardableSource(_) => Code::NotFound,
        DatasetError::UnresolvedShardHint => Code::FailedPrecondition,
        DatasetError::PythonRuntime(_) => Code::FailedPrecondition,
        DatasetError::Io { kind, .. } => match kind {
            std::io::ErrorKind::NotFound => Code::NotFound,
            std::io::ErrorKind::PermissionDenied => Code::PermissionDenied,
            _ => Code::Unknown,
        },
        DatasetError::CorruptRecord { .. } | DatasetError::Codec(_) => Code::DataLoss,
        DatasetError::Splits {
            retryable: true, ..
        } => Code::Unavailable,
        DatasetError::Splits { .. } => Code::FailedPrecondition,
        DatasetError::Cancelled => Code::Cancelled,
        DatasetError::ResourceExhausted { .. } | DatasetError::MemoryShareExceeded { .. } => {
            Code::ResourceExhausted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_stream_is_retried_and_a_servers_internal_error_is_not() {
        let reset =
            tonic::Status::from_error(Box::new(h2::Error::from(h2::Reason::INTERNAL_ERROR)));
        assert_eq!(reset.code(), tonic::Code::Internal);
        assert!(is_retryable_status(&reset), "{reset:?}");
        let answered = tonic::Status::internal("the journal failed");
        assert!(!is_retryable_status(&answered));
        assert!(is_retryable_status(&tonic::Status::unavailable(
            "not the leader"
        )));
        assert!(!is_retryable_status(&tonic::Status::permission_denied(
            "no"
        )));
    }

    #[test]
    fn a_retry_pushback_that_refuses_stops_retries_and_a_delay_does_not() {
        let with = |code: tonic::Code, value: &'static str| {
            let mut status = tonic::Status::new(code, "refused");
            status.metadata_mut().insert(
                RETRY_PUSHBACK_METADATA_KEY,
                tonic::metadata::MetadataValue::from_static(value),
            );
            status
        };
        let exhausted = tonic::Code::ResourceExhausted;
        let cases = [
            (tonic::Status::resource_exhausted("busy"), true),
            (
                refuse_retry(tonic::Status::resource_exhausted("full")),
                false,
            ),
            (with(exhausted, "-1"), false),
            (with(exhausted, "soon"), false),
            (with(exhausted, "250"), true),
            // A code that is not retried stays so, whatever the header says.
            (with(tonic::Code::InvalidArgument, "250"), false),
        ];
        for (status, retried) in cases {
            assert_eq!(is_retryable_status(&status), retried, "{status:?}");
        }
    }
}
