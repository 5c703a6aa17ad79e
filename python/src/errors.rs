//! Rust errors as the exceptions of `sluice.errors`, whose classes are named as `tf.errors`' and
//! share the base class `sluice.errors.OpError`. The message is the Rust error's text, which
//! follows tf.data's. Each `ClientError` variant has one class; a gRPC status keeps its code's
//! class, as tf.errors has one class per code.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use sluice_client::ClientError;
use sluice_dataset::DatasetError;

/// The class in `sluice.errors` for `e`.
fn client_class(e: &ClientError) -> &'static str {
    match e {
        ClientError::InvalidArgument(_) => "InvalidArgumentError",
        ClientError::NotFound(_) => "NotFoundError",
        ClientError::FailedPrecondition(_) => "FailedPreconditionError",
        ClientError::Unavailable { .. } => "UnavailableError",
        ClientError::Worker { .. } => "InternalError",
        ClientError::Dataset(e) => dataset_class(e),
        ClientError::OutOfRange(_) => "OutOfRangeError",
        ClientError::Rpc { code, .. } => code_class(*code),
    }
}

fn dataset_class(e: &DatasetError) -> &'static str {
    match e {
        DatasetError::Parse { .. }
        | DatasetError::UnknownFunction { .. }
        | DatasetError::InvalidArgument(_)
        | DatasetError::Function { .. }
        | DatasetError::UnshardableSource(_)
        | DatasetError::UnresolvedShardHint
        | DatasetError::LineTooLong { .. }
        | DatasetError::Image { .. }
        | DatasetError::BadExample { .. } => "InvalidArgumentError",
        DatasetError::AtRecord { error, .. } => dataset_class(error),
        DatasetError::FileRefused { .. } => "PermissionDeniedError",
        DatasetError::Python(_) => "InvalidArgumentError",
        DatasetError::PythonRuntime(_) => "FailedPreconditionError",
        // The io::Error's text is all that is kept of it (its kind is not).
        DatasetError::Io { message, .. }
            if message.to_ascii_lowercase().contains("no such file") =>
        {
            "NotFoundError"
        }
        DatasetError::Io { .. } => "UnknownError",
        DatasetError::CorruptRecord { .. } | DatasetError::Codec(_) => "DataLossError",
        DatasetError::Splits {
            retryable: true, ..
        } => "UnavailableError",
        DatasetError::Splits { .. } => "FailedPreconditionError",
        DatasetError::Cancelled => "CancelledError",
    }
}

fn code_class(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok | Code::Unknown => "UnknownError",
        Code::Cancelled => "CancelledError",
        Code::InvalidArgument => "InvalidArgumentError",
        Code::DeadlineExceeded => "DeadlineExceededError",
        Code::NotFound => "NotFoundError",
        Code::AlreadyExists => "AlreadyExistsError",
        Code::PermissionDenied => "PermissionDeniedError",
        Code::ResourceExhausted => "ResourceExhaustedError",
        Code::FailedPrecondition => "FailedPreconditionError",
        Code::Aborted => "AbortedError",
        Code::OutOfRange => "OutOfRangeError",
        Code::Unimplemented => "UnimplementedError",
        Code::Internal => "InternalError",
        Code::Unavailable => "UnavailableError",
        Code::DataLoss => "DataLossError",
        Code::Unauthenticated => "UnauthenticatedError",
    }
}

/// An exception of class `class` (a name in `sluice.errors`) with `message`.
pub fn error(class: &'static str, message: String) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("sluice.errors")
            .and_then(|m| m.getattr(class))
            .and_then(|cls| cls.call1((message.clone(),)));
        match made {
            Ok(instance) => PyErr::from_value(instance),
            Err(_) => PyRuntimeError::new_err(format!("{class}: {message}")),
        }
    })
}

pub fn client_error(e: ClientError) -> PyErr {
    error(client_class(&e), e.to_string())
}

pub fn dataset_error(e: DatasetError) -> PyErr {
    error(dataset_class(&e), e.to_string())
}

pub fn invalid_argument(message: impl Into<String>) -> PyErr {
    error("InvalidArgumentError", message.into())
}
