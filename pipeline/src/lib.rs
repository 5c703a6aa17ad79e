//! Sluice's pipeline definitions (`pb::DatasetDef`): a tf.data-like builder and a text syntax
//! for them, their static analysis (element spec, cardinality, validation), the auto-shard
//! rewrite, split counts, the function registry with its built-in functions, and each op's rules
//! (its arguments' checks and its output's spec). Pure: no file I/O, no execution; reading files
//! is `sluice-formats`', running pipelines `sluice-executor`'s.
//!
//! Layout:
//! - `dataset`: the `Dataset` builder, `FilesBuilder`, and the `Transform` trait.
//! - `render`: `render_def` and `render_ops`, definitions to the text syntax.
//! - `lexer`: tokens of the expression syntax, with columns.
//! - `parser`: `parse` and `parse_ops`, text to definitions, with positioned errors; its
//!   children `parser_ops` (transformations), `parser_literals` (list literals to tensors),
//!   `parser_features` (`parse_example` and `tfrecord` arguments) and `parser_image` (image op
//!   arguments).
//! - `analysis`: `element_spec`, `cardinality` and `validate` of a definition.
//! - `nested`: the definitions a definition holds (zip, sample, choose inputs, concatenate's
//!   other), and walks over a whole tree without recursion.
//! - `limits`: `PipelineLimits`, the most ops and the deepest structures a server builds.
//! - `autoshard`: `auto_shard`, tf.data's auto-shard rewrite for static sharding policies.
//! - `splits`: `split_providers` (every splittable source of a definition, in tf.data's
//!   depth-first order), `num_split_providers`, `num_splits` and `split_counts`, for
//!   distributed_epoch.
//! - `slices`: the columns of a slices source (a tensor, or a tuple or dict of them), by row.
//! - `source_rules`: range lengths, how a files source is read (`Reading`), its file list.
//! - `image_spec`: the rules of `decode_image` and `resize`, with their bounds.
//! - `example_spec`: the rules of `parse_example`: feature specs checked into an `ExampleSpec`.
//! - `group_by_window`: the rules of `group_by_window` (its key, window size and reduce).
//! - `interleave`: the rules of `interleave` and of its template (`resolve_template`).
//! - `python_op`: the rules of a Python op (kind, well-formedness, output spec).
//! - `registry`: `FunctionRegistry` of named map and filter functions.
//! - `builtins`: the built-in functions (`identity`, `square`, `is_even`, ...).

mod analysis;
mod autoshard;
pub mod batching;
mod builtins;
mod dataset;
pub mod example_spec;
pub mod group_by_window;
pub mod image_spec;
pub mod interleave;
mod lexer;
mod limits;
pub mod nested;
mod parser;
pub mod python_op;
mod registry;
mod render;
mod slices;
pub mod source_rules;
mod splits;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod linear_ops_tests;

pub use analysis::{
    cardinality, choice_of, common_spec, element_spec, ops_element_spec, tensors_value, validate,
    INFINITE, UNKNOWN,
};
pub use autoshard::{auto_shard, AutoShardPolicy};
pub use dataset::{merge_options, Dataset, FilesBuilder, Transform};
pub use example_spec::{fixed_len_feature, var_len_feature, ExampleSpec};
pub use image_spec::{MAX_IMAGE_BYTES, MAX_IMAGE_SIDE};
pub use limits::{
    nested_size, nesting_depth, PipelineLimits, DEFAULT_MAX_PIPELINE_DEPTH,
    DEFAULT_MAX_PIPELINE_OPS,
};
pub use parser::{parse, parse_ops};
pub use registry::{FunctionRegistry, MapFn, PredicateFn, SpecFn};
pub use render::{render_def, render_ops};
pub use slices::Slices;
pub use splits::{
    check_distributed_epoch, no_random_splits, num_split_providers, num_splits, split_counts,
    split_providers,
};
