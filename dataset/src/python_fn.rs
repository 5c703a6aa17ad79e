//! Users' Python functions in a pipeline: the `PyFunctionOp` a definition carries, and the
//! `PythonRunner` that executes it.
//!
//! This crate never runs Python itself. A pipeline with a Python op is executed with a runner in
//! `ExecOptions::python`: a worker's pool of executor processes (`sluice-pyexec`), or the
//! reader's own interpreter (the Python package, for ops after `distribute` and local
//! iteration). Without one, building the pipeline fails with `DatasetError::PythonRuntime`.
//!
//! A call's outputs are a list: one element for a map, none or one for a filter (the runner
//! applies the predicate and returns the element it keeps), any number for a flat_map. So one
//! ordered, parallel stage runs all three kinds.

use std::collections::VecDeque;
use std::fmt;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use crate::cancellation::Cancellation;
use crate::element::Element;
use crate::error::DatasetError;
use crate::executor::ElementIter;
use crate::pb;
use crate::spec::ElementSpec;

/// The most calls of one Python op kept in flight, whatever `num_parallel_calls` asks.
const MAX_IN_FLIGHT: usize = 1024;

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

/// The op's kind, refusing an unset one.
pub(crate) fn kind_of(op: &pb::PyFunctionOp) -> Result<pb::PyFunctionKind, DatasetError> {
    match pb::PyFunctionKind::try_from(op.kind) {
        Ok(pb::PyFunctionKind::Unspecified) | Err(_) => Err(DatasetError::invalid(format!(
            "python function '{}' has no kind (map, filter or flat_map)",
            op.name
        ))),
        Ok(kind) => Ok(kind),
    }
}

/// A definition's Python op is well formed: a kind, a pickle, both versions, and a given
/// output spec that decodes.
pub(crate) fn check(op: &pb::PyFunctionOp) -> Result<(), DatasetError> {
    kind_of(op)?;
    if op.pickled.is_empty() {
        return Err(DatasetError::invalid(format!(
            "python function '{}' has no pickled code",
            op.name
        )));
    }
    if op.python_version.is_empty() || op.cloudpickle_version.is_empty() {
        return Err(DatasetError::invalid(format!(
            "python function '{}' does not record the Python and cloudpickle versions that \
             pickled it",
            op.name
        )));
    }
    if let Some(spec) = &op.output_spec {
        ElementSpec::from_proto(spec)?;
    }
    Ok(())
}

/// The spec of the op's output for input of spec `input`: a filter keeps it; a map or flat_map
/// has the spec the user gave, or `Unknown`.
pub(crate) fn output_spec(
    op: &pb::PyFunctionOp,
    input: ElementSpec,
) -> Result<ElementSpec, DatasetError> {
    Ok(match kind_of(op)? {
        pb::PyFunctionKind::Filter => input,
        _ => match &op.output_spec {
            Some(spec) => ElementSpec::from_proto(spec)?,
            None => ElementSpec::Unknown,
        },
    })
}

/// The op's name in the text syntax (`py_map`, `py_filter`, `py_flat_map`).
pub(crate) fn syntax_name(op: &pb::PyFunctionOp) -> &'static str {
    match pb::PyFunctionKind::try_from(op.kind) {
        Ok(pb::PyFunctionKind::Map) => "py_map",
        Ok(pb::PyFunctionKind::Filter) => "py_filter",
        Ok(pb::PyFunctionKind::FlatMap) => "py_flat_map",
        _ => "py_function",
    }
}

/// Readies `op` with the runner in `runner`, refusing it when there is none.
pub(crate) fn prepare(
    op: &pb::PyFunctionOp,
    runner: Option<&Arc<dyn PythonRunner>>,
) -> Result<PythonStage, DatasetError> {
    check(op)?;
    let runner = runner.ok_or_else(|| {
        DatasetError::PythonRuntime(format!(
            "python function '{}' cannot run here: this process has no Python executors (start \
             the worker with `sluice worker --python PATH`, or from Python with WorkerServer)",
            op.name
        ))
    })?;
    let function = runner.prepare(op)?;
    // Capped: each call in flight holds an element, and the count is the user's.
    let in_flight = match op.num_parallel_calls {
        0 => function.parallelism().max(1) * 2,
        n => n as usize,
    }
    .min(MAX_IN_FLIGHT);
    Ok(PythonStage {
        function,
        in_flight,
        name: op.name.clone(),
    })
}

/// A prepared Python op as a pipeline stage.
#[derive(Clone)]
pub(crate) struct PythonStage {
    function: Arc<dyn PythonFunction>,
    /// How many calls are kept in flight.
    in_flight: usize,
    name: String,
}

impl PythonStage {
    pub(crate) fn apply(&self, input: ElementIter, cancel: Cancellation) -> ElementIter {
        Box::new(OrderedCalls {
            input: Some(input),
            stage: self.clone(),
            pending: VecDeque::new(),
            ready: Vec::new().into_iter(),
            cancel,
        })
    }
}

/// Calls the function on upstream elements with up to `in_flight` calls outstanding, and
/// yields their outputs in upstream order. An upstream error is yielded in its place, after
/// the outputs of the calls started before it.
struct OrderedCalls {
    input: Option<ElementIter>,
    stage: PythonStage,
    pending: VecDeque<Pending>,
    ready: std::vec::IntoIter<Element>,
    /// Checked before each call is awaited: a Python filter that drops everything loops here.
    cancel: Cancellation,
}

enum Pending {
    Call(Receiver<CallResult>),
    Failed(DatasetError),
}

impl OrderedCalls {
    fn fill(&mut self) {
        while self.pending.len() < self.stage.in_flight {
            let Some(input) = self.input.as_mut() else {
                return;
            };
            match input.next() {
                None => self.input = None,
                Some(Ok(e)) => self
                    .pending
                    .push_back(Pending::Call(self.stage.function.call(e))),
                Some(Err(err)) => {
                    self.pending.push_back(Pending::Failed(err));
                    // Stop reading ahead past an error: what follows it is produced only if the
                    // consumer goes on.
                    return;
                }
            }
        }
    }
}

impl Iterator for OrderedCalls {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(e) = self.ready.next() {
                return Some(Ok(e));
            }
            if let Err(e) = self.cancel.check() {
                return Some(Err(e));
            }
            self.fill();
            match self.pending.pop_front()? {
                Pending::Failed(err) => return Some(Err(err)),
                Pending::Call(rx) => match rx.recv() {
                    Ok(Ok(outputs)) => self.ready = outputs.into_iter(),
                    Ok(Err(err)) => return Some(Err(err)),
                    Err(_) => {
                        return Some(Err(DatasetError::PythonRuntime(format!(
                            "python function '{}': its executor went away without a result",
                            self.stage.name
                        ))))
                    }
                },
            }
        }
    }
}

#[cfg(test)]
#[path = "python_fn_tests.rs"]
mod tests;
