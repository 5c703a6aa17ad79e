//! `PythonException`: an exception raised by a user's Python function, as the reader raises it
//! again, and its wire form.

use std::fmt;

/// An exception raised by a user's Python function, as the reader raises it again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PythonException {
    /// The exception class's `__module__` and `__qualname__`.
    pub type_module: String,
    pub type_name: String,
    /// `str(exception)`.
    pub message: String,
    /// The formatted traceback where it was raised.
    pub traceback: String,
    /// The function's qualified name.
    pub function: String,
}

impl fmt::Display for PythonException {
    /// One line: `python function 'f' raised ValueError: message`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "python function '{}' raised {}: {}",
            self.function, self.type_name, self.message
        )
    }
}

impl PythonException {
    /// The form a worker sends its reader (`ElementBatch.python_exception`).
    pub fn to_proto(&self) -> sluice_proto::worker::PythonException {
        sluice_proto::worker::PythonException {
            type_module: self.type_module.clone(),
            type_name: self.type_name.clone(),
            message: self.message.clone(),
            traceback: self.traceback.clone(),
            function: self.function.clone(),
        }
    }

    pub fn from_proto(p: sluice_proto::worker::PythonException) -> PythonException {
        PythonException {
            type_module: p.type_module,
            type_name: p.type_name,
            message: p.message,
            traceback: p.traceback,
            function: p.function,
        }
    }
}
