//! The rules of a definition's Python op (`pb::PyFunctionOp`): its kind, what a well-formed one
//! carries, the spec of its output, and its name in the text syntax. Running it is the
//! executor's (`python_fn` in `sluice-executor`).

use sluice_element::{pb, DatasetError, ElementSpec};

/// The op's kind, refusing an unset one.
pub(crate) fn kind_of(op: &pb::PyFunctionOp) -> Result<pb::PyFunctionKind, DatasetError> {
    match pb::PyFunctionKind::try_from(op.kind) {
        Ok(pb::PyFunctionKind::Unspecified) | Err(_) => Err(DatasetError::invalid(format!(
            "python function '{}' has no kind (map, filter or flat_map)",
            op.name
        ))),
        Ok(kind) => Ok(kind),
    }
}

/// A definition's Python op is well formed: a kind, a pickle, both versions, and a given
/// output spec that decodes.
pub fn check(op: &pb::PyFunctionOp) -> Result<(), DatasetError> {
    kind_of(op)?;
    if op.pickled.is_empty() {
        return Err(DatasetError::invalid(format!(
            "python function '{}' has no pickled code",
            op.name
        )));
    }
    if op.python_version.is_empty() || op.cloudpickle_version.is_empty() {
        return Err(DatasetError::invalid(format!(
            "python function '{}' does not record the Python and cloudpickle versions that \
             pickled it",
            op.name
        )));
    }
    if let Some(spec) = &op.output_spec {
        ElementSpec::from_proto(spec)?;
    }
    Ok(())
}

/// The spec of the op's output for input of spec `input`: a filter or take_while keeps it; a map or flat_map
/// has the spec the user gave, or `Unknown`.
pub(crate) fn output_spec(
    op: &pb::PyFunctionOp,
    input: ElementSpec,
) -> Result<ElementSpec, DatasetError> {
    Ok(match kind_of(op)? {
        pb::PyFunctionKind::Filter | pb::PyFunctionKind::TakeWhile => input,
        _ => match &op.output_spec {
            Some(spec) => ElementSpec::from_proto(spec)?,
            None => ElementSpec::Unknown,
        },
    })
}

/// The op's name in the text syntax (`py_map`, `py_filter`, `py_flat_map`).
pub(crate) fn syntax_name(op: &pb::PyFunctionOp) -> &'static str {
    match pb::PyFunctionKind::try_from(op.kind) {
        Ok(pb::PyFunctionKind::Map) => "py_map",
        Ok(pb::PyFunctionKind::Filter) => "py_filter",
        Ok(pb::PyFunctionKind::FlatMap) => "py_flat_map",
        Ok(pb::PyFunctionKind::Interleave) => "py_interleave",
        Ok(pb::PyFunctionKind::TakeWhile) => "py_take_while",
        Ok(pb::PyFunctionKind::Generator) => "py_generator",
        Ok(pb::PyFunctionKind::GroupReduce) => "py_group_reduce",
        _ => "py_function",
    }
}

/// Why a definition cannot be split, when one of its ops (not a template's) runs a generator
/// (`from_generator`): its elements are one sequence only that generator can produce.
pub fn unsplittable_generator(def: &pb::DatasetDef) -> Option<DatasetError> {
    def.ops.iter().find_map(|op| match &op.kind {
        Some(pb::op::Kind::PyFunction(f)) if f.kind == pb::PyFunctionKind::Generator as i32 => {
            Some(DatasetError::invalid(format!(
                "from_generator ('{}') cannot be split between workers: its elements are one \
                 sequence only the generator can produce; read it with parallel_epochs (every \
                 worker runs the generator), or iterate it locally",
                f.name
            )))
        }
        _ => None,
    })
}
