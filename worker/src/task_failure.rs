//! `TaskFailure`: why a task's pipeline failed, as every reader of the task is told. The text is
//! what a reader shows, and its status code (`ElementBatch.error_code`) the class the reader
//! raises it with; when a user's Python function raised, the exception travels beside it
//! (`ElementBatch.python_exception`), so the reader can raise it again with its own type,
//! message and traceback.
//!
//! Coordinated (round-robin) reads keep the text only: their `GetElement` answer has no place
//! for the exception.

use sluice_element::{DatasetError, PythonException};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFailure {
    pub message: String,
    /// The failure's class as a status code: the pipeline error's own
    /// (`sluice_rpc::dataset_error_code`), `Internal` for the worker's own failures.
    pub code: tonic::Code,
    /// Boxed: a traceback is long, and most failures have none.
    pub python: Option<Box<PythonException>>,
}

impl TaskFailure {
    /// A failure of `code` with `message`.
    pub fn with_code(code: tonic::Code, message: String) -> TaskFailure {
        TaskFailure {
            message,
            code,
            python: None,
        }
    }

    /// The exception for `ElementBatch.python_exception`, when a Python function raised.
    pub fn python_proto(&self) -> Option<sluice_proto::worker::PythonException> {
        self.python.as_ref().map(|e| e.to_proto())
    }
}

impl fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for TaskFailure {
    fn from(message: String) -> TaskFailure {
        TaskFailure::with_code(tonic::Code::Internal, message)
    }
}

impl From<&str> for TaskFailure {
    fn from(message: &str) -> TaskFailure {
        TaskFailure::from(message.to_string())
    }
}

impl From<DatasetError> for TaskFailure {
    fn from(e: DatasetError) -> TaskFailure {
        let message = e.to_string();
        let code = sluice_rpc::dataset_error_code(&e);
        let python = match e {
            DatasetError::Python(exception) => Some(exception),
            _ => None,
        };
        TaskFailure {
            message,
            code,
            python,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raising_python_function_keeps_its_exception_beside_the_text() {
        let exception = PythonException {
            type_module: "builtins".into(),
            type_name: "ValueError".into(),
            message: "bad".into(),
            traceback: "Traceback (most recent call last):\n  ...".into(),
            function: "m.f".into(),
        };
        let failure = TaskFailure::from(DatasetError::Python(Box::new(exception.clone())));
        assert_eq!(
            failure.message,
            "python function 'm.f' raised ValueError: bad"
        );
        let proto = failure.python_proto().expect("a python exception");
        assert_eq!(PythonException::from_proto(proto), exception);

        assert_eq!(failure.code, tonic::Code::InvalidArgument);

        let missing = TaskFailure::from(DatasetError::Io {
            path: "/data/a".into(),
            kind: std::io::ErrorKind::NotFound,
            message: "No such file or directory".into(),
        });
        assert_eq!(missing.code, tonic::Code::NotFound);
        assert_eq!(TaskFailure::from("lost").code, tonic::Code::Internal);

        let other = TaskFailure::from(DatasetError::Cancelled);
        assert_eq!(other.python_proto(), None);
        assert_eq!(other.to_string(), DatasetError::Cancelled.to_string());
    }
}
