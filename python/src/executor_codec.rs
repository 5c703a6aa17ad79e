//! The data side of a Python executor (`sluice._executor`): an element from the worker's
//! encoding to numpy, and a call's outputs to the worker's OUTPUTS body. The framing and its
//! format live in `sluice-pyexec`; this only converts.

use bytes::Bytes;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use sluice_pyexec::shared_region::{SharedLayout, SharedRegion, SHARED_REGION_ENV};

use crate::convert::{columns_from_py_borrowed, element_to_py};
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
    decode_each(py, encoded)
}

fn decode_each<'py>(py: Python<'py>, encoded: &[u8]) -> PyResult<Vec<Bound<'py, PyAny>>> {
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
        .map(|o| columns_from_py_borrowed(o))
        .collect::<PyResult<Vec<_>>>()?;
    let parts = sluice_pyexec::protocol::encode_outputs_parts(&elements).map_err(dataset_error)?;
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

/// The executor's side of the region it shares with its worker (`sluice-pyexec`'s
/// `shared_region`): a batch's inputs are decoded from a request slot, and its results are
/// encoded into the reply slot one element at a time, each right after its call (a function may
/// reuse its output array for the next call), until one does not fit: the executor then sends
/// the rest, and what is already written (`written`), through its pipe.
#[pyclass(module = "sluice._native")]
pub struct ExecutorRegion {
    region: SharedRegion,
    /// The reply being written: its slot, the next byte and the results so far.
    reply: Option<(usize, usize, u32)>,
}

/// A RESULTS body's head: the count and the nanoseconds.
const RESULTS_HEAD: usize = 12;

#[pymethods]
impl ExecutorRegion {
    /// The region named by the worker in `SLUICE_EXECUTOR_REGION`, mapped; `None` when the
    /// variable is not set. Its descriptor is then closed on exec, so processes the user's
    /// code starts do not inherit it.
    #[staticmethod]
    fn from_env() -> PyResult<Option<ExecutorRegion>> {
        let Some(value) = std::env::var_os(SHARED_REGION_ENV) else {
            return Ok(None);
        };
        let value = value
            .to_str()
            .ok_or_else(|| invalid_argument(format!("{SHARED_REGION_ENV} is not UTF-8")))?;
        let (fd, layout) = SharedLayout::from_env(value).map_err(invalid_argument)?;
        // SAFETY: the worker started this process with the descriptor for this region alone;
        // nothing else here knows it.
        let region = unsafe { SharedRegion::inherit(fd, layout) }
            .map_err(|e| PyOSError::new_err(format!("{SHARED_REGION_ENV}: {e}")))?;
        // SAFETY: fcntl(2) on the descriptor the region now owns.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        Ok(Some(ExecutorRegion {
            region,
            reply: None,
        }))
    }

    /// The elements of the BATCH body (after its function id) of `length` bytes in request
    /// slot `slot`, copied out as `decode_elements` does.
    fn decode_batch<'py>(
        &self,
        py: Python<'py>,
        slot: usize,
        length: usize,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let encoded = self
            .region
            .request(slot)
            .and_then(|s| s.get(..length))
            .ok_or_else(|| invalid_argument(format!("{length} bytes in request slot {slot}")))?;
        decode_each(py, encoded)
    }

    /// Starts the results of a batch in reply slot `slot`.
    fn begin(&mut self, slot: usize) -> PyResult<()> {
        if self.region.reply(slot).is_none() {
            return Err(invalid_argument(format!("no reply slot {slot}")));
        }
        self.reply = Some((slot, RESULTS_HEAD, 0));
        Ok(())
    }

    /// Appends one element's result: `kind` with `payload`, the outputs' parts (OUTPUTS, as
    /// `encode_elements` takes them) or the body's bytes (KEEP, ERROR). `False`, and nothing
    /// written, when it does not fit; an output that cannot be encoded raises, also writing
    /// nothing.
    fn put(&mut self, kind: u8, payload: &Bound<'_, PyAny>) -> PyResult<bool> {
        let (slot, at, count) = self
            .reply
            .ok_or_else(|| invalid_argument("put before begin"))?;
        let parts = if kind == sluice_pyexec::protocol::OUTPUTS {
            let outputs = payload
                .cast::<PyList>()?
                .iter()
                .map(|o| columns_from_py_borrowed(&o))
                .collect::<PyResult<Vec<_>>>()?;
            sluice_pyexec::protocol::encode_outputs_parts(&outputs).map_err(dataset_error)?
        } else {
            vec![Bytes::copy_from_slice(
                payload.cast::<PyBytes>()?.as_bytes(),
            )]
        };
        let out = &mut self.region.reply_mut(slot).expect("checked by begin")[at..];
        let Some(written) = sluice_pyexec::protocol::write_results_entry(out, kind, &parts) else {
            return Ok(false);
        };
        self.reply = Some((slot, at + written, count + 1));
        Ok(true)
    }

    /// The results written so far (without the head), for a reply that goes on through the
    /// pipe.
    fn written<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let (slot, at, _) = self
            .reply
            .ok_or_else(|| invalid_argument("written before begin"))?;
        let reply = self.region.reply(slot).expect("checked by begin");
        Ok(PyBytes::new(py, &reply[RESULTS_HEAD..at]))
    }

    /// Ends the results, writing their head with `nanos`: the RESULTS body's length in the slot.
    fn finish(&mut self, nanos: u64) -> PyResult<usize> {
        let (slot, at, count) = self
            .reply
            .take()
            .ok_or_else(|| invalid_argument("finish before begin"))?;
        let reply = self.region.reply_mut(slot).expect("checked by begin");
        reply[..4].copy_from_slice(&count.to_le_bytes());
        reply[4..RESULTS_HEAD].copy_from_slice(&nanos.to_le_bytes());
        Ok(at)
    }
}
