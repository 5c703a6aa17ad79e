//! Static analysis of a definition: `element_spec`, `cardinality` and `validate`, all computed
//! from the definition alone (no elements are produced, no files are read).
//!
//! `cardinality` follows tf.data's rules, including its conventions for infinite (`INFINITE`) and
//! unknown (`UNKNOWN`) inputs.

use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::{pb, DType, DatasetError, ElementSpec};

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
    ops_element_spec(element_spec_of_source(def)?, &def.ops, registry)
}

/// The spec of the elements of `def`'s source.
pub(crate) fn element_spec_of_source(def: &pb::DatasetDef) -> Result<ElementSpec, DatasetError> {
    Ok(match def.source.as_ref().and_then(|s| s.kind.as_ref()) {
        None => return Err(DatasetError::invalid("dataset definition has no source")),
        Some(SourceKind::Range(_)) => ElementSpec::scalar(DType::Int64),
        Some(SourceKind::Slices(s)) => Slices::from_proto(s)?.row_spec(),
        Some(SourceKind::Files(_)) => ElementSpec::scalar(DType::String),
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
            Some(OpKind::Interleave(i)) => interleave::output_spec(i, spec, registry)?,
            Some(OpKind::GroupByWindow(g)) => group_by_window::output_spec(g, spec, registry)?,
            Some(OpKind::TakeWhile(t)) => {
                registry.filter_fn(&t.predicate)?;
                spec
            }
            Some(
                OpKind::Shuffle(_)
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
        Some(SourceKind::Files(_) | SourceKind::Element(_)) => UNKNOWN,
    };
    for op in &def.ops {
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
            Some(OpKind::PyFunction(f)) => match python_op::kind_of(f) {
                Ok(pb::PyFunctionKind::Map) => n,
                _ => UNKNOWN,
            },
            Some(OpKind::Batch(b)) => match n {
                INFINITE | UNKNOWN => n,
                _ if b.batch_size == 0 => UNKNOWN,
                _ => {
                    let size = clamp(b.batch_size);
                    if b.drop_remainder {
                        n / size
                    } else {
                        n / size + i64::from(n % size != 0)
                    }
                }
            },
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

#[cfg(test)]
#[path = "analysis_tests.rs"]
mod tests;
