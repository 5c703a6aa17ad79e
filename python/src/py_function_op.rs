//! `_with_py_function`: appends a `PyFunctionOp` built from its raw fields to a local dataset.
//! The executors' tests use it to put a pickled function in a definition directly; users go
//! through `Dataset.map` and friends.

use pyo3::prelude::*;
use sluice_dataset::{pb, Transform};

use crate::errors::invalid_argument;
use crate::pipeline::{Dataset, Pipeline};

/// `dataset` followed by a Python op of `kind` (1 map, 2 filter, 3 flat_map).
#[pyfunction]
#[pyo3(signature = (dataset, kind, pickled, name, python_version, cloudpickle_version,
    num_parallel_calls=0))]
pub fn _with_py_function(
    dataset: &Dataset,
    kind: i32,
    pickled: Vec<u8>,
    name: String,
    python_version: String,
    cloudpickle_version: String,
    num_parallel_calls: u32,
) -> PyResult<Dataset> {
    let Pipeline::Local(local) = &dataset.pipeline else {
        return Err(invalid_argument(
            "a Python op is added before distribute here",
        ));
    };
    let op = pb::Op {
        kind: Some(pb::op::Kind::PyFunction(pb::PyFunctionOp {
            kind,
            pickled,
            name,
            python_version,
            cloudpickle_version,
            num_parallel_calls,
            output_spec: None,
        })),
    };
    Ok(Dataset {
        pipeline: Pipeline::Local(local.clone().push_op(op)),
    })
}
