//! `TaskFailure`: why a task's pipeline failed, as every reader of the task is told. The text is
//! what a reader shows; when a user's Python function raised, the exception travels beside it
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
    /// Boxed: a traceback is long, and most failures have none.
    pub python: Option<Box<PythonException>>,
}

impl TaskFailure {
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
        TaskFailure {
            message,
            python: None,
        }
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
        let python = match e {
            DatasetError::Python(exception) => Some(exception),
            _ => None,
        };
        TaskFailure { message, python }
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

        let other = TaskFailure::from(DatasetError::Cancelled);
        assert_eq!(other.python_proto(), None);
        assert_eq!(other.to_string(), DatasetError::Cancelled.to_string());
    }
}
