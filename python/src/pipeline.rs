//! `Dataset`: a pipeline held natively, either local (a `sluice_pipeline::Dataset`, run in this
//! process) or read through the service (a `ServiceDataset`, whose chained ops run here), and
//! its `Iterator`, one epoch. Both kinds take the same ops, so Python's `Dataset` wraps one type.
//!
//! An `Iterator` over the service owns its `ElementStream`; dropping it (Python deleting the
//! iterator) drops the stream, which releases the client at the dispatcher as the Rust client
//! does on drop.

use pyo3::prelude::*;
use pyo3::types::{PyAny, PyBytes, PyDict};
use sluice_client::{ClientError, ElementStream, ServiceDataset};
use sluice_element::{pb, Cancellation, DType, DatasetError, Element, ElementIter, ElementSpec};
use sluice_executor::{iterate, ExecOptions};
use sluice_formats::ExampleParser;
use sluice_pipeline::{
    cardinality, fixed_len_feature, render_def, render_ops, var_len_feature,
    Dataset as LocalDataset, Transform,
};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::convert::{columns_from_py, element_to_py, spec_from_py, spec_to_py, tensor_from_parts};
use crate::errors::{client_error, dataset_error, error, invalid_argument};
use crate::in_process;
use crate::io::compression_from_py;
use crate::reader_state::{epoch_over, state_from_py, state_to_py, wait_pinned};
use crate::runtime::{wait, wait_borrowed};

/// A `Dataset`'s pipeline. Each lives in its own Python object, made once per op the user
/// chains, so the local variant's size (its definition inline) costs nothing a box would save.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Pipeline {
    Local(LocalDataset),
    Service(Box<ServiceDataset>),
}

/// Applies a `Transform` method to either kind of pipeline.
macro_rules! chain {
    ($self:ident, |$d:ident| $e:expr) => {
        Dataset::new(match &$self.pipeline {
            Pipeline::Local($d) => {
                let $d = $d.clone();
                Pipeline::Local($e)
            }
            Pipeline::Service($d) => {
                let $d = ServiceDataset::clone($d);
                Pipeline::Service(Box::new($e))
            }
        })
    };
}

/// A pickled function as Python hands it over: `(pickled, name, python_version,
/// cloudpickle_version)`.
type PickledFn = (Vec<u8>, String, String, String);

fn pickled_op(
    (pickled, name, python_version, cloudpickle_version): PickledFn,
    kind: pb::PyFunctionKind,
    output_spec: Option<ElementSpec>,
) -> pb::PyFunctionOp {
    pb::PyFunctionOp {
        kind: kind as i32,
        pickled,
        name,
        python_version,
        cloudpickle_version,
        num_parallel_calls: 0,
        output_spec: output_spec.map(|s| s.to_proto()),
    }
}

#[pyclass(frozen, module = "sluice._native")]
pub struct Dataset {
    pub pipeline: Pipeline,
    /// The spec of this dataset's first element, once one was produced: it fills the parts of
    /// the element spec that are not known statically (a Python function's output). Shared
    /// with the dataset's iterators, which record it.
    first_spec: Arc<OnceLock<ElementSpec>>,
}

impl Dataset {
    pub fn new(pipeline: Pipeline) -> Dataset {
        Dataset {
            pipeline,
            first_spec: Arc::new(OnceLock::new()),
        }
    }

    /// The element spec as known statically, with `Unknown` for a Python function's output.
    fn static_spec(&self) -> PyResult<ElementSpec> {
        match &self.pipeline {
            Pipeline::Local(d) => {
                sluice_pipeline::element_spec(d.def(), &ExecOptions::default().registry)
                    .map_err(dataset_error)
            }
            Pipeline::Service(d) => d.element_spec().map_err(client_error),
        }
    }

    pub fn local(&self) -> PyResult<&LocalDataset> {
        match &self.pipeline {
            Pipeline::Local(d) => Ok(d),
            Pipeline::Service(_) => Err(invalid_argument(
                "a dataset read from the service cannot be distributed or registered again",
            )),
        }
    }
}

#[pymethods]
impl Dataset {
    #[staticmethod]
    fn range(start: i64, stop: i64, step: i64) -> PyResult<Dataset> {
        if step == 0 {
            return Err(invalid_argument("step must not be 0"));
        }
        Ok(Dataset::new(Pipeline::Local(LocalDataset::range_with(
            start, stop, step,
        ))))
    }

    #[staticmethod]
    fn from_slices(dtype: &str, shape: Vec<usize>, data: &Bound<'_, PyAny>) -> PyResult<Dataset> {
        if shape.is_empty() {
            return Err(invalid_argument(
                "from_tensor_slices needs a tensor of rank at least 1, got a scalar",
            ));
        }
        let tensor = tensor_from_parts(dtype, shape, data)?;
        Ok(Dataset::new(Pipeline::Local(LocalDataset::from_slices(
            tensor,
        ))))
    }

    /// `columns` as `columns_from_py` reads them: tuples and dicts of `[dtype, shape, data]`.
    #[staticmethod]
    fn from_structured_slices(columns: &Bound<'_, PyAny>) -> PyResult<Dataset> {
        let columns = columns_from_py(columns)?;
        Ok(Dataset::new(Pipeline::Local(
            LocalDataset::from_structured_slices(columns).map_err(dataset_error)?,
        )))
    }

    /// `format` is `lines` or `tfrecord`; `files`, when given, is the list read in order
    /// (`pattern` is then only its name); `compression` (TFRecord only) as
    /// `compression_from_py` takes it.
    #[staticmethod]
    #[pyo3(signature = (pattern, format, files=None, compression=None))]
    fn files(
        pattern: &str,
        format: &str,
        files: Option<Vec<String>>,
        compression: Option<&str>,
    ) -> PyResult<Dataset> {
        let builder = LocalDataset::files(pattern);
        let compression = compression_from_py(compression)?;
        let dataset = match format {
            "lines" if compression == pb::RecordCompression::None => builder.lines(),
            "lines" => return Err(invalid_argument("text lines cannot be read compressed")),
            "tfrecord" => builder.tfrecord_compressed(compression),
            "names" if compression == pb::RecordCompression::None => builder.names(),
            "names" => {
                return Err(invalid_argument(
                    "file names are not read, so not compressed",
                ))
            }
            other => return Err(invalid_argument(format!("unknown file format '{other}'"))),
        };
        let dataset = match files {
            None => dataset,
            Some(files) => {
                let mut def = dataset.into_def();
                if let Some(pb::Source {
                    kind: Some(pb::source::Kind::Files(source)),
                }) = def.source.as_mut()
                {
                    source.files = files;
                }
                LocalDataset::from_def(def)
            }
        };
        Ok(Dataset::new(Pipeline::Local(dataset)))
    }

    /// tf.data's `Dataset.random(seed)`.
    #[staticmethod]
    #[pyo3(signature = (seed=None))]
    fn random(seed: Option<u64>) -> Dataset {
        Dataset::new(Pipeline::Local(LocalDataset::random(seed)))
    }

    /// One element: `value`, read as `columns_from_py` reads columns (a tensor, or tuples and
    /// dicts of them, of any rank).
    #[staticmethod]
    fn from_tensors(value: &Bound<'_, PyAny>) -> PyResult<Dataset> {
        let value = columns_from_py(value)?;
        Ok(Dataset::new(Pipeline::Local(LocalDataset::from_tensors(
            &value,
        ))))
    }

    /// `zip` of local datasets: a tuple, or a dict when `keys` names each input.
    #[staticmethod]
    #[pyo3(signature = (inputs, keys=None))]
    fn zip(inputs: Vec<PyRef<'_, Dataset>>, keys: Option<Vec<String>>) -> PyResult<Dataset> {
        let inputs = local_inputs(&inputs, "zip")?;
        let dataset = match keys {
            None => LocalDataset::zip(inputs),
            Some(keys) => LocalDataset::zip_dict(keys.into_iter().zip(inputs).collect()),
        };
        checked(dataset)
    }

    #[staticmethod]
    #[pyo3(signature = (inputs, weights, seed, stop_on_empty_dataset))]
    fn sample_from_datasets(
        inputs: Vec<PyRef<'_, Dataset>>,
        weights: Option<Vec<f64>>,
        seed: Option<u64>,
        stop_on_empty_dataset: bool,
    ) -> PyResult<Dataset> {
        let inputs = local_inputs(&inputs, "sample_from_datasets")?;
        checked(LocalDataset::sample_from_datasets(
            inputs,
            weights,
            seed,
            stop_on_empty_dataset,
        ))
    }

    #[staticmethod]
    fn choose_from_datasets(
        inputs: Vec<PyRef<'_, Dataset>>,
        choice: PyRef<'_, Dataset>,
        stop_on_empty_dataset: bool,
    ) -> PyResult<Dataset> {
        let inputs = local_inputs(&inputs, "choose_from_datasets")?;
        let choice = choice.local()?.clone();
        checked(LocalDataset::choose_from_datasets(
            inputs,
            choice,
            stop_on_empty_dataset,
        ))
    }

    /// This dataset, then `other` (both local).
    fn concatenate(&self, other: PyRef<'_, Dataset>) -> PyResult<Dataset> {
        let other = other.local()?.def().clone();
        let Pipeline::Local(d) = &self.pipeline else {
            return Err(invalid_argument(
                "concatenate cannot follow distribute: put it in the dataset before distribute",
            ));
        };
        checked(d.clone().concatenate(other))
    }

    /// The source of an interleave template: the file the outer element names, read as
    /// `format` (`lines` or `tfrecord`, `compression` as for `files`).
    #[staticmethod]
    #[pyo3(signature = (format, compression=None))]
    fn element_files(format: &str, compression: Option<&str>) -> PyResult<Dataset> {
        let compression = compression_from_py(compression)?;
        let dataset = match format {
            "lines" if compression == pb::RecordCompression::None => LocalDataset::element_lines(),
            "lines" => return Err(invalid_argument("text lines cannot be read compressed")),
            "tfrecord" => LocalDataset::element_tfrecord(compression),
            other => return Err(invalid_argument(format!("unknown file format '{other}'"))),
        };
        Ok(Dataset::new(Pipeline::Local(dataset)))
    }

    /// The source of an interleave template: the outer element sliced along its first
    /// dimension.
    #[staticmethod]
    fn element_slices() -> Dataset {
        Dataset::new(Pipeline::Local(LocalDataset::element_slices()))
    }

    /// `interleave` with `template` (a local dataset) as each element's inner dataset;
    /// `num_parallel_calls` `None` reads sequentially, 0 is AUTOTUNE.
    #[pyo3(signature = (template, cycle_length, block_length, num_parallel_calls=None))]
    fn interleave(
        &self,
        template: &Dataset,
        cycle_length: u64,
        block_length: u64,
        num_parallel_calls: Option<u64>,
    ) -> PyResult<Dataset> {
        let op = pb::InterleaveOp {
            template: Some(template.local()?.def().clone()),
            function: None,
            cycle_length,
            block_length,
            num_parallel_calls,
        };
        let registry = ExecOptions::default().registry;
        sluice_pipeline::interleave::check(&op, &registry).map_err(dataset_error)?;
        let chained = chain!(self, |d| d.interleave_op(op.clone()));
        // The template must take the elements it is given (a file name, a sliceable tensor):
        // refused here, as tf.data refuses it when tracing.
        if let Pipeline::Local(d) = &chained.pipeline {
            sluice_pipeline::element_spec(d.def(), &registry).map_err(dataset_error)?;
        }
        Ok(chained)
    }

    /// `interleave` whose inner datasets are what a Python function returns (pickled as for
    /// `py_function`, of kind interleave).
    #[pyo3(signature = (pickled, name, python_version, cloudpickle_version, cycle_length, block_length, num_parallel_calls=None, output_spec=None))]
    #[allow(clippy::too_many_arguments)]
    fn py_interleave(
        &self,
        pickled: &Bound<'_, PyBytes>,
        name: String,
        python_version: String,
        cloudpickle_version: String,
        cycle_length: u64,
        block_length: u64,
        num_parallel_calls: Option<u64>,
        output_spec: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Dataset> {
        let output_spec = output_spec.map(spec_from_py).transpose()?;
        let op = pb::InterleaveOp {
            template: None,
            function: Some(pb::PyFunctionOp {
                kind: pb::PyFunctionKind::Interleave as i32,
                pickled: pickled.as_bytes().to_vec(),
                name,
                python_version,
                cloudpickle_version,
                num_parallel_calls: 0,
                output_spec: output_spec.map(|s| s.to_proto()),
            }),
            cycle_length,
            block_length,
            num_parallel_calls,
        };
        sluice_pipeline::interleave::check(&op, &ExecOptions::default().registry)
            .map_err(dataset_error)?;
        Ok(chain!(self, |d| d.interleave_op(op.clone())))
    }

    /// Why this dataset cannot be split between workers (it runs a generator), or `None`.
    fn unsplittable(&self) -> Option<String> {
        match &self.pipeline {
            Pipeline::Local(d) => {
                sluice_pipeline::python_op::unsplittable_generator(d.def()).map(|e| e.to_string())
            }
            Pipeline::Service(_) => None,
        }
    }

    /// The source of a group_by_window's reduce template: the window's elements.
    #[staticmethod]
    fn element_window() -> Dataset {
        Dataset::new(Pipeline::Local(LocalDataset::element_window()))
    }

    /// `group_by_window`: `key` a registered map function's name or a pickled function
    /// `(pickled, name, python_version, cloudpickle_version)` (as `py_function` takes them, of
    /// kind map), the window size fixed (`window_size_fn` `None`) or by a pickled function,
    /// the reduction by a template (a local dataset from `element_window`) or a pickled
    /// function of kind group_reduce with its optional output spec.
    #[pyo3(signature = (key, window_size, window_size_fn, reduce_template, reduce_fn, output_spec=None))]
    fn group_by_window(
        &self,
        key: &Bound<'_, PyAny>,
        window_size: u64,
        window_size_fn: Option<PickledFn>,
        reduce_template: Option<&Dataset>,
        reduce_fn: Option<PickledFn>,
        output_spec: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Dataset> {
        let output_spec = output_spec.map(spec_from_py).transpose()?;
        let (key_function, key) = match key.extract::<String>() {
            Ok(name) => (None, name),
            Err(_) => (
                Some(pickled_op(key.extract()?, pb::PyFunctionKind::Map, None)),
                String::new(),
            ),
        };
        let op = pb::GroupByWindowOp {
            key_function,
            window_size,
            window_size_function: window_size_fn
                .map(|f| pickled_op(f, pb::PyFunctionKind::Map, None)),
            reduce: reduce_template
                .map(|t| t.local().map(|d| d.def().clone()))
                .transpose()?,
            reduce_function: reduce_fn
                .map(|f| pickled_op(f, pb::PyFunctionKind::GroupReduce, output_spec.clone())),
            key,
        };
        let registry = ExecOptions::default().registry;
        sluice_pipeline::group_by_window::check(&op, &registry).map_err(dataset_error)?;
        let chained = chain!(self, |d| d.group_by_window_op(op.clone()));
        if let Pipeline::Local(d) = &chained.pipeline {
            sluice_pipeline::element_spec(d.def(), &registry).map_err(dataset_error)?;
        }
        Ok(chained)
    }

    fn take_while(&self, predicate: &str) -> Dataset {
        chain!(self, |d| d.take_while(predicate))
    }

    fn map(&self, function: &str) -> Dataset {
        chain!(self, |d| d.map(function))
    }

    /// `padded_shapes`: one list of dims (-1: the batch's largest) per flattened component, or
    /// empty; `padding_values`: one `[dtype, shape, data]` scalar per component, or empty.
    fn padded_batch(
        &self,
        batch_size: u64,
        drop_remainder: bool,
        padded_shapes: Vec<Vec<i64>>,
        padding_values: Vec<(String, Vec<usize>, Bound<'_, PyAny>)>,
    ) -> PyResult<Dataset> {
        let values = padding_values
            .into_iter()
            .map(|(dtype, shape, data)| tensor_from_parts(&dtype, shape, &data))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(chain!(self, |d| d.padded_batch(
            batch_size,
            drop_remainder,
            padded_shapes.clone(),
            values.clone()
        )))
    }

    /// Computes the element spec from the definition alone (no element is produced), raising
    /// what the ops' spec rules refuse.
    fn check_static_spec(&self) -> PyResult<()> {
        self.static_spec().map(|_| ())
    }

    fn unbatch(&self) -> Dataset {
        chain!(self, |d| d.unbatch())
    }

    fn ignore_errors(&self, log_warning: bool) -> Dataset {
        chain!(self, |d| d.ignore_errors(log_warning))
    }

    fn cache(&self, filename: &str) -> Dataset {
        chain!(self, |d| d.cache(filename))
    }

    fn snapshot(&self, path: &str) -> Dataset {
        chain!(self, |d| d.snapshot(path))
    }

    fn shard_hint(&self) -> Dataset {
        chain!(self, |d| d.shard_hint())
    }

    /// tf.data's `with_options`, carried in a local definition (a dataset read from the service
    /// took its options when it was registered): `None` / 0 leaves a field as it is.
    #[pyo3(signature = (deterministic, external_state_policy, auto_shard_policy))]
    fn with_options(
        &self,
        deterministic: Option<bool>,
        external_state_policy: i32,
        auto_shard_policy: i32,
    ) -> Dataset {
        let options = pb::DatasetOptions {
            deterministic,
            external_state_policy,
            auto_shard_policy,
        };
        match &self.pipeline {
            Pipeline::Local(d) => Dataset::new(Pipeline::Local(d.clone().with_options(&options))),
            Pipeline::Service(_) => Dataset::new(self.pipeline.clone()),
        }
    }

    /// The options a local definition carries, as `(deterministic, external_state_policy,
    /// auto_shard_policy)`; `None` for a dataset read from the service.
    fn def_options(&self) -> Option<(Option<bool>, i32, i32)> {
        match &self.pipeline {
            Pipeline::Local(d) => {
                let o = d.def().options.unwrap_or_default();
                Some((
                    o.deterministic,
                    o.external_state_policy,
                    o.auto_shard_policy,
                ))
            }
            Pipeline::Service(_) => None,
        }
    }

    fn filter(&self, predicate: &str) -> Dataset {
        chain!(self, |d| d.filter(predicate))
    }

    fn batch(&self, batch_size: u64, drop_remainder: bool) -> Dataset {
        chain!(self, |d| d.batch_with(batch_size, drop_remainder))
    }

    #[pyo3(signature = (buffer_size, seed=None))]
    fn shuffle(&self, buffer_size: u64, seed: Option<u64>) -> Dataset {
        chain!(self, |d| d.shuffle(buffer_size, seed))
    }

    /// `None`: forever.
    #[pyo3(signature = (count=None))]
    fn repeat(&self, count: Option<u64>) -> Dataset {
        match count {
            Some(n) => chain!(self, |d| d.repeat(n)),
            None => chain!(self, |d| d.repeat_forever()),
        }
    }

    fn take(&self, count: u64) -> Dataset {
        chain!(self, |d| d.take(count))
    }

    fn skip(&self, count: u64) -> Dataset {
        chain!(self, |d| d.skip(count))
    }

    fn shard(&self, num_shards: u64, index: u64) -> Dataset {
        chain!(self, |d| d.shard(num_shards, index))
    }

    fn prefetch(&self, buffer_size: u64) -> Dataset {
        chain!(self, |d| d.prefetch(buffer_size))
    }

    fn enumerate(&self, start: i64) -> Dataset {
        chain!(self, |d| d.enumerate_from(start))
    }

    #[pyo3(signature = (key, channels))]
    fn decode_image(&self, key: Option<&str>, channels: u32) -> Dataset {
        chain!(self, |d| d.decode_image(key, channels))
    }

    #[pyo3(signature = (key, height, width))]
    fn resize(&self, key: Option<&str>, height: u64, width: u64) -> Dataset {
        chain!(self, |d| d.resize(key, height, width))
    }

    /// `features`: `(name, var_len, dtype, shape, default)`, `default` `None` or
    /// `(dtype, shape, data)` as `tensor_from_parts` takes it. Checked here, so a bad feature
    /// is an error at the call, as in tf.data.
    #[allow(clippy::type_complexity)]
    fn parse_example<'py>(
        &self,
        features: Vec<(
            String,
            bool,
            String,
            Vec<u64>,
            Option<(String, Vec<usize>, Bound<'py, PyAny>)>,
        )>,
    ) -> PyResult<Dataset> {
        let mut specs = Vec::with_capacity(features.len());
        for (name, var_len, dtype, shape, default) in features {
            let dtype: DType = dtype.parse().map_err(dataset_error)?;
            specs.push(if var_len {
                var_len_feature(&name, dtype)
            } else {
                let default = default
                    .map(|(d, s, data)| tensor_from_parts(&d, s, &data))
                    .transpose()?;
                fixed_len_feature(&name, shape, dtype, default)
            });
        }
        ExampleParser::new(&pb::ParseExampleOp {
            features: specs.clone(),
        })
        .map_err(dataset_error)?;
        Ok(chain!(self, |d| d.parse_example(specs)))
    }

    /// A user's Python function: `kind` a `PyFunctionKind`, `pickled` what
    /// `sluice._functions.pickle_function` made, `output_spec` `None` or a structure of
    /// `TensorSpec`s.
    #[pyo3(signature = (kind, pickled, name, python_version, cloudpickle_version, num_parallel_calls, output_spec=None))]
    #[allow(clippy::too_many_arguments)]
    fn py_function(
        &self,
        kind: i32,
        pickled: &Bound<'_, PyBytes>,
        name: String,
        python_version: String,
        cloudpickle_version: String,
        num_parallel_calls: u32,
        output_spec: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Dataset> {
        let output_spec = output_spec.map(spec_from_py).transpose()?;
        let op = pb::PyFunctionOp {
            kind,
            pickled: pickled.as_bytes().to_vec(),
            name,
            python_version,
            cloudpickle_version,
            num_parallel_calls,
            output_spec: output_spec.map(|s| s.to_proto()),
        };
        Ok(chain!(self, |d| d.py_function(op.clone())))
    }

    fn is_service(&self) -> bool {
        matches!(self.pipeline, Pipeline::Service(_))
    }

    /// The element spec, as `sluice.data.TensorSpec` leaves. Parts known only from elements (a
    /// Python function's output without an output spec) are the first element's: a local
    /// dataset produces one here, once; a dataset read from the service takes them from the
    /// first element an epoch read, and fails before that.
    fn element_spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let spec = self.static_spec()?;
        if !spec.has_unknown() {
            return spec_to_py(py, &spec);
        }
        if let Some(known) = self.first_spec.get() {
            return spec_to_py(py, known);
        }
        let def = match &self.pipeline {
            Pipeline::Local(d) => d.def().clone(),
            Pipeline::Service(_) => {
                return Err(error(
                    "FailedPreconditionError",
                    "the element spec of this dataset is known only from its first element \
                     (a Python function's output): read an element first, or give the \
                     function its output_signature (e.g. \
                     `map(f, output_signature=sluice.data.TensorSpec((), \"int64\"))`)"
                        .to_string(),
                ))
            }
        };
        let first = py
            .detach(
                || -> Result<Option<Element>, sluice_element::DatasetError> {
                    iterate(&def, &local_options())?.next().transpose()
                },
            )
            .map_err(dataset_error)?;
        let Some(first) = first else {
            return Err(error(
                "FailedPreconditionError",
                "the element spec of this dataset is known only from its first element (a \
                 Python function's output), and it has none: give the function its \
                 output_signature"
                    .to_string(),
            ));
        };
        spec_to_py(py, self.first_spec.get_or_init(|| spec.filled_from(&first)))
    }

    /// Takes `spec` (`TensorSpec`s in tuples and dicts) as the element spec where it is known
    /// only from elements, as `from_dataset_id(element_spec=...)` gives it for a dataset
    /// whose Python function has no output spec.
    fn assume_element_spec(&self, spec: &Bound<'_, PyAny>) -> PyResult<()> {
        let spec = spec_from_py(spec)?;
        let _ = self.first_spec.set(spec);
        Ok(())
    }

    /// tf's cardinality: a count, `-1` infinite, `-2` unknown.
    fn cardinality(&self) -> PyResult<i64> {
        match &self.pipeline {
            Pipeline::Local(d) => Ok(cardinality(d.def())),
            Pipeline::Service(d) => Ok(d.cardinality()),
        }
    }

    /// The dataset id of a service pipeline.
    fn dataset_id(&self) -> Option<String> {
        match &self.pipeline {
            Pipeline::Local(_) => None,
            Pipeline::Service(d) => Some(d.dataset_id().to_string()),
        }
    }

    fn __repr__(&self) -> String {
        match &self.pipeline {
            Pipeline::Local(d) => d.to_string(),
            Pipeline::Service(d) => {
                let job = d
                    .job_name()
                    .map(|name| format!(", job_name={name:?}"))
                    .unwrap_or_default();
                format!(
                    "{}.distribute({}, dataset_id={:?}{job}){}",
                    render_def(d.definition()),
                    d.processing_mode(),
                    d.dataset_id(),
                    render_ops(d.local_ops())
                )
            }
        }
    }

    /// Makes the next `iter()` resume the epoch at `state` (a dict `Iterator.state_dict()`
    /// returned): checked here (its keys, its format, its job against this dataset's), and by
    /// the dispatcher when the epoch starts (its dataset definition, its step).
    fn load_state_dict(&self, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let state = state_from_py(state)?;
        service_of(&self.pipeline)?
            .load_state(state)
            .map_err(client_error)
    }

    /// A new epoch: local execution, or a new iteration of the service's job.
    fn iter(&self, py: Python<'_>) -> PyResult<Iterator> {
        let spec = self.static_spec()?;
        let first_spec = (spec.has_unknown() && self.first_spec.get().is_none())
            .then(|| (spec, self.first_spec.clone()));
        let closed = Closed::default();
        let service = match &self.pipeline {
            Pipeline::Local(_) => None,
            Pipeline::Service(d) => Some(ServiceDataset::clone(d)),
        };
        let source = match &self.pipeline {
            Pipeline::Local(d) => {
                let def = d.def().clone();
                let options = ExecOptions {
                    cancel: closed.local.clone(),
                    ..local_options()
                };
                let elements = py
                    .detach(|| iterate(&def, &options))
                    .map_err(dataset_error)?;
                Source::Local(elements)
            }
            Pipeline::Service(d) => {
                let d = ServiceDataset::clone(d);
                let stream = crate::runtime::wait(py, async move { d.iter().await })?
                    .map_err(client_error)?;
                Source::Service(Box::new(stream))
            }
        };
        Ok(Iterator {
            source: Mutex::new(Some(source)),
            first_spec: Mutex::new(first_spec),
            closed,
            service,
        })
    }
}

/// The service dataset of `pipeline`, which a reader's state needs (see `check_stateful`).
/// The local definitions of a nested op's inputs; a dataset read from the service is refused.
fn local_inputs(inputs: &[PyRef<'_, Dataset>], op: &str) -> PyResult<Vec<LocalDataset>> {
    inputs
        .iter()
        .map(|d| match &d.pipeline {
            Pipeline::Local(l) => Ok(l.clone()),
            Pipeline::Service(_) => Err(invalid_argument(format!(
                "{op} takes datasets built here, not datasets read from the service"
            ))),
        })
        .collect()
}

/// A nested definition, checked (element specs compatible, arguments sane) before it is used.
fn checked(dataset: LocalDataset) -> PyResult<Dataset> {
    sluice_pipeline::validate(dataset.def(), &ExecOptions::default().registry)
        .map_err(dataset_error)?;
    Ok(Dataset::new(Pipeline::Local(dataset)))
}

fn service_of(pipeline: &Pipeline) -> PyResult<&ServiceDataset> {
    match pipeline {
        Pipeline::Local(_) => Err(no_local_state()),
        Pipeline::Service(d) => {
            check_stateful(d)?;
            Ok(d)
        }
    }
}

fn no_local_state() -> PyErr {
    error(
        "FailedPreconditionError",
        "a dataset iterated in this process has no reader state: states are of datasets read \
         through the service (`distribute` or `from_dataset_id` with a `job_name`)"
            .to_string(),
    )
}

/// A reader's state needs no ops after `distribute`: what they hold between elements is not
/// part of one. (The Rust client refuses to take such a state; this refuses to restore one.)
fn check_stateful(d: &ServiceDataset) -> PyResult<()> {
    if d.local_ops().is_empty() {
        return Ok(());
    }
    Err(error(
        "FailedPreconditionError",
        format!(
            "a reader with ops after `distribute` ({}) takes no state (what they hold between \
             elements is not part of one): move them before `distribute`",
            render_ops(d.local_ops()).trim_start_matches('.')
        ),
    ))
}

/// How this process runs a pipeline itself: Python functions in this interpreter.
fn local_options() -> ExecOptions {
    ExecOptions {
        python: Some(in_process::runner()),
        ..ExecOptions::default()
    }
}

enum Source {
    Local(ElementIter),
    Service(Box<ElementStream>),
}

/// How long `close` waits for the dispatcher to hear that a reader has gone.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// One epoch of a dataset. Ends (and releases the epoch) at the end or after an error. Weakly
/// referenceable, so the Python layer can close the live ones when the interpreter exits.
#[pyclass(frozen, weakref, module = "sluice._native")]
pub struct Iterator {
    /// Held by a `next` while it waits (without the GIL) for an element.
    source: Mutex<Option<Source>>,
    /// The dataset's static spec and where its first element's spec goes, until this epoch
    /// produced one (only when the static spec has parts known from elements alone).
    first_spec: Mutex<Option<(ElementSpec, Arc<OnceLock<ElementSpec>>)>>,
    /// Set by `close` before it takes the lock: a `next` waiting in another thread ends at
    /// once (as the end of the epoch) instead of holding the lock until an element comes.
    closed: Closed,
    /// The dataset of a service epoch, which `load_state_dict` restarts.
    service: Option<ServiceDataset>,
}

/// An iterator's `close`, seen by a `next` that waits: the service stream's wait and the local
/// pipeline's ops both watch it.
struct Closed {
    stream: CancellationToken,
    local: Cancellation,
}

impl Default for Closed {
    fn default() -> Closed {
        Closed {
            stream: CancellationToken::new(),
            // `Cancellation::default()` is one that is never set.
            local: Cancellation::new(),
        }
    }
}

impl Closed {
    fn close(&self) {
        self.stream.cancel();
        self.local.cancel();
    }

    fn is_closed(&self) -> bool {
        self.stream.is_cancelled()
    }
}

/// The stream's next element, or `None` once the iterator is closed.
async fn next_or_closed(
    stream: &mut ElementStream,
    closed: &CancellationToken,
) -> Option<Result<Element, ClientError>> {
    tokio::select! {
        biased;
        _ = closed.cancelled() => None,
        next = stream.next() => next,
    }
}

#[pymethods]
impl Iterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let next = self.next_element(py)?;
        next.map(|e| element_to_py(py, e)).transpose()
    }

    /// The reader's state: what `__next__` has returned so far in this epoch, as a dict of
    /// `str` and `int`. Elements buffered and not yet returned are not part of it.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if let Some(dataset) = &self.service {
            check_stateful(dataset)?;
        }
        let mut guard = lock(py, &self.source)?;
        let stream = match guard.as_mut() {
            Some(Source::Service(stream)) => stream,
            Some(Source::Local(_)) => return Err(no_local_state()),
            None => return Err(epoch_over()),
        };
        let state = wait_pinned(py, stream.state())?.map_err(client_error)?;
        drop(guard);
        state_to_py(py, &state)
    }

    /// Restarts this epoch at `state` (as `Dataset.load_state_dict` and a new `iter()` do),
    /// dropping what this iterator had buffered.
    fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let state = state_from_py(state)?;
        let Some(dataset) = self.service.clone() else {
            return Err(no_local_state());
        };
        check_stateful(&dataset)?;
        if self.closed.is_closed() {
            return Err(error(
                "FailedPreconditionError",
                "this iterator was closed: load the state into its dataset \
                 (`Dataset.load_state_dict`) and start a new `iter()`"
                    .to_string(),
            ));
        }
        dataset.load_state(state).map_err(client_error)?;
        let mut guard = lock(py, &self.source)?;
        let old = guard.take();
        py.detach(|| drop(old));
        let stream = wait(py, async move { dataset.iter().await })?.map_err(client_error)?;
        *guard = Some(Source::Service(Box::new(stream)));
        Ok(())
    }

    /// Ends the epoch now, and waits until the service has released this client (at most
    /// `RELEASE_WAIT`). Dropping the iterator releases it too, without waiting. A `next` that
    /// another thread is waiting in ends as if the epoch had.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.closed.close();
        let source = lock(py, &self.source)?.take();
        match source {
            Some(Source::Service(stream)) => wait(py, stream.close(RELEASE_WAIT)),
            other => {
                py.detach(|| drop(other));
                Ok(())
            }
        }
    }
}

impl Iterator {
    fn next_element(&self, py: Python<'_>) -> PyResult<Option<Element>> {
        let mut guard = lock(py, &self.source)?;
        let Some(source) = guard.as_mut() else {
            return Ok(None);
        };
        if self.closed.is_closed() {
            return Ok(None);
        }
        let closed = &self.closed.stream;
        let result = match source {
            Source::Local(elements) => match py.detach(|| elements.next()) {
                None => None,
                Some(Err(DatasetError::Cancelled)) if self.closed.is_closed() => None,
                Some(Ok(e)) => Some(Ok(e)),
                Some(Err(e)) => Some(Err(dataset_error(e))),
            },
            Source::Service(stream) => match wait_borrowed!(py, next_or_closed(stream, closed))? {
                None => None,
                Some(Ok(e)) => Some(Ok(e)),
                Some(Err(e)) => Some(Err(client_error(e))),
            },
        };
        match result {
            Some(Ok(e)) => {
                if let Some((spec, cell)) = lock(py, &self.first_spec)?.take() {
                    cell.get_or_init(|| spec.filled_from(&e));
                }
                Ok(Some(e))
            }
            None => {
                *guard = None;
                Ok(None)
            }
            Some(Err(e)) => {
                *guard = None;
                Err(e)
            }
        }
    }
}

/// How long `lock` sleeps between tries while another thread holds the lock.
const LOCK_RETRY: Duration = Duration::from_millis(2);

/// Locks `mutex` without blocking while holding the GIL: another thread reading the same
/// iterator holds the lock while it waits without the GIL, and needs the GIL back to finish.
/// Between tries it sleeps without the GIL (it used to yield, which kept a core busy for as long
/// as the other thread waited) and lets the interpreter's signal handlers run, so Ctrl-C stops
/// it.
pub(crate) fn lock<'a, T>(py: Python<'_>, mutex: &'a Mutex<T>) -> PyResult<MutexGuard<'a, T>> {
    loop {
        match mutex.try_lock() {
            Ok(guard) => return Ok(guard),
            Err(TryLockError::WouldBlock) => {
                py.detach(|| std::thread::sleep(LOCK_RETRY));
                py.check_signals()?;
            }
            Err(TryLockError::Poisoned(_)) => {
                return Err(invalid_argument(
                    "the iterator was poisoned by a panic in another thread",
                ))
            }
        }
    }
}
