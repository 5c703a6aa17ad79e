//! The rules of `group_by_window` (`pb::GroupByWindowOp`): its arguments' checks, with tf.data's
//! texts, and its output's spec. Running it is the executor's (`ops::group_by_window`).
//!
//! The key and the window size come from Python functions (or the key from a registered map
//! function); the reduction is a template whose source is the window (`ElementWindow`), run
//! natively, or a Python function given the key and the window.

use sluice_element::pb::element_source::Kind as ElementKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::{pb, DatasetError, ElementSpec};

use crate::analysis::{ops_element_spec, validate_ops};
use crate::python_op;
use crate::registry::FunctionRegistry;

/// tf.data's text when neither or both of the window size arguments are given.
pub const WINDOW_SIZE_ARGUMENTS: &str =
    "Either the `window_size` argument or the `window_size_func` argument must be specified.";

/// Checks the op's functions and template.
pub fn check(op: &pb::GroupByWindowOp, registry: &FunctionRegistry) -> Result<(), DatasetError> {
    match (&op.key_function, op.key.is_empty()) {
        (Some(f), true) => check_function(f, pb::PyFunctionKind::Map, "key")?,
        (None, false) => {
            registry.map_fn(&op.key)?;
        }
        (None, true) => return Err(DatasetError::invalid("group_by_window has no key function")),
        (Some(_), false) => {
            return Err(DatasetError::invalid(
                "group_by_window has both a key function and a key function name",
            ))
        }
    }
    match (op.window_size, &op.window_size_function) {
        (0, Some(f)) => check_function(f, pb::PyFunctionKind::Map, "window size")?,
        (n, None) if n > 0 => {}
        _ => return Err(DatasetError::invalid(WINDOW_SIZE_ARGUMENTS)),
    }
    match (&op.reduce, &op.reduce_function) {
        (Some(template), None) => {
            if !is_window(template) {
                return Err(DatasetError::invalid(
                    "group_by_window's reduce template must start from its window",
                ));
            }
            validate_ops(&template.ops, registry)
        }
        (None, Some(f)) => check_function(f, pb::PyFunctionKind::GroupReduce, "reduce"),
        (None, None) => Err(DatasetError::invalid(
            "group_by_window has neither a reduce template nor a reduce function",
        )),
        (Some(_), Some(_)) => Err(DatasetError::invalid(
            "group_by_window has both a reduce template and a reduce function",
        )),
    }
}

fn is_window(template: &pb::DatasetDef) -> bool {
    matches!(
        template.source.as_ref().and_then(|s| s.kind.as_ref()),
        Some(SourceKind::Element(pb::ElementSource {
            kind: Some(ElementKind::Window(_))
        }))
    )
}

fn check_function(
    f: &pb::PyFunctionOp,
    kind: pb::PyFunctionKind,
    role: &str,
) -> Result<(), DatasetError> {
    python_op::check(f)?;
    if python_op::kind_of(f)? != kind {
        return Err(DatasetError::invalid(format!(
            "group_by_window's {role} function '{}' is of the wrong kind",
            f.name
        )));
    }
    Ok(())
}

/// The spec of the op's output for input elements of spec `input`.
pub(crate) fn output_spec(
    op: &pb::GroupByWindowOp,
    input: ElementSpec,
    registry: &FunctionRegistry,
) -> Result<ElementSpec, DatasetError> {
    match (&op.reduce, &op.reduce_function) {
        (Some(template), _) => ops_element_spec(input, &template.ops, registry),
        (None, Some(f)) => python_op::output_spec(f, input),
        (None, None) => Err(DatasetError::invalid(
            "group_by_window has neither a reduce template nor a reduce function",
        )),
    }
}
