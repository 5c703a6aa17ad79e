//! `InProcessRunner`: runs users' Python functions in this interpreter, for the pipelines this
//! process executes itself: a dataset iterated locally, and the ops chained after `distribute`
//! (which run in the reader). Functions before `distribute` run on the workers' executors.
//!
//! A function is unpickled once per pipeline built (`prepare`) and called through
//! `sluice._functions.call`, the calling convention every runner shares. Calls run one at a
//! time under the GIL, on the pipeline's own thread: this interpreter has one GIL, so more
//! would only queue. The GIL is taken per call and released between calls, so the thread
//! that waits for the pipeline's elements (without the GIL) never blocks it.
//!
//! Outputs are converted back to elements by the rule executors use too
//! (`sluice._functions.output_parts`, then `columns_from_py`); a filter keeps its input element
//! as it came, without a round trip through Python.

use std::sync::mpsc;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use sluice_element::{
    pb, CallResult, DatasetError, Element, PythonException, PythonFunction, PythonRunner,
};

use crate::convert::{columns_from_py, element_to_py};

/// The runner of this interpreter (it holds nothing: the GIL is the only state).
#[derive(Debug, Default)]
pub struct InProcessRunner;

/// A runner to put in `ExecOptions::python`.
pub fn runner() -> Arc<dyn PythonRunner> {
    Arc::new(InProcessRunner)
}

impl PythonRunner for InProcessRunner {
    fn prepare(&self, op: &pb::PyFunctionOp) -> Result<Arc<dyn PythonFunction>, DatasetError> {
        Python::attach(|py| prepare(py, op)).map(|f| Arc::new(f) as Arc<dyn PythonFunction>)
    }
}

fn prepare(py: Python<'_>, op: &pb::PyFunctionOp) -> Result<InProcessFunction, DatasetError> {
    let runtime = |what: &str, e: PyErr| {
        DatasetError::PythonRuntime(format!(
            "python function '{}': {what}: {}",
            op.name,
            describe(py, &e)
        ))
    };
    let functions = py
        .import("sluice._functions")
        .map_err(|e| runtime("cannot import sluice._functions", e))?;
    let version = |name: &str| -> Result<String, DatasetError> {
        functions
            .call_method0(name)
            .and_then(|v| v.extract::<String>())
            .map_err(|e| runtime(name, e))
    };
    let (python, cloudpickle) = (version("python_version")?, version("cloudpickle_version")?);
    if python != op.python_version || cloudpickle != op.cloudpickle_version {
        return Err(DatasetError::PythonRuntime(format!(
            "python function '{}' was pickled by Python {} with cloudpickle {}, and this \
             interpreter is Python {python} with cloudpickle {cloudpickle}: a pickle loads only \
             in the versions that wrote it",
            op.name, op.python_version, op.cloudpickle_version
        )));
    }
    let function = functions
        .call_method1("load_function", (PyBytes::new(py, &op.pickled),))
        .map_err(|e| runtime("cannot be unpickled here", e))?;
    let call = functions
        .getattr("call")
        .map_err(|e| runtime("sluice._functions.call", e))?;
    let exception_parts = functions
        .getattr("exception_parts")
        .map_err(|e| runtime("sluice._functions.exception_parts", e))?;
    let columns = functions
        .getattr("output_parts")
        .map_err(|e| runtime("sluice._functions.output_parts", e))?;
    Ok(InProcessFunction {
        function: function.unbind(),
        call: call.unbind(),
        exception_parts: exception_parts.unbind(),
        columns: columns.unbind(),
        kind: op.kind,
        name: op.name.clone(),
    })
}

/// One unpickled function, with the helpers its calls use (looked up once).
struct InProcessFunction {
    function: Py<PyAny>,
    /// `sluice._functions.call`.
    call: Py<PyAny>,
    /// `sluice._functions.exception_parts`.
    exception_parts: Py<PyAny>,
    /// `sluice._functions.output_parts`.
    columns: Py<PyAny>,
    kind: i32,
    name: String,
}

impl PythonFunction for InProcessFunction {
    /// Runs the call at once on the calling thread; the receiver holds its result.
    fn call(&self, input: Element) -> mpsc::Receiver<CallResult> {
        let (tx, rx) = mpsc::sync_channel(1);
        let result = Python::attach(|py| self.call_here(py, input));
        let _ = tx.send(result);
        rx
    }

    fn parallelism(&self) -> usize {
        1
    }
}

impl InProcessFunction {
    fn call_here(&self, py: Python<'_>, input: Element) -> CallResult {
        let filter = self.kind == pb::PyFunctionKind::Filter as i32
            || self.kind == pb::PyFunctionKind::TakeWhile as i32;
        // A filter hands back the element it keeps: the input, kept here (a clone shares the
        // tensors' buffers; their arrays are read-only to the predicate then).
        let kept = filter.then(|| input.clone());
        let argument = element_to_py(py, input).map_err(|e| self.not_converted(py, "input", e))?;
        let outputs = self
            .call
            .call1(py, (self.kind, self.function.bind(py), argument))
            .map_err(|e| self.raised(py, e))?;
        let outputs = outputs
            .bind(py)
            .cast::<PyList>()
            .map_err(|e| self.not_converted(py, "outputs", e.into()))?
            .clone();
        if let Some(kept) = kept {
            return Ok(if outputs.is_empty() {
                Vec::new()
            } else {
                vec![kept]
            });
        }
        outputs
            .iter()
            .map(|out| {
                self.columns
                    .call1(py, (out,))
                    .and_then(|columns| columns_from_py(columns.bind(py)))
                    .map_err(|e| self.not_converted(py, "a returned value", e))
            })
            .collect()
    }

    /// The function raised: its exception, to be raised again in the reader.
    fn raised(&self, py: Python<'_>, e: PyErr) -> DatasetError {
        let parts = self
            .exception_parts
            .call1(py, (e.value(py), e.traceback(py)))
            .and_then(|p| p.extract::<(String, String, String, String)>(py));
        match parts {
            Ok((type_module, type_name, message, traceback)) => {
                DatasetError::Python(Box::new(PythonException {
                    type_module,
                    type_name,
                    message,
                    traceback,
                    function: self.name.clone(),
                }))
            }
            Err(_) => DatasetError::PythonRuntime(format!(
                "python function '{}' raised {}",
                self.name,
                describe(py, &e)
            )),
        }
    }

    fn not_converted(&self, py: Python<'_>, what: &str, e: PyErr) -> DatasetError {
        DatasetError::InvalidArgument(format!(
            "python function '{}': {what} is not an element (numpy arrays, scalars, bytes, and \
             tuples and dicts of them): {}",
            self.name,
            describe(py, &e)
        ))
    }
}

/// `Type: message` of a Python exception.
fn describe(py: Python<'_>, e: &PyErr) -> String {
    let name = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    format!("{name}: {}", e.value(py))
}
