//! `sluice._native`: the private extension module under the `sluice` Python package. It only
//! converts between Python and the Rust crates and delegates to them; the user-facing API, its
//! docs and its type hints live in the pure-Python package (`python/sluice/`).
//!
//! Invariants: one tokio runtime serves the whole module (servers, clients, epochs); the GIL is
//! released around every wait, and a waiting call checks for signals often enough that Ctrl-C
//! interrupts it.
//!
//! Layout:
//! - `runtime`: the module's runtime and `wait`, a future awaited without the GIL.
//! - `errors`: `ClientError`, `DatasetError` and server errors as `sluice.errors` exceptions.
//! - `convert`: elements to numpy and Python values, numpy to tensors, element specs.
//! - `executor_codec`: elements to and from a Python executor's frames (`sluice._executor`).
//! - `distribute`: tf.distribute's input side, `DistributedDataset`, its iterator, `InputContext`.
//! - `metrics`: the client metrics' text (`sluice.metrics`).
//! - `io`: `TfRecordWriter` (plain, GZIP, ZLIB), `serialize_example` (a `tf.train.Example`) and
//!   `encode_jpeg` (for the image benchmark).
//! - `pipeline`: `Dataset`, a local or service pipeline, and its `Iterator`.
//! - `reader_state`: a reader's state as a Python dict (`state_dict()`), checked when it comes
//!   back (`load_state_dict`).
//! - `in_process`: the runner of users' Python functions in this interpreter (local
//!   iteration, and ops chained after `distribute`).
//! - `service`: `distribute`, `register_dataset`, `from_dataset_id`, `add_node`, `remove_node`, `status`.
//! - `servers`: `DispatchServer` and `WorkerServer`, Rust servers in this process, and
//!   `make_credentials` (`sluice certs`).

mod convert;
mod distribute;
mod errors;
mod executor_codec;
mod in_process;
mod io;
mod metrics;
mod pipeline;
mod reader_state;
mod runtime;
mod servers;
mod service;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<pipeline::Dataset>()?;
    m.add_class::<pipeline::Iterator>()?;
    m.add_class::<convert::TensorBuffer>()?;
    m.add_class::<executor_codec::ExecutorRegion>()?;
    m.add_class::<distribute::InputContext>()?;
    m.add_class::<distribute::DistributedDataset>()?;
    m.add_class::<distribute::DistributedIterator>()?;
    m.add_class::<servers::DispatchServer>()?;
    m.add_class::<servers::WorkerServer>()?;
    m.add_class::<io::TfRecordWriter>()?;
    m.add_function(wrap_pyfunction!(io::encode_jpeg, m)?)?;
    m.add_function(wrap_pyfunction!(io::serialize_example, m)?)?;
    m.add_function(wrap_pyfunction!(io::list_objects, m)?)?;
    m.add_function(wrap_pyfunction!(io::write_object, m)?)?;
    m.add_function(wrap_pyfunction!(executor_codec::decode_element, m)?)?;
    m.add_function(wrap_pyfunction!(executor_codec::decode_elements, m)?)?;
    m.add_function(wrap_pyfunction!(executor_codec::encode_elements, m)?)?;
    m.add_function(wrap_pyfunction!(service::distribute, m)?)?;
    m.add_function(wrap_pyfunction!(service::register_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(service::from_dataset_id, m)?)?;
    m.add_function(wrap_pyfunction!(service::add_node, m)?)?;
    m.add_function(wrap_pyfunction!(service::remove_node, m)?)?;
    m.add_function(wrap_pyfunction!(service::status, m)?)?;
    m.add_function(wrap_pyfunction!(servers::make_credentials, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::client_metrics_text, m)?)?;
    Ok(())
}
