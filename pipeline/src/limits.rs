//! `PipelineLimits`: how large a definition a server builds, checked before anything else is
//! done with it (at registration on the dispatcher, and again on the worker before a task's
//! pipeline is built).
//!
//! Two measures: the number of ops, and the nesting depth of the structures a definition holds
//! (the tuples and dicts of a slices source, and of a Python op's declared output spec). An
//! interleave's template and a group_by_window's reduce template are nested definitions: their
//! ops count with the others, and each
//! template is one level of nesting more, which adds to the depth of the structures inside it.
//! The checks themselves use no recursion: a definition past the limits is measured with the
//! same bounded stack as any other.

use sluice_element::pb;
use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::DatasetError;

/// The default of [`PipelineLimits::max_ops`]. Real tf.data pipelines rarely exceed a few
/// hundred ops; ten thousand leaves them room by a wide margin while bounding the work one
/// definition can make a server do.
pub const DEFAULT_MAX_PIPELINE_OPS: usize = 10_000;

/// The default of [`PipelineLimits::max_depth`]. Element structures nest a few levels (a dict
/// of tuples of tensors); the protobuf decoder refuses anything deeper than 100 levels anyway.
pub const DEFAULT_MAX_PIPELINE_DEPTH: usize = 64;

/// The largest definition a server accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineLimits {
    /// The most ops a definition may have (`--max-pipeline-ops`).
    pub max_ops: usize,
    /// The deepest nesting of tuples and dicts a definition's structures may have
    /// (`--max-pipeline-depth`); a plain tensor is depth 0.
    pub max_depth: usize,
}

impl Default for PipelineLimits {
    fn default() -> Self {
        PipelineLimits {
            max_ops: DEFAULT_MAX_PIPELINE_OPS,
            max_depth: DEFAULT_MAX_PIPELINE_DEPTH,
        }
    }
}

impl PipelineLimits {
    /// Refuses a definition with more ops, or deeper structures, than the limits allow, with
    /// `DatasetError::InvalidArgument` naming the count, the limit and the flag that sets it.
    pub fn check(&self, def: &pb::DatasetDef) -> Result<(), DatasetError> {
        self.check_op_count(count_ops(std::slice::from_ref(def), &[]))?;
        self.check_depth(nesting_depth(def))
    }

    /// Checks an op chain applied to a stream (ops after `distribute`): its ops, those of its
    /// templates included, and its nesting.
    pub fn check_ops(&self, ops: &[pb::Op]) -> Result<(), DatasetError> {
        self.check_op_count(count_ops(&[], ops))?;
        let deepest = ops
            .iter()
            .filter_map(template)
            .map(|t| nesting_depth(t) + 1)
            .chain(std::iter::once(ops_depth(ops)))
            .max()
            .unwrap_or(0);
        self.check_depth(deepest)
    }

    fn check_depth(&self, depth: usize) -> Result<(), DatasetError> {
        if depth > self.max_depth {
            return Err(DatasetError::invalid(format!(
                "the dataset definition nests tuples, dicts and templates {depth} \
                 levels deep, more than the limit of {} (--max-pipeline-depth)",
                self.max_depth
            )));
        }
        Ok(())
    }

    /// Refuses `ops` ops past [`PipelineLimits::max_ops`].
    pub fn check_op_count(&self, ops: usize) -> Result<(), DatasetError> {
        if ops > self.max_ops {
            return Err(DatasetError::invalid(format!(
                "the dataset definition has {ops} ops, more than the limit of {} \
                 (--max-pipeline-ops)",
                self.max_ops
            )));
        }
        Ok(())
    }
}

/// The deepest nesting in `def`: of tuples and dicts in its slices source and its Python ops'
/// output specs, each template (interleave, group_by_window reduce) adding one level to what it holds. Counted without
/// recursion.
pub fn nesting_depth(def: &pb::DatasetDef) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(def, 0usize)];
    while let Some((d, level)) = stack.pop() {
        let mut own = ops_depth(&d.ops);
        if let Some(SourceKind::Slices(s)) = d.source.as_ref().and_then(|s| s.kind.as_ref()) {
            if let Some(structure) = &s.structure {
                own = own.max(structure_depth(structure));
            }
        }
        deepest = deepest.max(level.saturating_add(own));
        stack.extend(d.ops.iter().filter_map(template).map(|t| (t, level + 1)));
    }
    deepest
}

/// The deepest output spec of a chain's own Python ops (not of its templates' ops).
fn ops_depth(ops: &[pb::Op]) -> usize {
    ops.iter()
        .filter_map(|op| match &op.kind {
            Some(OpKind::PyFunction(f)) => f.output_spec.as_ref(),
            Some(OpKind::Interleave(i)) => i.function.as_ref().and_then(|f| f.output_spec.as_ref()),
            Some(OpKind::GroupByWindow(g)) => g
                .reduce_function
                .as_ref()
                .and_then(|f| f.output_spec.as_ref()),
            _ => None,
        })
        .map(spec_depth)
        .max()
        .unwrap_or(0)
}

/// The nested definition an op holds: an interleave's template, a group_by_window's reduce.
fn template(op: &pb::Op) -> Option<&pb::DatasetDef> {
    match &op.kind {
        Some(OpKind::Interleave(i)) => i.template.as_ref(),
        Some(OpKind::GroupByWindow(g)) => g.reduce.as_ref(),
        _ => None,
    }
}

/// The ops of `defs` and of `ops`, with those of every template inside them, counted without
/// recursion.
fn count_ops(defs: &[pb::DatasetDef], ops: &[pb::Op]) -> usize {
    let mut count = 0usize;
    let mut stack: Vec<&[pb::Op]> = defs.iter().map(|d| d.ops.as_slice()).collect();
    stack.push(ops);
    while let Some(chain) = stack.pop() {
        count = count.saturating_add(chain.len());
        stack.extend(chain.iter().filter_map(template).map(|t| t.ops.as_slice()));
    }
    count
}

fn structure_depth(root: &pb::SlicesStructure) -> usize {
    use pb::slices_structure::Kind;
    max_depth(root, |s| match &s.kind {
        Some(Kind::Tuple(list)) => list.items.iter().collect(),
        Some(Kind::Dict(dict)) => dict
            .fields
            .iter()
            .filter_map(|f| f.value.as_ref())
            .collect(),
        Some(Kind::Tensor(_)) | None => Vec::new(),
    })
}

fn spec_depth(root: &pb::ElementSpec) -> usize {
    use pb::element_spec::Kind;
    max_depth(root, |s| match &s.kind {
        Some(Kind::Tuple(list)) => list.items.iter().collect(),
        Some(Kind::Dict(dict)) => dict.fields.iter().filter_map(|f| f.spec.as_ref()).collect(),
        Some(Kind::Tensor(_)) | None => Vec::new(),
    })
}

/// How deep the deepest node below `root` lies (0: `root` has no children), walked with a
/// stack of its own, so a structure of any depth cannot overflow the caller's.
fn max_depth<'a, T>(root: &'a T, children: impl Fn(&'a T) -> Vec<&'a T>) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(root, 0usize)];
    while let Some((node, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        stack.extend(children(node).into_iter().map(|c| (c, depth + 1)));
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dataset, Transform};

    fn nested_tuple(depth: usize) -> pb::SlicesStructure {
        use pb::slices_structure::Kind;
        let mut s = pb::SlicesStructure {
            kind: Some(Kind::Tensor(pb::TensorProto::default())),
        };
        for _ in 0..depth {
            s = pb::SlicesStructure {
                kind: Some(Kind::Tuple(pb::SlicesList { items: vec![s] })),
            };
        }
        s
    }

    fn slices_def(depth: usize) -> pb::DatasetDef {
        pb::DatasetDef {
            source: Some(pb::Source {
                kind: Some(SourceKind::Slices(pb::SlicesSource {
                    tensor: None,
                    structure: Some(nested_tuple(depth)),
                })),
            }),
            ops: Vec::new(),
        }
    }

    fn maps(n: usize) -> pb::DatasetDef {
        let mut ds = Dataset::range(10);
        for _ in 0..n {
            ds = ds.map("identity");
        }
        ds.into_def()
    }

    #[test]
    fn definitions_within_the_limits_pass_and_others_are_refused_naming_count_and_limit() {
        let limits = PipelineLimits {
            max_ops: 3,
            max_depth: 2,
        };
        // (definition, expected error)
        let cases: Vec<(pb::DatasetDef, Option<&str>)> = vec![
            (maps(0), None),
            (maps(3), None),
            (
                maps(4),
                Some(
                    "the dataset definition has 4 ops, more than the limit of 3 \
                     (--max-pipeline-ops)",
                ),
            ),
            (slices_def(2), None),
            (
                slices_def(3),
                Some(
                    "the dataset definition nests tuples, dicts and templates 3 levels deep, more than \
                     the limit of 2 (--max-pipeline-depth)",
                ),
            ),
        ];
        for (def, want) in cases {
            let got = limits.check(&def).map_err(|e| e.to_string());
            assert_eq!(got.err().as_deref(), want, "{def:?}");
        }
    }

    #[test]
    fn the_defaults_admit_ten_thousand_ops() {
        let limits = PipelineLimits::default();
        assert_eq!(limits.check(&maps(10_000)), Ok(()));
        assert!(limits.check(&maps(10_001)).is_err());
        assert_eq!(nesting_depth(&slices_def(1_000)), 1_000);
    }
}
