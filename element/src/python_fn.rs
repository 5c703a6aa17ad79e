//! Users' Python functions, as the dataset crates see them: the `PythonRunner` that readies a
//! definition's Python op and the `PythonFunction` it readies (implemented by a worker's pool of
//! executor processes, `sluice-pyexec`, or the reader's own interpreter; the executor's Python
//! stage calls them), `CallResult`, the outputs of one call, and `PythonException`, what such a
//! function raised, as the reader raises it again.

use std::fmt;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use crate::element::Element;
use crate::error::DatasetError;
use crate::pb;

/// The outputs of one call, or why it failed.
pub type CallResult = Result<Vec<Element>, DatasetError>;

/// Executes the Python ops of pipelines.
pub trait PythonRunner: Send + Sync + fmt::Debug {
    /// Readies `op` for calls: checks that this runner's Python and cloudpickle versions are the
    /// ones the op was pickled with (`DatasetError::PythonRuntime` naming both when not), and
    /// loads the function where it will run. Called once per pipeline built, not per element.
    fn prepare(&self, op: &pb::PyFunctionOp) -> Result<Arc<dyn PythonFunction>, DatasetError>;
}

/// One prepared Python op.
pub trait PythonFunction: Send + Sync {
    /// Starts a call on `input`; its result arrives on the returned receiver. Calls may run in
    /// parallel and finish out of order; the stage restores the order. A receiver whose sender
    /// is dropped without a result counts as a failed call.
    fn call(&self, input: Element) -> Receiver<CallResult>;

    /// How many calls may usefully be in flight at once (at least 1).
    fn parallelism(&self) -> usize;
}

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
