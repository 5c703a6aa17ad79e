//! `PipelineLimits`: how large a definition a server builds, checked before anything else is
//! done with it (at registration on the dispatcher, and again on the worker before a task's
//! pipeline is built).
//!
//! Two measures: the number of ops, and the nesting depth of what a definition holds: the
//! tuples and dicts of a slices or tensors source and of a Python op's declared output spec, the
//! datasets nested in it (the inputs of zip, sample_from_datasets and choose_from_datasets,
//! concatenate's other dataset), and the templates of its ops (an interleave's inner dataset, a
//! group_by_window's reduce). The ops of every nested definition count, and each nested dataset
//! counts as one more (its source), so a wide fan-out is bounded like a long chain. Datasets
//! nest up to the depth limit; each template adds a level to the structures inside it. The
//! checks themselves use no recursion: a definition past the limits is measured with the same
//! bounded stack as any other.

use sluice_element::pb;
use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::DatasetError;

use crate::nested::{children, op_template};

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
    /// The most ops a definition may have, those of its nested datasets included, each nested
    /// dataset counting one more for its source (`--max-pipeline-ops`).
    pub max_ops: usize,
    /// The deepest nesting of tuples and dicts a definition's structures may have, and of
    /// datasets in datasets (`--max-pipeline-depth`); a plain tensor, and a definition without
    /// nested datasets, is depth 0.
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
        let (ops, datasets) = nested_size(def);
        self.check_op_count(ops)?;
        self.check_dataset_depth(datasets)?;
        self.check_depth(nesting_depth(def))
    }

    /// Checks an op chain applied to a stream (ops after `distribute`): its ops, those of its
    /// templates included, and its nesting.
    pub fn check_ops(&self, ops: &[pb::Op]) -> Result<(), DatasetError> {
        let (mut count, mut datasets, mut depth) = (ops.len(), 0, ops_depth(ops));
        for template in ops.iter().filter_map(op_template) {
            let (template_ops, template_datasets) = nested_size(template);
            count = count.saturating_add(template_ops);
            datasets = datasets.max(template_datasets);
            depth = depth.max(nesting_depth(template).saturating_add(1));
        }
        self.check_op_count(count)?;
        self.check_dataset_depth(datasets)?;
        self.check_depth(depth)
    }

    fn check_dataset_depth(&self, datasets: usize) -> Result<(), DatasetError> {
        if datasets > self.max_depth {
            return Err(DatasetError::invalid(format!(
                "the dataset definition nests datasets {datasets} levels deep, more than the \
                 limit of {} (--max-pipeline-depth)",
                self.max_depth
            )));
        }
        Ok(())
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

/// The ops of `def` and of every definition nested in it, templates included, each nested
/// dataset (not a template: it is its op's argument) counting one more (its source), and how
/// deep the datasets nest (0: none nested; templates do not count here), counted without
/// recursion.
pub fn nested_size(def: &pb::DatasetDef) -> (usize, usize) {
    let (mut ops, mut deepest) = (0usize, 0usize);
    walk_levels(def, |d, datasets, _| {
        ops = ops
            .saturating_add(d.ops.len())
            .saturating_add(usize::from(datasets > 0));
        deepest = deepest.max(datasets);
    });
    (ops, deepest)
}

/// The deepest nesting in `def`: of tuples and dicts in the slices and tensors sources and
/// Python ops' output specs of `def` and every definition nested in it, each template
/// (interleave, group_by_window's reduce) adding one level to what it holds. Counted without
/// recursion.
pub fn nesting_depth(def: &pb::DatasetDef) -> usize {
    let mut deepest = 0;
    walk_levels(def, |d, _, templates| {
        let mut own = ops_depth(&d.ops);
        let structure = match d.source.as_ref().and_then(|s| s.kind.as_ref()) {
            Some(SourceKind::Slices(s)) => s.structure.as_ref(),
            Some(SourceKind::Tensors(t)) => t.value.as_ref(),
            _ => None,
        };
        if let Some(structure) = structure {
            own = own.max(structure_depth(structure));
        }
        deepest = deepest.max(templates.saturating_add(own));
    });
    deepest
}

/// Visits `root` and every definition nested in it, each with how many datasets (`children`)
/// and how many templates (`op_template`) enclose it, with a heap stack.
fn walk_levels<'a>(
    root: &'a pb::DatasetDef,
    mut visit: impl FnMut(&'a pb::DatasetDef, usize, usize),
) {
    let mut stack = vec![(root, 0usize, 0usize)];
    while let Some((def, datasets, templates)) = stack.pop() {
        visit(def, datasets, templates);
        stack.extend(
            children(def)
                .into_iter()
                .map(|c| (c, datasets + 1, templates)),
        );
        stack.extend(
            def.ops
                .iter()
                .filter_map(op_template)
                .map(|t| (t, datasets, templates + 1)),
        );
    }
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

    /// `zip` of `zip` of ... `depth` levels deep, each level also `concatenate`-ing a range.
    fn nested_zips(depth: usize) -> pb::DatasetDef {
        let mut ds = Dataset::range(3);
        for _ in 0..depth {
            ds = Dataset::zip(vec![ds, Dataset::range(2)]);
        }
        ds.into_def()
    }

    fn wide_zip(inputs: usize, ops_each: usize) -> pb::DatasetDef {
        Dataset::zip((0..inputs).map(|_| maps_ds(ops_each)).collect()).into_def()
    }

    fn maps_ds(n: usize) -> Dataset {
        Dataset::from_def(maps(n))
    }

    #[test]
    fn nested_datasets_count_their_ops_and_their_depth() {
        let limits = PipelineLimits {
            max_ops: 10,
            max_depth: 3,
        };
        let concatenated = Dataset::range(1)
            .concatenate(Dataset::range(2).concatenate(maps(4)).into_def())
            .into_def();
        let choose = Dataset::choose_from_datasets(
            vec![maps_ds(2), maps_ds(2)],
            Dataset::range(2).repeat_forever(),
            true,
        )
        .into_def();
        // (definition, expected error)
        let cases: Vec<(pb::DatasetDef, Option<&str>)> = vec![
            (nested_zips(3), None),
            (
                nested_zips(4),
                Some(
                    "the dataset definition nests datasets 4 levels deep, more than the limit \
                     of 3 (--max-pipeline-depth)",
                ),
            ),
            // 5 inputs, each one source and one op: 10.
            (wide_zip(5, 1), None),
            (
                wide_zip(6, 1),
                Some(
                    "the dataset definition has 12 ops, more than the limit of 10 \
                     (--max-pipeline-ops)",
                ),
            ),
            // concatenate ops 2, nested sources 2, maps 4.
            (concatenated, None),
            // inputs 2 * (1 + 2), choice 1 + 1.
            (choose, None),
            (
                Dataset::from_tensors(&tuple_element(4)).into_def(),
                Some(
                    "the dataset definition nests tuples, dicts and templates 4 levels deep, more than \
                     the limit of 3 (--max-pipeline-depth)",
                ),
            ),
            (
                Dataset::zip(vec![Dataset::from_def(slices_def(4))]).into_def(),
                Some(
                    "the dataset definition nests tuples, dicts and templates 4 levels deep, more than \
                     the limit of 3 (--max-pipeline-depth)",
                ),
            ),
        ];
        for (def, want) in cases {
            let got = limits.check(&def).map_err(|e| e.to_string());
            assert_eq!(got.err().as_deref(), want, "{def:?}");
        }
    }

    fn tuple_element(depth: usize) -> sluice_element::Element {
        use sluice_element::{Element, Tensor};
        let mut e = Element::Tensor(Tensor::scalar_i64(1));
        for _ in 0..depth {
            e = Element::Tuple(vec![e]);
        }
        e
    }

    #[test]
    fn hostile_nesting_is_measured_without_recursion() {
        // Far deeper than any stack would survive if measured recursively.
        let mut def = Dataset::range(1).into_def();
        for _ in 0..200_000 {
            def = pb::DatasetDef {
                source: Some(pb::Source {
                    kind: Some(SourceKind::Zip(pb::ZipSource {
                        inputs: vec![def],
                        keys: Vec::new(),
                    })),
                }),
                ops: Vec::new(),
                options: None,
            };
        }
        let err = PipelineLimits::default().check(&def).unwrap_err();
        assert!(err.to_string().contains("200000 ops"), "{err}");
        let (ops, depth) = nested_size(&def);
        assert_eq!((ops, depth), (200_000, 200_000));
        // A huge fan-out of empty datasets is counted, not built.
        let wide = Dataset::zip((0..20_000).map(|_| Dataset::range(1)).collect()).into_def();
        assert!(PipelineLimits::default().check(&wide).is_err());
        // Dropping the deep definition must not overflow either: take it apart by hand.
        let mut stack = vec![def];
        while let Some(mut d) = stack.pop() {
            stack.extend(
                crate::nested::children_mut(&mut d)
                    .into_iter()
                    .map(std::mem::take),
            );
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
