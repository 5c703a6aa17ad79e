//! Rust errors as the exceptions of `sluice.errors`, whose classes are named as `tf.errors`' and
//! share the base class `sluice.errors.OpError`. The message is the Rust error's text, which
//! follows tf.data's. Each `ClientError` variant has one class; a gRPC status keeps its code's
//! class, as tf.errors has one class per code. A user's Python function's exception is raised
//! again as `PythonFunctionError`, with the original class among its bases when it is built in.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use sluice_client::ClientError;
use sluice_element::{DatasetError, PythonException};

/// The class in `sluice.errors` for `e`.
fn client_class(e: &ClientError) -> &'static str {
    match e {
        ClientError::InvalidArgument(_) => "InvalidArgumentError",
        ClientError::NotFound(_) => "NotFoundError",
        ClientError::FailedPrecondition(_) => "FailedPreconditionError",
        ClientError::Unavailable { .. } => "UnavailableError",
        ClientError::Worker { code, .. } => code_class(*code),
        ClientError::WorkerPipeline { error, .. } => dataset_class(error),
        ClientError::Dataset(e) => dataset_class(e),
        ClientError::OutOfRange(_) => "OutOfRangeError",
        ClientError::Rpc { code, .. } => code_class(*code),
    }
}

fn dataset_class(e: &DatasetError) -> &'static str {
    code_class(sluice_client::dataset_error_code(e))
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
    let python = match &e {
        ClientError::Dataset(d) | ClientError::WorkerPipeline { error: d, .. } => match &**d {
            DatasetError::Python(p) => Some(p),
            _ => None,
        },
        _ => None,
    };
    match python {
        Some(p) => python_function_error(p, e.to_string()),
        None => error(client_class(&e), e.to_string()),
    }
}

pub fn dataset_error(e: DatasetError) -> PyErr {
    match &e {
        DatasetError::Python(p) => python_function_error(p, e.to_string()),
        _ => error(dataset_class(&e), e.to_string()),
    }
}

/// A user's function's exception raised again: a `sluice.errors.PythonFunctionError` that is
/// also an instance of the original class when that is a built-in one. `context` is the Rust
/// error's text (it names the function, and the worker when one raised it).
fn python_function_error(p: &PythonException, context: String) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("sluice.errors")
            .and_then(|m| m.getattr("_python_function_error"))
            .and_then(|make| {
                make.call1((
                    context.as_str(),
                    p.type_module.as_str(),
                    p.type_name.as_str(),
                    p.message.as_str(),
                    p.traceback.as_str(),
                    p.function.as_str(),
                ))
            });
        match made {
            Ok(instance) => PyErr::from_value(instance),
            Err(_) => PyRuntimeError::new_err(format!("{context}\n{}", p.traceback)),
        }
    })
}

pub fn invalid_argument(message: impl Into<String>) -> PyErr {
    error("InvalidArgumentError", message.into())
}
