//! Sluice's data model and local execution: tensors and elements, element specs, the pipeline
//! definition (`pb::DatasetDef`) with a tf.data-like builder and a text syntax, the synchronous
//! executor, split providers for distributed_epoch, file sources (text lines, TFRecord), the
//! function registry, and the element wire codec. No networking and no async: workers and
//! clients drive these iterators from their own threads.
//!
//! Layout:
//! - `error`: `DatasetError`, the crate's one error type, with `is_retryable`.
//! - `dtype`: `DType` and its proto conversions.
//! - `tensor`: `Tensor`, dense data as little-endian `Bytes` or byte strings.
//! - `element`: `Element` (tensor, tuple, dict) and its JSON form.
//! - `spec`: `ElementSpec`, the static type of elements, and its proto form.
//! - `analysis`: `element_spec`, `cardinality` and `validate` of a definition.
//! - `autoshard`: `auto_shard`, tf.data's auto-shard rewrite for static sharding policies.
//! - `dataset`: the `Dataset` builder, the `Transform` trait, rendering to text.
//! - `lexer`: tokens of the expression syntax, with columns.
//! - `parser`: `parse` and `parse_ops`, text to definitions, with positioned errors.
//! - `example_parser`: `ExampleParser`, the `parse_example` op on serialized tf.train.Example.
//! - `registry`: `FunctionRegistry` of named map and filter functions.
//! - `builtins`: the built-in functions (`identity`, `square`, `is_even`, ...).
//! - `executor`: `iterate` and `apply_ops`, definitions to element iterators.
//! - `memory_budget`: `MemoryBudget`, the bytes pipelines may hold in buffers, and the
//!   `Reservation` each buffering op takes on it.
//! - `cancellation`: `Cancellation`, the flag that stops a pipeline inside its ops.
//! - `ops`: the stateful op iterators (batch, shuffle, repeat, prefetch).
//! - `slices`: the columns of a slices source (a tensor, or a tuple or dict of them), by row.
//! - `sources`: range, slices and files sources, whole or split by split.
//! - `data_roots`: `DataRoots`, the directories a server may read files from, and the check.
//! - `file_access`: `FileAccess`, unrestricted (the user's own process) or a server's roots.
//! - `files`: glob expansion (`expand_files`) and reading lines or records of one file, with
//!   the bounds on matches and line length.
//! - `image_ops`: the native `decode_image` (JPEG, PNG) and `resize` ops, with their bounds.
//! - `tfrecord`: the TFRecord format, reader and writer.
//! - `tfrecord_file`: `TfRecordFile`, a TFRecord file written plain, GZIP or ZLIB.
//! - `record_origin`: `RecordOrigin`, the file and record of an element, for errors that name it.
//! - `python_fn`: the `PythonRunner` and `PythonFunction` traits that run users' Python ops,
//!   and `PythonException`, what such a function raised.
//! - `splits`: split providers and the `SplitSupplier` the worker implements.
//! - `codec`: `encode_element` / `decode_element`, the wire form of one element.

pub use sluice_proto::dataset as pb;

mod analysis;
mod autoshard;
mod builtins;
mod cancellation;
pub mod codec;
mod data_roots;
mod dataset;
mod dtype;
mod element;
mod error;
mod example_parser;
mod executor;
mod file_access;
mod files;
mod image_ops;
mod lexer;
mod memory_budget;
mod ops;
mod packed;
mod parser;
mod python_fn;
mod record_origin;
mod registry;
mod slices;
mod sources;
mod spec;
mod splits;
mod tensor;
pub mod tfrecord;
mod tfrecord_file;

#[cfg(test)]
mod fuzz_tests;

pub use analysis::{cardinality, element_spec, ops_element_spec, validate, INFINITE, UNKNOWN};
pub use autoshard::{auto_shard, AutoShardPolicy};
pub use cancellation::Cancellation;
pub use codec::{
    decode_element, decode_element_bytes, decode_element_parts, encode_element,
    encode_element_append, Compression,
};
pub use data_roots::DataRoots;
pub use dataset::{render_def, render_ops, Dataset, FilesBuilder, Transform};
pub use dtype::DType;
pub use element::Element;
pub use error::DatasetError;
pub use example_parser::{fixed_len_feature, serialize_example, var_len_feature, ExampleParser};
pub use executor::{apply_ops, iterate, ElementIter, ExecOptions};
pub use file_access::FileAccess;
pub use files::{expand_files, MAX_LINE_BYTES, MAX_MATCHED_FILES};
pub use image_ops::{MAX_IMAGE_BYTES, MAX_IMAGE_SIDE};
pub use memory_budget::{element_bytes, MemoryBudget, Reservation, ELEMENT_OVERHEAD_BYTES};
pub use packed::{Packed, PackedBuilder, PackedDecoder};
pub use parser::{parse, parse_ops};
pub use python_fn::{CallResult, PythonException, PythonFunction, PythonRunner};
pub use record_origin::{RecordOrigin, RecordPosition};
pub use registry::{FunctionRegistry, MapFn, PredicateFn, SpecFn};
pub use spec::ElementSpec;
pub use splits::{num_split_providers, num_splits, SplitSupplier};
pub use tensor::{Tensor, TensorValue};
pub use tfrecord_file::TfRecordFile;
