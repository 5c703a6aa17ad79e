//! Users' Python functions, as the dataset crates see them: the `PythonRunner` that readies a
//! definition's Python op and the `PythonFunction` it readies (implemented by a worker's pool of
//! executor processes, `sluice-pyexec`, or the reader's own interpreter; the executor's Python
//! stage calls them), and `CallResult`, the outputs of one call. What such a function raised is
//! a `PythonException` (`python_exception`).
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

    /// Starts a call on each of `inputs`, one receiver per input in their order. A runner that
    /// sends elements elsewhere may carry them together (one frame, one round trip); the
    /// default calls `call` on each.
    fn call_batch(&self, inputs: Vec<Element>) -> Vec<Receiver<CallResult>> {
        inputs.into_iter().map(|input| self.call(input)).collect()
    }

    /// How many inputs a `call_batch` should carry now (at least 1): a runner that measures
    /// what its calls cost says more while they are cheap. The default is 1.
    fn batch_size(&self) -> usize {
        1
    }
}
