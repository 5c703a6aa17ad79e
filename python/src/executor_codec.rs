//! The data side of a Python executor (`sluice._executor`): an element from the worker's
//! encoding to numpy, and a call's outputs to the worker's OUTPUTS body. The framing and its
//! format live in `sluice-pyexec`; this only converts.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::convert::{columns_from_py, element_to_py};
use crate::errors::{dataset_error, invalid_argument};

/// The element encoded in `data` from byte `offset` on, as numpy values. Tensors are copied
/// out of `data`, so the arrays are the function's own (writable).
#[pyfunction]
#[pyo3(signature = (data, offset=0))]
pub fn decode_element<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyBytes>,
    offset: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let encoded = data
        .as_bytes()
        .get(offset..)
        .ok_or_else(|| invalid_argument(format!("offset {offset} is past the data's end")))?;
    let element = sluice_element::decode_element(encoded).map_err(dataset_error)?;
    element_to_py(py, element)
}

/// The elements of a BATCH body from byte `offset` on (after the function id), as a list of
/// numpy values, each copied out of `data` as `decode_element` does.
#[pyfunction]
#[pyo3(signature = (data, offset=0))]
pub fn decode_elements<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyBytes>,
    offset: usize,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let encoded = data
        .as_bytes()
        .get(offset..)
        .ok_or_else(|| invalid_argument(format!("offset {offset} is past the data's end")))?;
    sluice_pyexec::protocol::split_elements(encoded)
        .map_err(dataset_error)?
        .into_iter()
        .map(|one| {
            let element = sluice_element::decode_element(one).map_err(dataset_error)?;
            element_to_py(py, element)
        })
        .collect()
}

/// A call's outputs as an OUTPUTS body; each output is a structure of tuples and dicts whose
/// leaves are `[dtype, shape, data]` (see `columns_from_py`).
#[pyfunction]
pub fn encode_elements<'py>(
    py: Python<'py>,
    outputs: Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let elements = outputs
        .iter()
        .map(columns_from_py)
        .collect::<PyResult<Vec<_>>>()?;
    let parts = sluice_pyexec::protocol::encode_outputs_parts(&elements);
    let len = parts.iter().map(|p| p.len()).sum();
    PyBytes::new_with(py, len, |out| {
        let mut at = 0;
        for part in &parts {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Ok(())
    })
}
