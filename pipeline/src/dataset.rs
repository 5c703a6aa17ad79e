//! `Dataset`: a Rust builder for `pb::DatasetDef` mirroring tf.data, and the `Transform` trait
//! that gives any dataset-like type the tf.data methods. Rendering to the text syntax is
//! `render`'s.

use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::{pb, DatasetError, Element, Tensor};

use crate::slices::Slices;

/// A pipeline definition under construction: a source and ops in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Dataset {
    def: pb::DatasetDef,
}

/// The half-built `files(pattern)` source; choose the format with `lines()` or `tfrecord()`.
#[derive(Debug, Clone, PartialEq)]
pub struct FilesBuilder {
    pattern: String,
}

impl FilesBuilder {
    /// Every line of every file, without its `\n` / `\r\n`, as a scalar string.
    pub fn lines(self) -> Dataset {
        self.with_format(pb::FileFormat::Lines, pb::RecordCompression::None)
    }

    /// Every record of every TFRecord file as a scalar string.
    pub fn tfrecord(self) -> Dataset {
        self.tfrecord_compressed(pb::RecordCompression::None)
    }

    /// Every record of every TFRecord file, each file compressed as a whole (GZIP or ZLIB, as
    /// TensorFlow's `TFRecordDataset(compression_type=...)` reads them).
    pub fn tfrecord_compressed(self, compression: pb::RecordCompression) -> Dataset {
        self.with_format(pb::FileFormat::Tfrecord, compression)
    }

    /// The files' names, one scalar string each, in the sorted order of the expansion
    /// (tf.data's `list_files(pattern, shuffle=False)`); the files are not read.
    pub fn names(self) -> Dataset {
        self.with_format(pb::FileFormat::Names, pb::RecordCompression::None)
    }

    fn with_format(self, format: pb::FileFormat, compression: pb::RecordCompression) -> Dataset {
        Dataset::with_source(SourceKind::Files(pb::FilesSource {
            pattern: self.pattern,
            format: format as i32,
            files: Vec::new(),
            compression: compression as i32,
        }))
    }
}

impl Dataset {
    fn with_source(kind: SourceKind) -> Dataset {
        Dataset {
            def: pb::DatasetDef {
                source: Some(pb::Source { kind: Some(kind) }),
                ops: Vec::new(),
                options: None,
            },
        }
    }

    /// `0, 1, ..., stop - 1` as int64 scalars.
    pub fn range(stop: i64) -> Dataset {
        Dataset::range_with(0, stop, 1)
    }

    /// `start, start + step, ...` up to (excluding) `stop`; `step` may be negative, not zero.
    pub fn range_with(start: i64, stop: i64, step: i64) -> Dataset {
        Dataset::with_source(SourceKind::Range(pb::RangeSource { start, stop, step }))
    }

    /// The rows of `t` along its first dimension.
    pub fn from_slices(t: Tensor) -> Dataset {
        Dataset::with_source(SourceKind::Slices(pb::SlicesSource {
            tensor: Some(t.to_proto()),
            structure: None,
        }))
    }

    /// The rows of a tuple or dict (nested) of tensors sliced together along their first
    /// dimension, as tf.data's `from_tensor_slices` of a structure: row `i` has the columns'
    /// structure with each tensor's slice `i`. Fails for a scalar column or for columns whose
    /// first dimensions differ (`Dimensions 3 and 2 are not compatible`, as tf).
    pub fn from_structured_slices(columns: Element) -> Result<Dataset, DatasetError> {
        let slices = Slices::new(columns)?;
        Ok(Dataset::with_source(SourceKind::Slices(slices.to_proto())))
    }

    /// tf.data's `Dataset.random(seed)`: pseudo-random int64 scalars without end, the same
    /// stream on every run for a given seed; `None` draws a seed per iteration. It has no
    /// splits, so distributed_epoch refuses it (as tf.data, which has no split provider for it).
    pub fn random(seed: Option<u64>) -> Dataset {
        Dataset::with_source(SourceKind::Random(pb::RandomSource { seed }))
    }

    /// tf.data's `with_options`: the fields set in `options` replace the definition's, the
    /// others stay (a later call wins field by field).
    pub fn with_options(mut self, options: &pb::DatasetOptions) -> Dataset {
        self.def.options = Some(merge_options(self.def.options.take(), options));
        self
    }

    /// One element, `value` itself (a tensor, or a tuple or dict of them), as tf.data's
    /// `from_tensors`.
    pub fn from_tensors(value: &Element) -> Dataset {
        Dataset::with_source(SourceKind::Tensors(pb::TensorsSource {
            value: Some(crate::slices::structure_to_proto(value)),
        }))
    }

    /// tf.data's `zip` of a tuple of datasets: element i is the tuple of the inputs' elements i;
    /// it ends with the shortest input. Nest zips for nested tuples.
    pub fn zip(inputs: Vec<Dataset>) -> Dataset {
        Dataset::with_source(SourceKind::Zip(pb::ZipSource {
            inputs: inputs.into_iter().map(Dataset::into_def).collect(),
            keys: Vec::new(),
        }))
    }

    /// tf.data's `zip` of a dict of datasets: element i is the dict of the inputs' elements i
    /// under their keys (kept sorted, as dict specs are).
    pub fn zip_dict(mut inputs: Vec<(String, Dataset)>) -> Dataset {
        inputs.sort_by(|a, b| a.0.cmp(&b.0));
        let (keys, inputs): (Vec<String>, Vec<pb::DatasetDef>) =
            inputs.into_iter().map(|(k, d)| (k, d.into_def())).unzip();
        Dataset::with_source(SourceKind::Zip(pb::ZipSource { inputs, keys }))
    }

    /// tf.data's `sample_from_datasets`: each element comes from an input drawn at random with
    /// probability proportional to `weights` (equal when `None`).
    pub fn sample_from_datasets(
        inputs: Vec<Dataset>,
        weights: Option<Vec<f64>>,
        seed: Option<u64>,
        stop_on_empty_dataset: bool,
    ) -> Dataset {
        Dataset::with_source(SourceKind::Sample(pb::SampleSource {
            inputs: inputs.into_iter().map(Dataset::into_def).collect(),
            weights: weights.unwrap_or_default(),
            seed,
            stop_on_empty_dataset,
        }))
    }

    /// tf.data's `choose_from_datasets`: `choice` (int64 scalars) picks the input of each element.
    pub fn choose_from_datasets(
        inputs: Vec<Dataset>,
        choice: Dataset,
        stop_on_empty_dataset: bool,
    ) -> Dataset {
        Dataset::with_source(SourceKind::Choose(pb::ChooseSource {
            inputs: inputs.into_iter().map(Dataset::into_def).collect(),
            choice: vec![choice.into_def()],
            stop_on_empty_dataset,
        }))
    }

    /// Files matching a glob pattern, expanded at registration (see `expand_files`).
    pub fn files(pattern: &str) -> FilesBuilder {
        FilesBuilder {
            pattern: pattern.to_string(),
        }
    }

    /// The source of an interleave template (see `Transform::interleave`): every line of the
    /// file the outer element names, as `TextLineDataset(f)`.
    pub fn element_lines() -> Dataset {
        Dataset::element_source(pb::element_source::Kind::Files(pb::ElementFiles {
            format: pb::FileFormat::Lines as i32,
            compression: pb::RecordCompression::None as i32,
        }))
    }

    /// The source of an interleave template: every record of the TFRecord file the outer
    /// element names, as `TFRecordDataset(f, compression_type)`.
    pub fn element_tfrecord(compression: pb::RecordCompression) -> Dataset {
        Dataset::element_source(pb::element_source::Kind::Files(pb::ElementFiles {
            format: pb::FileFormat::Tfrecord as i32,
            compression: compression as i32,
        }))
    }

    /// The source of an interleave template: the outer element sliced along its first
    /// dimension, as `from_tensor_slices(x)`.
    pub fn element_slices() -> Dataset {
        Dataset::element_source(pb::element_source::Kind::Slices(pb::ElementSlices {}))
    }

    /// The source of a group_by_window's reduce template: the elements of one window.
    pub fn element_window() -> Dataset {
        Dataset::element_source(pb::element_source::Kind::Window(pb::ElementWindow {}))
    }

    fn element_source(kind: pb::element_source::Kind) -> Dataset {
        Dataset::with_source(SourceKind::Element(pb::ElementSource { kind: Some(kind) }))
    }

    pub fn from_def(def: pb::DatasetDef) -> Dataset {
        Dataset { def }
    }

    pub fn def(&self) -> &pb::DatasetDef {
        &self.def
    }

    pub fn into_def(self) -> pb::DatasetDef {
        self.def
    }
}

/// tf.data's transformations, for any type that can append an op to its definition. The
/// client's service-backed dataset implements `push_op` and gets the same methods.
pub trait Transform: Sized {
    fn push_op(self, op: pb::Op) -> Self;

    fn map(self, function: &str) -> Self {
        self.push_op(op(OpKind::Map(pb::MapOp {
            function: function.to_string(),
        })))
    }

    fn filter(self, predicate: &str) -> Self {
        self.push_op(op(OpKind::Filter(pb::FilterOp {
            predicate: predicate.to_string(),
        })))
    }

    fn batch(self, n: u64) -> Self {
        self.batch_with(n, false)
    }

    fn batch_with(self, n: u64, drop_remainder: bool) -> Self {
        self.push_op(op(OpKind::Batch(pb::BatchOp {
            batch_size: n,
            drop_remainder,
        })))
    }

    fn shuffle(self, buffer: u64, seed: Option<u64>) -> Self {
        self.push_op(op(OpKind::Shuffle(pb::ShuffleOp {
            buffer_size: buffer,
            seed,
        })))
    }

    fn repeat(self, count: u64) -> Self {
        self.push_op(op(OpKind::Repeat(pb::RepeatOp { count: Some(count) })))
    }

    fn repeat_forever(self) -> Self {
        self.push_op(op(OpKind::Repeat(pb::RepeatOp { count: None })))
    }

    fn take(self, n: u64) -> Self {
        self.push_op(op(OpKind::Take(pb::TakeOp { count: n })))
    }

    fn skip(self, n: u64) -> Self {
        self.push_op(op(OpKind::Skip(pb::SkipOp { count: n })))
    }

    fn shard(self, num_shards: u64, index: u64) -> Self {
        self.push_op(op(OpKind::Shard(pb::ShardOp {
            num_shards,
            index,
            hint: false,
        })))
    }

    /// tf.data's `shard(SHARD_HINT, SHARD_HINT)`: the HINT sharding policy replaces it by
    /// `shard(num_workers, worker_index)` on each worker (see `auto_shard`); running it
    /// unresolved is an error.
    fn shard_hint(self) -> Self {
        self.push_op(op(OpKind::Shard(pb::ShardOp {
            num_shards: 0,
            index: 0,
            hint: true,
        })))
    }

    fn prefetch(self, n: u64) -> Self {
        self.push_op(op(OpKind::Prefetch(pb::PrefetchOp { buffer_size: n })))
    }

    /// `(index, element)` tuples with an int64 scalar index counting from 0, as tf.data's
    /// `enumerate()`. Through the service, sorting by the index recovers the dataset's order.
    fn enumerate(self) -> Self {
        self.enumerate_from(0)
    }

    /// `enumerate` counting from `start`.
    fn enumerate_from(self, start: i64) -> Self {
        self.push_op(op(OpKind::Enumerate(pb::EnumerateOp { start })))
    }

    /// Decodes JPEG or PNG bytes (the element, a scalar string, or its dict entry `key`) to a
    /// uint8 `[height, width, channels]` tensor; `channels` is 1, 3 or 4.
    fn decode_image(self, key: Option<&str>, channels: u32) -> Self {
        self.push_op(op(OpKind::DecodeImage(pb::DecodeImageOp {
            key: key.map(str::to_string),
            channels,
        })))
    }

    /// Resizes a uint8 or float32 `[h, w, c]` image (the element, or its dict entry `key`)
    /// bilinearly to `[height, width, c]`.
    fn resize(self, key: Option<&str>, height: u64, width: u64) -> Self {
        self.push_op(op(OpKind::Resize(pb::ResizeOp {
            key: key.map(str::to_string),
            height,
            width,
        })))
    }

    /// Parses each scalar string element, a serialized `tf.train.Example`, into a dict with one
    /// tensor per feature (see `fixed_len_feature`, `var_len_feature`). Features are kept
    /// sorted by name, as dict specs are.
    fn parse_example(self, mut features: Vec<pb::FeatureSpec>) -> Self {
        features.sort_by(|a, b| a.name.cmp(&b.name));
        self.push_op(op(OpKind::ParseExample(pb::ParseExampleOp { features })))
    }

    /// tf.data's `padded_batch`: batches of `n` elements, each component padded first, with
    /// `padding_values` (one scalar per component, flattened as `padded_shapes`), to its padded
    /// shape: one `dims` per component (tuples in order, dicts by sorted key, depth first), -1 a
    /// dimension padded to the batch's largest. Empty `padded_shapes`: every dimension to the
    /// batch's largest; empty `padding_values`: 0, false or "".
    fn padded_batch(
        self,
        n: u64,
        drop_remainder: bool,
        padded_shapes: Vec<Vec<i64>>,
        padding_values: Vec<Tensor>,
    ) -> Self {
        self.push_op(op(OpKind::PaddedBatch(pb::PaddedBatchOp {
            batch_size: n,
            drop_remainder,
            padded_shapes: padded_shapes
                .into_iter()
                .map(|dims| pb::PaddedBatchShape { dims })
                .collect(),
            padding_values: padding_values.iter().map(Tensor::to_proto).collect(),
        })))
    }

    /// tf.data's `unbatch`: each element's components split along their (common) first
    /// dimension into that many elements.
    fn unbatch(self) -> Self {
        self.push_op(op(OpKind::Unbatch(pb::UnbatchOp {})))
    }

    /// tf.data's `ignore_errors`: elements whose upstream failed are dropped (logged when
    /// `log_warning`); cancellation and the service's own failures still end the pipeline.
    fn ignore_errors(self, log_warning: bool) -> Self {
        self.push_op(op(OpKind::IgnoreErrors(pb::IgnoreErrorsOp { log_warning })))
    }

    /// tf.data's `cache(filename)`: the first pass is kept, in memory (`""`) or in a file, and
    /// later passes (after a `repeat`) replay it.
    fn cache(self, filename: &str) -> Self {
        self.push_op(op(OpKind::Cache(pb::CacheOp {
            filename: filename.to_string(),
            snapshot: false,
        })))
    }

    /// tf.data's `snapshot(path)`: the first complete pass is written to a file in the directory
    /// `path`, named by the fingerprint of the dataset before it, and every later pass, in this
    /// run or a later one, reads it instead of the upstream.
    fn snapshot(self, path: &str) -> Self {
        self.push_op(op(OpKind::Cache(pb::CacheOp {
            filename: path.to_string(),
            snapshot: true,
        })))
    }

    /// tf.data's `interleave(map_func, cycle_length, block_length)`: each element becomes the
    /// dataset `template` (whose source is usually an element source, e.g.
    /// `Dataset::element_tfrecord`), and `cycle_length` of them (0: the CPU count, as
    /// AUTOTUNE) are read in turn, `block_length` elements each, in tf.data's order. Read one
    /// after another in the caller's thread; see `parallel_interleave`.
    fn interleave(self, template: Dataset, cycle_length: u64, block_length: u64) -> Self {
        self.push_op(op(OpKind::Interleave(pb::InterleaveOp {
            template: Some(template.into_def()),
            function: None,
            cycle_length,
            block_length,
            num_parallel_calls: None,
        })))
    }

    /// `interleave` with `num_parallel_calls`: the open inner datasets are read ahead
    /// concurrently, at most `num_parallel_calls` at a time (0: as many as `cycle_length`).
    /// The order is the same as `interleave`'s.
    fn parallel_interleave(
        self,
        template: Dataset,
        cycle_length: u64,
        block_length: u64,
        num_parallel_calls: u64,
    ) -> Self {
        self.push_op(op(OpKind::Interleave(pb::InterleaveOp {
            template: Some(template.into_def()),
            function: None,
            cycle_length,
            block_length,
            num_parallel_calls: Some(num_parallel_calls),
        })))
    }

    /// tf.data's `take_while(predicate)`: the elements before the first one for which the
    /// named predicate is false.
    fn take_while(self, predicate: &str) -> Self {
        self.push_op(op(OpKind::TakeWhile(pb::TakeWhileOp {
            predicate: predicate.to_string(),
        })))
    }

    /// tf.data's `group_by_window`: elements are grouped by the int64 scalar key the named map
    /// function gives; a group of `window_size` elements (and each group left at the end, in
    /// key order) becomes the dataset `reduce` (whose source is `Dataset::element_window()`),
    /// whose elements are yielded.
    fn group_by_window(self, key: &str, window_size: u64, reduce: Dataset) -> Self {
        self.push_op(op(OpKind::GroupByWindow(pb::GroupByWindowOp {
            key_function: None,
            window_size,
            window_size_function: None,
            reduce: Some(reduce.into_def()),
            reduce_function: None,
            key: key.to_string(),
        })))
    }

    /// A group_by_window op as built elsewhere (the Python package's, with Python functions).
    fn group_by_window_op(self, group: pb::GroupByWindowOp) -> Self {
        self.push_op(op(OpKind::GroupByWindow(group)))
    }

    /// An interleave op as built elsewhere (the Python package's, with a Python function).
    fn interleave_op(self, interleave: pb::InterleaveOp) -> Self {
        self.push_op(op(OpKind::Interleave(interleave)))
    }

    /// A user's Python function (map, filter or flat_map), pickled by the Python package. It
    /// runs where the pipeline runs, with the runner of `ExecOptions::python`.
    fn py_function(self, function: pb::PyFunctionOp) -> Self {
        self.push_op(op(OpKind::PyFunction(function)))
    }

    /// Every element of this dataset, then every element of `other` (tf.data's `concatenate`;
    /// the element specs must be compatible).
    fn concatenate(self, other: pb::DatasetDef) -> Self {
        self.push_op(op(OpKind::Concatenate(pb::ConcatenateOp {
            other: Some(other),
        })))
    }
}

/// `base` with the fields set in `over` replaced, as tf.data merges `Options`.
pub fn merge_options(
    base: Option<pb::DatasetOptions>,
    over: &pb::DatasetOptions,
) -> pb::DatasetOptions {
    let mut merged = base.unwrap_or_default();
    if over.deterministic.is_some() {
        merged.deterministic = over.deterministic;
    }
    if over.external_state_policy != 0 {
        merged.external_state_policy = over.external_state_policy;
    }
    if over.auto_shard_policy != 0 {
        merged.auto_shard_policy = over.auto_shard_policy;
    }
    merged
}

fn op(kind: OpKind) -> pb::Op {
    pb::Op { kind: Some(kind) }
}

impl Transform for Dataset {
    fn push_op(mut self, op: pb::Op) -> Self {
        self.def.ops.push(op);
        self
    }
}
