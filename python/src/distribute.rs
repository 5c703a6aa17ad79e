//! tf.distribute's input side for Python: `DistributedDataset` and its `DistributedIterator`
//! over `sluice_client::distribute`, and `InputContext`. Python's `sluice.DistributeStrategy`
//! builds them; the splitting, auto-sharding and end-of-epoch rules are the Rust module's.
//!
//! Waiting for a step releases the GIL and checks for signals every `SIGNAL_CHECK`: a step is
//! cancel-safe (it only changes state once an input element has arrived), so a timed-out wait
//! loses nothing.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use sluice_client::distribute::{
    distribute_datasets_from_function, AutoShardPolicy, DistributeConfig,
    DistributedDataset as RustDistributedDataset, DistributedInput,
    DistributedIterator as RustDistributedIterator, InputContext as RustInputContext,
};
use std::sync::Mutex;

use crate::convert::{element_to_py, spec_to_py};
use crate::errors::{client_error, invalid_argument};
use crate::in_process;
use crate::pipeline::{lock, Dataset, Pipeline};
use crate::reader_state::{epoch_over, state_from_py, state_to_py, wait_pinned};
use crate::runtime::{wait, wait_borrowed};

/// tf's `AutoShardPolicy` names.
fn auto_shard_policy(name: &str) -> PyResult<AutoShardPolicy> {
    Ok(match name.to_ascii_uppercase().as_str() {
        "OFF" => AutoShardPolicy::Off,
        "AUTO" => AutoShardPolicy::Auto,
        "FILE" => AutoShardPolicy::File,
        "DATA" => AutoShardPolicy::Data,
        "HINT" => AutoShardPolicy::Hint,
        _ => {
            return Err(invalid_argument(format!(
                "unknown auto_shard_policy '{name}'; expected one of OFF, AUTO, FILE, DATA, HINT"
            )))
        }
    })
}

fn config(
    num_replicas_in_sync: usize,
    num_input_pipelines: usize,
    input_pipeline_id: usize,
    auto_shard_policy_name: &str,
) -> PyResult<DistributeConfig> {
    let config = DistributeConfig {
        num_replicas_in_sync,
        num_input_pipelines,
        input_pipeline_id,
        auto_shard_policy: auto_shard_policy(auto_shard_policy_name)?,
    };
    config.validate().map_err(client_error)?;
    Ok(config)
}

fn input(dataset: &Dataset) -> DistributedInput {
    match &dataset.pipeline {
        Pipeline::Local(d) => DistributedInput::Local(d.clone()),
        Pipeline::Service(d) => DistributedInput::Service(d.clone()),
    }
}

/// What a `dataset_fn` of `distribute_datasets_from_function` learns about its pipeline.
#[pyclass(frozen, module = "sluice._native")]
pub struct InputContext {
    inner: RustInputContext,
}

#[pymethods]
impl InputContext {
    #[new]
    fn new(
        num_input_pipelines: usize,
        input_pipeline_id: usize,
        num_replicas_in_sync: usize,
    ) -> Self {
        InputContext {
            inner: RustInputContext::new(
                num_input_pipelines,
                input_pipeline_id,
                num_replicas_in_sync,
            ),
        }
    }

    #[getter]
    fn num_input_pipelines(&self) -> usize {
        self.inner.num_input_pipelines
    }

    #[getter]
    fn input_pipeline_id(&self) -> usize {
        self.inner.input_pipeline_id
    }

    #[getter]
    fn num_replicas_in_sync(&self) -> usize {
        self.inner.num_replicas_in_sync
    }

    fn get_per_replica_batch_size(&self, global_batch_size: u64) -> PyResult<u64> {
        self.inner
            .get_per_replica_batch_size(global_batch_size)
            .map_err(client_error)
    }

    fn __repr__(&self) -> String {
        self.inner.to_string()
    }
}

/// A dataset spread over the replicas that train in sync.
#[pyclass(frozen, module = "sluice._native")]
pub struct DistributedDataset {
    inner: RustDistributedDataset,
}

#[pymethods]
impl DistributedDataset {
    /// `experimental_distribute_dataset`: `dataset` is batched by the global batch size.
    #[staticmethod]
    fn rebatched(
        dataset: &Dataset,
        num_replicas_in_sync: usize,
        num_input_pipelines: usize,
        input_pipeline_id: usize,
        auto_shard_policy: &str,
    ) -> PyResult<DistributedDataset> {
        let config = config(
            num_replicas_in_sync,
            num_input_pipelines,
            input_pipeline_id,
            auto_shard_policy,
        )?;
        let inner = RustDistributedDataset::new(input(dataset), config).map_err(client_error)?;
        Ok(DistributedDataset {
            inner: inner.with_python_runner(in_process::runner()),
        })
    }

    /// `distribute_datasets_from_function` once Python has called the function: `dataset` is
    /// already per replica (no sharding, no splitting).
    #[staticmethod]
    fn per_replica(
        py: Python<'_>,
        dataset: &Dataset,
        num_replicas_in_sync: usize,
        num_input_pipelines: usize,
        input_pipeline_id: usize,
    ) -> PyResult<DistributedDataset> {
        let config = config(
            num_replicas_in_sync,
            num_input_pipelines,
            input_pipeline_id,
            "AUTO",
        )?;
        let input = input(dataset);
        let inner = wait(py, async move {
            distribute_datasets_from_function(&config, async |_: &RustInputContext| Ok(input)).await
        })?
        .map_err(client_error)?;
        Ok(DistributedDataset {
            inner: inner.with_python_runner(in_process::runner()),
        })
    }

    /// The spec of one replica's value in a step.
    fn element_spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spec_to_py(py, self.inner.element_spec())
    }

    /// Makes the next epoch resume at `state` (a dict `DistributedIterator.state_dict()`
    /// returned); only an input read through the service with a named job has states.
    fn load_state_dict(&self, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let state = state_from_py(state)?;
        self.inner.load_state(state).map_err(client_error)
    }

    /// A new epoch.
    fn iter(&self, py: Python<'_>) -> PyResult<DistributedIterator> {
        let dataset = self.inner.clone();
        let steps = wait(py, async move { dataset.iter().await })?.map_err(client_error)?;
        Ok(DistributedIterator {
            steps: Mutex::new(Some(steps)),
        })
    }
}

/// One epoch of a `DistributedDataset`. Ends (and releases the epoch) at the end or after an
/// error.
#[pyclass(frozen, module = "sluice._native")]
pub struct DistributedIterator {
    steps: Mutex<Option<RustDistributedIterator>>,
}

#[pymethods]
impl DistributedIterator {
    /// The next step as a tuple with one value per local replica, or `None` at the end.
    fn get_next_as_optional<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut guard = lock(py, &self.steps)?;
        let Some(steps) = guard.as_mut() else {
            return Ok(None);
        };
        match wait_borrowed!(py, steps.get_next_as_optional())? {
            Ok(Some(step)) => {
                drop(guard);
                let values = step
                    .into_values()
                    .into_iter()
                    .map(|e| element_to_py(py, e))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(Some(PyTuple::new(py, values)?.into_any()))
            }
            Ok(None) => {
                let steps = guard.take();
                drop(guard);
                py.detach(|| drop(steps));
                Ok(None)
            }
            Err(e) => {
                *guard = None;
                Err(client_error(e))
            }
        }
    }

    /// The reader's state after the steps returned so far, as a dict of `str` and `int` (see
    /// `RustDistributedIterator::state` for where one can be taken).
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut guard = lock(py, &self.steps)?;
        let Some(steps) = guard.as_mut() else {
            return Err(epoch_over());
        };
        let state = wait_pinned(py, steps.state())?.map_err(client_error)?;
        drop(guard);
        state_to_py(py, &state)
    }

    /// Ends the epoch now (a service read's client is released).
    fn close(&self, py: Python<'_>) {
        if let Ok(mut guard) = lock(py, &self.steps) {
            let steps = guard.take();
            drop(guard);
            py.detach(|| drop(steps));
        }
    }
}
