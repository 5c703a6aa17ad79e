//! Static analysis of a definition: `element_spec`, `cardinality` and `validate`, all computed
//! from the definition alone (no elements are produced, no files are read).
//!
//! `cardinality` follows tf.data's rules, including its conventions for infinite (`INFINITE`) and
//! unknown (`UNKNOWN`) inputs.

use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::{pb, DType, DatasetError, Element, ElementSpec};

use crate::batching;
use crate::example_spec::ExampleSpec;
use crate::group_by_window;
use crate::image_spec;
use crate::interleave;
use crate::python_op;
use crate::registry::FunctionRegistry;
use crate::slices::{self, Slices};
use crate::source_rules::{range_len, Reading};

/// Cardinality of a dataset that never ends.
pub const INFINITE: i64 = -1;
/// Cardinality that cannot be known statically (files, filter).
pub const UNKNOWN: i64 = -2;

/// The spec of the elements `def` produces, computed statically. Map functions contribute
/// through their registered `SpecFn`.
pub fn element_spec(
    def: &pb::DatasetDef,
    registry: &FunctionRegistry,
) -> Result<ElementSpec, DatasetError> {
    ops_element_spec(element_spec_of_source(def, registry)?, &def.ops, registry)
}

/// The spec of the elements of `def`'s source.
pub(crate) fn element_spec_of_source(
    def: &pb::DatasetDef,
    registry: &FunctionRegistry,
) -> Result<ElementSpec, DatasetError> {
    Ok(match def.source.as_ref().and_then(|s| s.kind.as_ref()) {
        None => return Err(DatasetError::invalid("dataset definition has no source")),
        Some(SourceKind::Range(_)) => ElementSpec::scalar(DType::Int64),
        Some(SourceKind::Slices(s)) if slices::source_names_blobs(s) => slices::proto_rows(s)?.0,
        Some(SourceKind::Slices(s)) => Slices::from_proto(s)?.row_spec(),
        Some(SourceKind::Files(_)) => ElementSpec::scalar(DType::String),
        Some(SourceKind::Random(_)) => ElementSpec::scalar(DType::Int64),
        Some(SourceKind::Tensors(pb::TensorsSource { value: Some(v) }))
            if slices::names_blobs(v) =>
        {
            slices::proto_spec(v)?
        }
        Some(SourceKind::Tensors(t)) => tensors_value(t)?.spec(),
        Some(SourceKind::Zip(z)) => {
            check_zip(z)?;
            let specs = z
                .inputs
                .iter()
                .map(|d| element_spec(d, registry))
                .collect::<Result<Vec<_>, _>>()?;
            if z.keys.is_empty() {
                ElementSpec::Tuple(specs)
            } else {
                ElementSpec::Dict(z.keys.iter().cloned().zip(specs).collect())
            }
        }
        Some(SourceKind::Sample(s)) => {
            check_sample(s)?;
            common_input_spec(&s.inputs, registry)?
        }
        Some(SourceKind::Choose(c)) => {
            let choice = choice_of(c)?;
            if element_spec(choice, registry)? != ElementSpec::scalar(DType::Int64) {
                return Err(DatasetError::invalid(
                    "Invalid `choice_dataset`. Elements of `choice_dataset` must be scalar of \
                     type `tf.int64`.",
                ));
            }
            common_input_spec(&c.inputs, registry)?
        }
        Some(SourceKind::Element(_)) => return Err(element_source_outside_template()),
    })
}

fn element_source_outside_template() -> DatasetError {
    DatasetError::invalid(
        "an element source is only valid as the source of a template (interleave, group_by_window)",
    )
}

/// The spec after `ops` of elements of spec `input`: what a chain of ops applied after the
/// service (or any stream) produces.
pub fn ops_element_spec(
    input: ElementSpec,
    ops: &[pb::Op],
    registry: &FunctionRegistry,
) -> Result<ElementSpec, DatasetError> {
    let mut spec = input;
    for op in ops {
        spec = match &op.kind {
            None => return Err(DatasetError::invalid("dataset definition has an empty op")),
            Some(OpKind::Map(m)) => registry.map_fn(&m.function)?.1(&spec)?,
            Some(OpKind::Filter(f)) => {
                registry.filter_fn(&f.predicate)?;
                spec
            }
            Some(OpKind::Batch(b)) => spec.batched(b.batch_size, b.drop_remainder),
            Some(OpKind::Enumerate(_)) => {
                ElementSpec::Tuple(vec![ElementSpec::scalar(DType::Int64), spec])
            }
            Some(OpKind::DecodeImage(d)) => image_spec::decode_image_spec(d, spec)?,
            Some(OpKind::Resize(r)) => image_spec::resize_spec(r, spec)?,
            Some(OpKind::ParseExample(p)) => {
                ExampleSpec::check_input(&spec)?;
                ExampleSpec::new(p)?.element_spec()
            }
            Some(OpKind::PyFunction(f)) => python_op::output_spec(f, spec)?,
            Some(OpKind::PaddedBatch(p)) => batching::padded_batch_spec(p, &spec)?,
            Some(OpKind::Unbatch(_)) => batching::unbatch_spec(&spec)?,
            Some(OpKind::Concatenate(c)) => {
                let other = c
                    .other
                    .as_ref()
                    .ok_or_else(|| DatasetError::invalid("concatenate has no dataset to append"))?;
                let other_spec = element_spec(other, registry)?;
                common_spec(&spec, &other_spec).ok_or_else(|| {
                    DatasetError::invalid(format!(
                        "Incompatible dataset elements:\n  {spec} vs.   {other_spec}"
                    ))
                })?
            }
            Some(OpKind::Interleave(i)) => interleave::output_spec(i, spec, registry)?,
            Some(OpKind::GroupByWindow(g)) => group_by_window::output_spec(g, spec, registry)?,
            Some(OpKind::TakeWhile(t)) => {
                registry.filter_fn(&t.predicate)?;
                spec
            }
            Some(
                OpKind::IgnoreErrors(_)
                | OpKind::Cache(_)
                | OpKind::Shuffle(_)
                | OpKind::Repeat(_)
                | OpKind::Take(_)
                | OpKind::Skip(_)
                | OpKind::Shard(_)
                | OpKind::Prefetch(_),
            ) => spec,
        };
    }
    Ok(spec)
}

/// Number of elements `def` produces, `INFINITE` or `UNKNOWN`, with tf.data's rules.
pub fn cardinality(def: &pb::DatasetDef) -> i64 {
    let mut n = match def.source.as_ref().and_then(|s| s.kind.as_ref()) {
        None => return UNKNOWN,
        Some(SourceKind::Range(r)) => clamp(range_len(r.start, r.stop, r.step)),
        Some(SourceKind::Slices(s)) => match slices::proto_len(s) {
            Some(d) => clamp(d),
            None => UNKNOWN,
        },
        // A list of names is as long as its expansion.
        Some(SourceKind::Files(fs))
            if fs.format() == pb::FileFormat::Names && !fs.files.is_empty() =>
        {
            clamp(fs.files.len() as u64)
        }
        Some(SourceKind::Files(_) | SourceKind::Element(_)) => UNKNOWN,
        Some(SourceKind::Random(_)) => INFINITE,
        Some(SourceKind::Tensors(_)) => 1,
        // tf.data's: the shortest input, an unknown input making it unknown.
        Some(SourceKind::Zip(z)) => {
            let cards: Vec<i64> = z.inputs.iter().map(cardinality).collect();
            if cards.is_empty() {
                0
            } else if cards.contains(&UNKNOWN) {
                UNKNOWN
            } else {
                cards
                    .into_iter()
                    .filter(|c| *c != INFINITE)
                    .min()
                    .unwrap_or(INFINITE)
            }
        }
        Some(SourceKind::Sample(s)) => mixed_cardinality(&s.inputs, s.stop_on_empty_dataset),
        Some(SourceKind::Choose(c)) => match c.choice.first().map(cardinality) {
            Some(0) => 0,
            _ => UNKNOWN,
        },
    };
    for (i, op) in def.ops.iter().enumerate() {
        n = match &op.kind {
            None => UNKNOWN,
            Some(
                OpKind::Map(_)
                | OpKind::Shuffle(_)
                | OpKind::Prefetch(_)
                | OpKind::Enumerate(_)
                | OpKind::DecodeImage(_)
                | OpKind::Resize(_)
                | OpKind::ParseExample(_),
            ) => n,
            // As tf.data: how many elements pass a predicate, or how many the inner datasets
            // have, is not known statically.
            Some(
                OpKind::Filter(_)
                | OpKind::TakeWhile(_)
                | OpKind::Interleave(_)
                | OpKind::GroupByWindow(_),
            ) => UNKNOWN,
            // Any element may be dropped; an endless input stays endless.
            Some(OpKind::IgnoreErrors(_)) => match n {
                INFINITE => INFINITE,
                _ => UNKNOWN,
            },
            Some(OpKind::Cache(_)) => n,
            // tf.data's rule: the input's count times the first dimension, when the input's
            // spec knows it.
            Some(OpKind::Unbatch(_)) => match n {
                INFINITE | UNKNOWN => n,
                _ => {
                    let prefix = pb::DatasetDef {
                        source: def.source.clone(),
                        ops: def.ops[..i].to_vec(),
                        options: None,
                    };
                    let known = element_spec(&prefix, &FunctionRegistry::global())
                        .ok()
                        .and_then(|spec| batching::unbatch_batch_dim(&spec).ok().flatten());
                    match known {
                        Some(d) => n.saturating_mul(clamp(d as u64)),
                        None => UNKNOWN,
                    }
                }
            },
            Some(OpKind::Concatenate(c)) => {
                let other = c.other.as_ref().map_or(UNKNOWN, cardinality);
                match (n, other) {
                    (UNKNOWN, _) | (_, UNKNOWN) => UNKNOWN,
                    (INFINITE, _) | (_, INFINITE) => INFINITE,
                    (a, b) => a.saturating_add(b),
                }
            }
            Some(OpKind::PyFunction(f)) => match python_op::kind_of(f) {
                Ok(pb::PyFunctionKind::Map) => n,
                _ => UNKNOWN,
            },
            Some(OpKind::Batch(b)) => batched_cardinality(n, b.batch_size, b.drop_remainder),
            Some(OpKind::PaddedBatch(b)) => batched_cardinality(n, b.batch_size, b.drop_remainder),
            Some(OpKind::Repeat(r)) => match r.count {
                None if n == 0 => 0,
                None => INFINITE,
                Some(0) => 0,
                Some(_) if n == INFINITE || n == UNKNOWN => n,
                Some(c) => n.saturating_mul(clamp(c)),
            },
            Some(OpKind::Take(t)) => match n {
                UNKNOWN => UNKNOWN,
                INFINITE => clamp(t.count),
                _ => n.min(clamp(t.count)),
            },
            Some(OpKind::Skip(s)) => match n {
                INFINITE | UNKNOWN => n,
                _ => (n - n.min(clamp(s.count))).max(0),
            },
            Some(OpKind::Shard(s)) => match n {
                INFINITE | UNKNOWN => n,
                // The number of shards is only known once the HINT policy resolves it.
                _ if s.hint => UNKNOWN,
                _ if s.num_shards == 0 => UNKNOWN,
                _ => {
                    let shards = clamp(s.num_shards);
                    let index = clamp(s.index);
                    n / shards + i64::from(index < n % shards)
                }
            },
        };
    }
    n
}

/// tf.data's `batch` cardinality.
fn batched_cardinality(n: i64, batch_size: u64, drop_remainder: bool) -> i64 {
    match n {
        INFINITE | UNKNOWN => n,
        _ if batch_size == 0 => UNKNOWN,
        _ => {
            let size = clamp(batch_size);
            if drop_remainder {
                n / size
            } else {
                n / size + i64::from(n % size != 0)
            }
        }
    }
}

/// The choice dataset of `choose_from_datasets` (its list holds exactly one).
pub fn choice_of(c: &pb::ChooseSource) -> Result<&pb::DatasetDef, DatasetError> {
    match c.choice.as_slice() {
        [choice] => Ok(choice),
        _ => Err(DatasetError::invalid(
            "choose_from_datasets needs exactly one choice dataset",
        )),
    }
}

/// The one element of a `from_tensors` source.
pub fn tensors_value(t: &pb::TensorsSource) -> Result<Element, DatasetError> {
    let value = t
        .value
        .as_ref()
        .ok_or_else(|| DatasetError::invalid("from_tensors has no value"))?;
    slices::structure_from_proto(value)
}

fn check_zip(z: &pb::ZipSource) -> Result<(), DatasetError> {
    if z.inputs.is_empty() {
        return Err(DatasetError::invalid(
            "Invalid `datasets`. `datasets` should not be empty.",
        ));
    }
    if !z.keys.is_empty() {
        if z.keys.len() != z.inputs.len() {
            return Err(DatasetError::invalid(format!(
                "zip has {} keys for {} datasets",
                z.keys.len(),
                z.inputs.len()
            )));
        }
        if z.keys.windows(2).any(|w| w[0] >= w[1]) {
            return Err(DatasetError::invalid("zip keys must be unique and sorted"));
        }
    }
    Ok(())
}

/// `sample_from_datasets`' argument checks: inputs present, one finite non-negative weight per
/// input (or none).
pub(crate) fn check_sample(s: &pb::SampleSource) -> Result<(), DatasetError> {
    if s.inputs.is_empty() {
        return Err(DatasetError::invalid(
            "Invalid `datasets`. `datasets` should not be empty.",
        ));
    }
    if !s.weights.is_empty() {
        if s.weights.len() != s.inputs.len() {
            return Err(DatasetError::invalid(format!(
                "Invalid `weights`. The shape of `weights` should be compatible with \
                 `[len(datasets)]` but is [{}] for {} datasets.",
                s.weights.len(),
                s.inputs.len()
            )));
        }
        if s.weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
            return Err(DatasetError::invalid(
                "Invalid `weights`. Every weight must be finite and not negative.",
            ));
        }
    }
    Ok(())
}

/// The spec every input of sample or choose shares: their most specific common spec; inputs
/// whose structures or dtypes differ are refused as tf.data refuses them.
fn common_input_spec(
    inputs: &[pb::DatasetDef],
    registry: &FunctionRegistry,
) -> Result<ElementSpec, DatasetError> {
    let Some(first) = inputs.first() else {
        return Err(DatasetError::invalid(
            "Invalid `datasets`. `datasets` should not be empty.",
        ));
    };
    let mut spec = element_spec(first, registry)?;
    for (i, input) in inputs.iter().enumerate().skip(1) {
        let other = element_spec(input, registry)?;
        spec = common_spec(&spec, &other).ok_or_else(|| {
            DatasetError::invalid(format!(
                "Invalid `datasets`. The elements of all datasets must have compatible \
                 structures and types: dataset 0 has {spec}, dataset {i} has {other}."
            ))
        })?;
    }
    Ok(spec)
}

/// The most specific spec both `a` and `b` fit (tf.data's most specific common supertype):
/// the same structure and dtypes, each dimension kept where both agree and unknown where they
/// differ. `None` when structures, dtypes or ranks differ. An unknown spec (a Python op's
/// output before its first element) is compatible with anything and stays unknown.
pub fn common_spec(a: &ElementSpec, b: &ElementSpec) -> Option<ElementSpec> {
    Some(match (a, b) {
        (ElementSpec::Unknown, _) | (_, ElementSpec::Unknown) => ElementSpec::Unknown,
        (
            ElementSpec::Tensor { dtype, shape },
            ElementSpec::Tensor {
                dtype: d2,
                shape: s2,
            },
        ) => {
            if dtype != d2 || shape.len() != s2.len() {
                return None;
            }
            let shape = shape
                .iter()
                .zip(s2)
                .map(|(x, y)| if x == y { *x } else { None })
                .collect();
            ElementSpec::Tensor {
                dtype: *dtype,
                shape,
            }
        }
        (ElementSpec::Tuple(x), ElementSpec::Tuple(y)) if x.len() == y.len() => ElementSpec::Tuple(
            x.iter()
                .zip(y)
                .map(|(p, q)| common_spec(p, q))
                .collect::<Option<_>>()?,
        ),
        (ElementSpec::Dict(x), ElementSpec::Dict(y))
            if x.len() == y.len() && x.keys().eq(y.keys()) =>
        {
            ElementSpec::Dict(
                x.iter()
                    .zip(y.values())
                    .map(|((k, p), q)| Some((k.clone(), common_spec(p, q)?)))
                    .collect::<Option<_>>()?,
            )
        }
        _ => return None,
    })
}

/// sample_from_datasets' cardinality, tf.data's rule: infinite when an input is infinite and
/// drawing goes on past the ends of the others (or when every input is infinite), otherwise
/// not known statically.
fn mixed_cardinality(inputs: &[pb::DatasetDef], stop_on_empty: bool) -> i64 {
    let cards: Vec<i64> = inputs.iter().map(cardinality).collect();
    if cards.is_empty() {
        return 0;
    }
    let infinite = |c: &i64| *c == INFINITE;
    if cards.iter().all(infinite) || (!stop_on_empty && cards.iter().any(infinite)) {
        return INFINITE;
    }
    if cards.iter().all(|c| *c == 0) {
        return 0;
    }
    UNKNOWN
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Checks a definition before it is registered or run: a source is present and sane (range
/// step not zero, slices tensor of rank >= 1, files pattern or list present), every op is
/// well-formed (batch size, shuffle buffer and number of shards positive, shard index in range),
/// every function exists in `registry`, and the element spec is computable.
pub fn validate(def: &pb::DatasetDef, registry: &FunctionRegistry) -> Result<(), DatasetError> {
    match def.source.as_ref().and_then(|s| s.kind.as_ref()) {
        None => return Err(DatasetError::invalid("dataset definition has no source")),
        Some(SourceKind::Range(r)) => {
            if r.step == 0 {
                return Err(DatasetError::invalid("range step must not be zero"));
            }
        }
        Some(SourceKind::Slices(s)) if slices::source_names_blobs(s) => {
            slices::proto_rows(s)?;
        }
        Some(SourceKind::Slices(s)) => {
            Slices::from_proto(s)?;
        }
        Some(SourceKind::Files(fs)) => {
            if fs.pattern.is_empty() && fs.files.is_empty() {
                return Err(DatasetError::invalid(
                    "files source has neither a pattern nor files",
                ));
            }
            if fs.format() == pb::FileFormat::Unspecified {
                return Err(DatasetError::invalid(
                    "files source has no format (lines or tfrecord)",
                ));
            }
            Reading::from_proto(fs)?;
        }
        Some(SourceKind::Random(_)) => {}
        Some(SourceKind::Tensors(pb::TensorsSource { value: Some(v) }))
            if slices::names_blobs(v) =>
        {
            slices::proto_spec(v)?;
        }
        Some(SourceKind::Tensors(t)) => {
            tensors_value(t)?;
        }
        Some(SourceKind::Zip(_) | SourceKind::Sample(_) | SourceKind::Choose(_)) => {
            for input in crate::nested::source_children(def) {
                validate(input, registry)?;
            }
        }
        Some(SourceKind::Element(_)) => return Err(element_source_outside_template()),
    }
    validate_ops(&def.ops, registry)?;
    element_spec(def, registry).map(|_| ())
}

/// Checks each op of a chain as `validate` does (an interleave's template included), without
/// computing the element spec.
pub(crate) fn validate_ops(
    ops: &[pb::Op],
    registry: &FunctionRegistry,
) -> Result<(), DatasetError> {
    for op in ops {
        match &op.kind {
            None => return Err(DatasetError::invalid("dataset definition has an empty op")),
            Some(OpKind::Map(m)) => {
                registry.map_fn(&m.function)?;
            }
            Some(OpKind::Filter(f)) => {
                registry.filter_fn(&f.predicate)?;
            }
            Some(OpKind::ParseExample(p)) => {
                ExampleSpec::new(p)?;
            }
            Some(OpKind::Concatenate(c)) => match &c.other {
                Some(other) => validate(other, registry)?,
                None => {
                    return Err(DatasetError::invalid(
                        "concatenate has no dataset to append",
                    ))
                }
            },
            Some(OpKind::PyFunction(f)) => {
                python_op::check(f)?;
                if matches!(
                    python_op::kind_of(f)?,
                    pb::PyFunctionKind::Interleave | pb::PyFunctionKind::GroupReduce
                ) {
                    return Err(DatasetError::invalid(format!(
                        "python function '{}' of kind {} is only valid inside its op",
                        f.name,
                        python_op::syntax_name(f)
                    )));
                }
            }
            Some(OpKind::Interleave(i)) => interleave::check(i, registry)?,
            Some(OpKind::GroupByWindow(g)) => group_by_window::check(g, registry)?,
            Some(OpKind::TakeWhile(t)) => {
                registry.filter_fn(&t.predicate)?;
            }
            Some(OpKind::Batch(b)) if b.batch_size == 0 => {
                return Err(DatasetError::invalid("batch size must be positive, got 0"));
            }
            Some(OpKind::Shuffle(s)) if s.buffer_size == 0 => {
                return Err(DatasetError::invalid(
                    "shuffle buffer size must be positive, got 0",
                ));
            }
            // A placeholder is valid in a definition (it is registered, then resolved on each
            // worker); the executor refuses to run it unresolved.
            Some(OpKind::Shard(s)) if s.hint => {}
            Some(OpKind::Shard(s)) if s.num_shards == 0 => {
                return Err(DatasetError::invalid(
                    "number of shards must be positive, got 0",
                ));
            }
            Some(OpKind::Shard(s)) if s.index >= s.num_shards => {
                return Err(DatasetError::invalid(format!(
                    "shard index {} must be less than the number of shards {}",
                    s.index, s.num_shards
                )));
            }
            Some(OpKind::DecodeImage(d)) => image_spec::check_decode_image(d)?,
            Some(OpKind::Resize(r)) => image_spec::check_resize(r)?,
            Some(OpKind::PaddedBatch(p)) => batching::check_padded_batch(p)?,
            Some(OpKind::Cache(c)) => check_cache(c)?,
            Some(OpKind::Unbatch(_) | OpKind::IgnoreErrors(_)) => {}
            Some(
                OpKind::Batch(_)
                | OpKind::Shuffle(_)
                | OpKind::Shard(_)
                | OpKind::Repeat(_)
                | OpKind::Take(_)
                | OpKind::Skip(_)
                | OpKind::Prefetch(_)
                | OpKind::Enumerate(_),
            ) => {}
        }
    }
    Ok(())
}

/// A cache's file name: empty (memory) or a path without NUL bytes, and not a directory name.
fn check_cache(c: &pb::CacheOp) -> Result<(), DatasetError> {
    if c.snapshot && c.filename.is_empty() {
        return Err(DatasetError::invalid(
            "snapshot needs a directory: give a path",
        ));
    }
    if c.filename.contains('\0') {
        return Err(DatasetError::invalid(
            "cache filename must not contain a NUL byte",
        ));
    }
    if c.filename.ends_with('/') && !c.snapshot {
        return Err(DatasetError::invalid(format!(
            "cache filename '{}' names a directory; give a file name",
            c.filename
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "analysis_tests.rs"]
mod tests;
