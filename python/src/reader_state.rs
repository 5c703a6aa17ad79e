//! A reader's state (`sluice_client::ReaderState`) as Python sees it: a plain dict of `str` and
//! `int` (PyTorch's `state_dict()` convention, so `torch.save`, `pickle` and `json` store it),
//! checked key by key when it comes back; and `wait_pinned`, the wait for taking one.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};
use sluice_client::{ReaderState, READER_STATE_FORMAT};
use std::future::Future;

use crate::errors::error;

/// The keys of a state, in the order `state_dict()` gives them, and their Python types.
const KEYS: [(&str, &str); 6] = [
    ("format", "int"),
    ("dataset", "str"),
    ("job", "str"),
    ("epoch", "int"),
    ("step", "int"),
    ("reader", "str"),
];

pub fn state_to_py<'py>(py: Python<'py>, state: &ReaderState) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("format", state.format)?;
    dict.set_item("dataset", &state.dataset)?;
    dict.set_item("job", &state.job)?;
    dict.set_item("epoch", state.epoch)?;
    dict.set_item("step", state.step)?;
    dict.set_item("reader", &state.reader)?;
    Ok(dict)
}

/// A bad state: `InvalidArgumentValueError` (an `InvalidArgumentError` and a `ValueError`).
fn bad_state(message: String) -> PyErr {
    error("InvalidArgumentValueError", message)
}

/// The state in `value`, a mapping as `state_to_py` made it. Every missing, unknown or
/// wrong-typed key is an error that names it; a newer format is refused before the other keys
/// are looked at (a newer client may have changed them).
pub fn state_from_py(value: &Bound<'_, PyAny>) -> PyResult<ReaderState> {
    let Ok(dict) = value.cast::<PyDict>() else {
        return Err(bad_state(format!(
            "a reader state is a dict as `state_dict()` returns it, got {}",
            type_name(value)
        )));
    };
    let format = int_of(dict, "format")?;
    if format > u64::from(READER_STATE_FORMAT) {
        return Err(bad_state(format!(
            "the reader state has format {format}, newer than this client's \
             {READER_STATE_FORMAT}: restore it with the Sluice release that took it, or a newer \
             one"
        )));
    }
    for key in dict.keys() {
        let known = key
            .cast::<PyString>()
            .ok()
            .and_then(|k| k.extract::<String>().ok())
            .map(|k| KEYS.iter().any(|(name, _)| *name == k))
            .unwrap_or(false);
        if !known {
            return Err(bad_state(format!(
                "the reader state has an unknown key {}: a state has the keys {}",
                key.repr()?,
                KEYS.iter()
                    .map(|(name, _)| format!("'{name}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let dataset = str_of(dict, "dataset")?;
    if dataset.is_empty() || !dataset.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad_state(format!(
            "the reader state's 'dataset' must be the hexadecimal key of a dataset definition, \
             got {dataset:?}"
        )));
    }
    let state = ReaderState {
        format: u32::try_from(format).unwrap_or(u32::MAX),
        dataset,
        job: str_of(dict, "job")?,
        epoch: int_of(dict, "epoch")?,
        step: int_of(dict, "step")?,
        reader: str_of(dict, "reader")?,
    };
    for (key, value) in [("job", &state.job), ("reader", &state.reader)] {
        if value.is_empty() {
            return Err(bad_state(format!(
                "the reader state's '{key}' must not be empty"
            )));
        }
    }
    if state.format == 0 {
        return Err(bad_state(
            "the reader state's 'format' must be at least 1".to_string(),
        ));
    }
    Ok(state)
}

fn item<'py>(dict: &Bound<'py, PyDict>, key: &str) -> PyResult<Bound<'py, PyAny>> {
    dict.get_item(key)?.ok_or_else(|| {
        let kind = KEYS
            .iter()
            .find(|(name, _)| *name == key)
            .map_or("value", |(_, kind)| kind);
        bad_state(format!(
            "the reader state has no '{key}' (of type {kind}): pass the dict `state_dict()` \
             returned"
        ))
    })
}

/// A non-negative `int` (not a `bool`).
fn int_of(dict: &Bound<'_, PyDict>, key: &str) -> PyResult<u64> {
    let value = item(dict, key)?;
    let wrong = || {
        bad_state(format!(
            "the reader state's '{key}' must be a non-negative int, got {} {}",
            type_name(&value),
            value.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    };
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(wrong());
    }
    value.extract::<u64>().map_err(|_| wrong())
}

fn str_of(dict: &Bound<'_, PyDict>, key: &str) -> PyResult<String> {
    let value = item(dict, key)?;
    match value.cast::<PyString>() {
        Ok(s) => s.extract::<String>(),
        Err(_) => Err(bad_state(format!(
            "the reader state's '{key}' must be a str, got {} {}",
            type_name(&value),
            value.repr().map(|r| r.to_string()).unwrap_or_default()
        ))),
    }
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// Awaits `future` (which may borrow the caller's state) on the module's runtime without the
/// GIL, checking for signals every `SIGNAL_CHECK`. Unlike `wait_borrowed`, the one future is
/// kept across the slices, for a future that is not cancel-safe (an RPC whose answer changes the
/// reader); a signal that raises drops it.
pub fn wait_pinned<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = crate::runtime::runtime();
    let mut future = std::pin::pin!(future);
    loop {
        let waited = py.detach(|| {
            rt.block_on(async {
                tokio::time::timeout(crate::runtime::SIGNAL_CHECK, future.as_mut()).await
            })
        });
        match waited {
            Ok(value) => return Ok(value),
            Err(_elapsed) => py.check_signals()?,
        }
    }
}

/// The error of a `state_dict()` on an iterator whose epoch is over.
pub(crate) fn epoch_over() -> PyErr {
    error(
        "FailedPreconditionError",
        "this epoch has ended (or was closed, or failed): a reader state is taken during an \
         epoch; after its end the next `iter()` starts the next epoch"
            .to_string(),
    )
}
