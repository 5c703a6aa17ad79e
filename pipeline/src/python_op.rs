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

/// The names of the Python functions of `def` and of every dataset and template nested in it,
/// in walk order: code whose state lives outside the definition (what it captures, the
/// interpreter's), tf.data's "external state".
pub fn python_functions(def: &pb::DatasetDef) -> Vec<String> {
    let mut names = Vec::new();
    let mut stack = vec![def];
    while let Some(d) = stack.pop() {
        for op in &d.ops {
            let functions: Vec<&pb::PyFunctionOp> = match &op.kind {
                Some(pb::op::Kind::PyFunction(f)) => vec![f],
                Some(pb::op::Kind::Interleave(i)) => i.function.iter().collect(),
                Some(pb::op::Kind::GroupByWindow(g)) => g
                    .key_function
                    .iter()
                    .chain(&g.window_size_function)
                    .chain(&g.reduce_function)
                    .collect(),
                _ => Vec::new(),
            };
            names.extend(functions.into_iter().map(|f| f.name.clone()));
            stack.extend(crate::nested::op_template(op));
        }
        stack.extend(crate::nested::children(d));
    }
    names
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dataset, Transform};

    fn py(name: &str, kind: pb::PyFunctionKind) -> pb::PyFunctionOp {
        pb::PyFunctionOp {
            kind: kind as i32,
            name: name.to_string(),
            ..Default::default()
        }
    }

    fn op(kind: pb::op::Kind) -> pb::Op {
        pb::Op { kind: Some(kind) }
    }

    #[test]
    fn python_functions_are_found_in_ops_templates_and_nested_datasets() {
        use pb::op::Kind;
        let map = op(Kind::PyFunction(py("m", pb::PyFunctionKind::Map)));
        let mut with_map = Dataset::range(3).into_def();
        with_map.ops.push(map.clone());
        let mut template = Dataset::element_slices().into_def();
        template
            .ops
            .push(op(Kind::PyFunction(py("t", pb::PyFunctionKind::Filter))));
        let interleave = op(Kind::Interleave(pb::InterleaveOp {
            template: Some(template),
            block_length: 1,
            ..Default::default()
        }));
        let group = op(Kind::GroupByWindow(pb::GroupByWindowOp {
            key_function: Some(py("k", pb::PyFunctionKind::Map)),
            reduce_function: Some(py("r", pb::PyFunctionKind::GroupReduce)),
            ..Default::default()
        }));
        let mut zipped =
            Dataset::zip(vec![Dataset::range(2), Dataset::from_def(with_map.clone())]).into_def();
        zipped.ops.extend([interleave, group]);
        let cases: Vec<(pb::DatasetDef, Vec<&str>)> = vec![
            (Dataset::range(3).map("square").into_def(), vec![]),
            (with_map, vec!["m"]),
            (zipped, vec!["t", "k", "r", "m"]),
        ];
        for (def, want) in cases {
            let mut got = python_functions(&def);
            got.sort();
            let mut want: Vec<String> = want.into_iter().map(String::from).collect();
            want.sort();
            assert_eq!(got, want, "{def:?}");
        }
    }
}
