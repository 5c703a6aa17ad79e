//! `PipelineLimits`: how large a definition a server builds, checked before anything else is
//! done with it (at registration on the dispatcher, and again on the worker before a task's
//! pipeline is built).
//!
//! Two measures: the number of ops, and the nesting depth of the structures a definition holds
//! (the tuples and dicts of a slices source, and of a Python op's declared output spec). A
//! definition has no nested datasets: it is one source and a flat list of ops, so the ops are
//! counted, never nested. The checks themselves use no recursion: a definition past the limits
//! is measured with the same bounded stack as any other.

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
        self.check_op_count(def.ops.len())?;
        let depth = nesting_depth(def);
        if depth > self.max_depth {
            return Err(DatasetError::invalid(format!(
                "the dataset definition nests tuples and dicts {depth} levels deep, more than \
                 the limit of {} (--max-pipeline-depth)",
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

/// The deepest nesting of tuples and dicts in `def`'s slices source and Python ops' output
/// specs, counted without recursion.
pub fn nesting_depth(def: &pb::DatasetDef) -> usize {
    let mut deepest = 0;
    if let Some(SourceKind::Slices(s)) = def.source.as_ref().and_then(|s| s.kind.as_ref()) {
        if let Some(structure) = &s.structure {
            deepest = deepest.max(structure_depth(structure));
        }
    }
    for op in &def.ops {
        if let Some(OpKind::PyFunction(f)) = &op.kind {
            if let Some(spec) = &f.output_spec {
                deepest = deepest.max(spec_depth(spec));
            }
        }
    }
    deepest
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
            options: None,
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
                    "the dataset definition nests tuples and dicts 3 levels deep, more than \
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
