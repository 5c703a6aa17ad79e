//! The rules of `interleave` (`pb::InterleaveOp`): its arguments' checks, its output's spec, and
//! its *template*, the definition each outer element becomes (`resolve_template`). Running it is
//! the executor's (`ops::interleave` in `sluice-executor`).
//!
//! A template is a definition of its own whose source is usually an `ElementSource`: the outer
//! element, known only when the template runs (`TFRecordDataset(f)` for a file name `f`,
//! `from_tensor_slices(x)` for a tensor `x`). A template may also have an ordinary source (the
//! same inner dataset for every element). Templates nest (an interleave inside a template); the
//! pipeline limits count their ops and their nesting (`limits`).

use sluice_element::pb::element_source::Kind as ElementKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::{pb, DType, DatasetError, Element, ElementSpec};

use crate::analysis::{element_spec_of_source, ops_element_spec, validate_ops};
use crate::python_op;
use crate::registry::FunctionRegistry;
use crate::slices::{drop_first_dim, Slices};

/// The most inner datasets read at once by a parallel interleave (each has a reading thread):
/// a larger `cycle_length` with `num_parallel_calls` is refused.
pub const MAX_PARALLEL_CYCLE_LENGTH: u64 = 256;

/// The most inner datasets a sequential interleave keeps open.
pub const MAX_CYCLE_LENGTH: u64 = 1 << 16;

/// Checks the op's arguments and its template or function, as tf.data checks them.
pub fn check(op: &pb::InterleaveOp, registry: &FunctionRegistry) -> Result<(), DatasetError> {
    if op.block_length == 0 {
        return Err(DatasetError::invalid(
            "block_length must be greater than zero.",
        ));
    }
    if op.cycle_length > MAX_CYCLE_LENGTH {
        return Err(DatasetError::invalid(format!(
            "interleave cycle_length {} is more than the limit of {MAX_CYCLE_LENGTH}",
            op.cycle_length
        )));
    }
    if op.num_parallel_calls.is_some() && op.cycle_length > MAX_PARALLEL_CYCLE_LENGTH {
        return Err(DatasetError::invalid(format!(
            "a parallel interleave reads at most {MAX_PARALLEL_CYCLE_LENGTH} inner datasets at \
             once, got cycle_length {}",
            op.cycle_length
        )));
    }
    match (&op.template, &op.function) {
        (Some(template), None) => check_template(template, registry),
        (None, Some(f)) => {
            python_op::check(f)?;
            if python_op::kind_of(f)? != pb::PyFunctionKind::Interleave {
                return Err(DatasetError::invalid(format!(
                    "interleave's python function '{}' is not of kind interleave",
                    f.name
                )));
            }
            Ok(())
        }
        (None, None) => Err(DatasetError::invalid(
            "interleave has neither a template nor a python function",
        )),
        (Some(_), Some(_)) => Err(DatasetError::invalid(
            "interleave has both a template and a python function",
        )),
    }
}

fn check_template(
    template: &pb::DatasetDef,
    registry: &FunctionRegistry,
) -> Result<(), DatasetError> {
    match template.source.as_ref().and_then(|s| s.kind.as_ref()) {
        Some(SourceKind::Element(e)) => match &e.kind {
            None => {
                return Err(DatasetError::invalid(
                    "interleave template's element source has no kind",
                ))
            }
            Some(ElementKind::Files(f)) => {
                reading_of(f)?;
            }
            Some(ElementKind::Slices(_)) => {}
            Some(ElementKind::Window(_)) => return Err(window_outside_group()),
        },
        // An ordinary source: the same inner dataset for every element.
        _ => return crate::analysis::validate(template, registry),
    }
    validate_ops(&template.ops, registry)
}

fn window_outside_group() -> DatasetError {
    DatasetError::invalid("a window source is only valid in group_by_window's reduce template")
}

/// How an element source's files are read; compression applies to tfrecord files only.
fn reading_of(f: &pb::ElementFiles) -> Result<crate::source_rules::Reading, DatasetError> {
    match f.format() {
        pb::FileFormat::Unspecified => {
            return Err(DatasetError::invalid(
                "interleave template's files source has no format (lines or tfrecord)",
            ))
        }
        pb::FileFormat::Names => {
            return Err(DatasetError::invalid(
                "interleave template's files source reads its file (lines or tfrecord), not its \
                 name",
            ))
        }
        pb::FileFormat::Lines | pb::FileFormat::Tfrecord => {}
    }
    crate::source_rules::Reading::from_proto(&pb::FilesSource {
        pattern: "<element>".to_string(),
        format: f.format,
        files: Vec::new(),
        compression: f.compression,
    })
}

/// The spec of the op's output for outer elements of spec `input`.
pub(crate) fn output_spec(
    op: &pb::InterleaveOp,
    input: ElementSpec,
    registry: &FunctionRegistry,
) -> Result<ElementSpec, DatasetError> {
    match (&op.template, &op.function) {
        (Some(template), _) => {
            let source = match template.source.as_ref().and_then(|s| s.kind.as_ref()) {
                Some(SourceKind::Element(e)) => element_source_spec(e, input)?,
                _ => element_spec_of_source(template, registry)?,
            };
            ops_element_spec(source, &template.ops, registry)
        }
        (None, Some(f)) => python_op::output_spec(f, input),
        (None, None) => Err(DatasetError::invalid(
            "interleave has neither a template nor a python function",
        )),
    }
}

/// The spec of an element source built from elements of spec `input`.
fn element_source_spec(
    e: &pb::ElementSource,
    input: ElementSpec,
) -> Result<ElementSpec, DatasetError> {
    match &e.kind {
        None => Err(DatasetError::invalid("interleave template's element source has no kind")),
        Some(ElementKind::Files(_)) => match &input {
            ElementSpec::Unknown => Ok(ElementSpec::scalar(DType::String)),
            ElementSpec::Tensor { dtype: DType::String, shape } if shape.is_empty() => {
                Ok(ElementSpec::scalar(DType::String))
            }
            other => Err(DatasetError::invalid(format!(
                "interleave reads files named by scalar string elements, got elements of spec {other}"
            ))),
        },
        Some(ElementKind::Slices(_)) => {
            check_sliceable(&input)?;
            Ok(drop_first_dim(input))
        }
        Some(ElementKind::Window(_)) => Err(window_outside_group()),
    }
}

/// Every component of `spec` has a first dimension to slice along.
fn check_sliceable(spec: &ElementSpec) -> Result<(), DatasetError> {
    match spec {
        ElementSpec::Tensor { shape, .. } if shape.is_empty() => Err(DatasetError::invalid(
            "from_slices needs a tensor of rank at least 1, got a scalar",
        )),
        ElementSpec::Tensor { .. } | ElementSpec::Unknown => Ok(()),
        ElementSpec::Tuple(items) => items.iter().try_for_each(check_sliceable),
        ElementSpec::Dict(fields) => fields.values().try_for_each(check_sliceable),
    }
}

/// The definition of the inner dataset for outer element `element`: the template with its
/// element source replaced by the source the element makes (a one-file files source, or a
/// slices source of the element). A template with an ordinary source is returned as it is.
pub fn resolve_template(
    template: &pb::DatasetDef,
    element: &Element,
) -> Result<pb::DatasetDef, DatasetError> {
    let Some(SourceKind::Element(e)) = template.source.as_ref().and_then(|s| s.kind.as_ref())
    else {
        return Ok(template.clone());
    };
    let source = match &e.kind {
        None => {
            return Err(DatasetError::invalid(
                "interleave template's element source has no kind",
            ))
        }
        Some(ElementKind::Files(f)) => {
            let name = match element {
                Element::Tensor(t) if t.rank() == 0 => t.strings().and_then(|s| s.first()).cloned(),
                _ => None,
            };
            let Some(name) = name else {
                return Err(DatasetError::invalid(format!(
                    "interleave reads files named by scalar string elements, got an element of \
                     spec {}",
                    element.spec()
                )));
            };
            let name = String::from_utf8(name.to_vec()).map_err(|_| {
                DatasetError::invalid("interleave: a file name element is not valid UTF-8")
            })?;
            SourceKind::Files(pb::FilesSource {
                pattern: name.clone(),
                format: f.format,
                files: vec![name],
                compression: f.compression,
            })
        }
        Some(ElementKind::Slices(_)) => {
            SourceKind::Slices(Slices::new(element.clone())?.to_proto())
        }
        Some(ElementKind::Window(_)) => return Err(window_outside_group()),
    };
    Ok(pb::DatasetDef {
        source: Some(pb::Source { kind: Some(source) }),
        ops: template.ops.clone(),
        options: template.options,
    })
}

#[cfg(test)]
#[path = "interleave_tests.rs"]
mod tests;
