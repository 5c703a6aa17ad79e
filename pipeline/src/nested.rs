//! Definitions that hold other definitions: the inputs of `zip`, `sample_from_datasets` and
//! `choose_from_datasets` (with its choice dataset), and `concatenate`'s other dataset. Everything
//! that walks a definition reaches the nested ones through `children`; `walk` visits a whole
//! tree with a stack of its own (no recursion), so it is safe before `PipelineLimits` has bounded
//! the nesting.

use sluice_element::pb;
use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;

/// The source kind of `def`, if it has one.
pub fn source_kind(def: &pb::DatasetDef) -> Option<&SourceKind> {
    def.source.as_ref().and_then(|s| s.kind.as_ref())
}

/// The definitions `def`'s source holds, in order: zip, sample and choose inputs, then choose's
/// choice dataset.
pub fn source_children(def: &pb::DatasetDef) -> Vec<&pb::DatasetDef> {
    match source_kind(def) {
        Some(SourceKind::Zip(z)) => z.inputs.iter().collect(),
        Some(SourceKind::Sample(s)) => s.inputs.iter().collect(),
        Some(SourceKind::Choose(c)) => c.inputs.iter().chain(&c.choice).collect(),
        _ => Vec::new(),
    }
}

/// Every definition `def` holds directly: its source's (`source_children`), then each
/// `concatenate`'s other dataset in op order.
pub fn children(def: &pb::DatasetDef) -> Vec<&pb::DatasetDef> {
    let mut out = source_children(def);
    for op in &def.ops {
        if let Some(OpKind::Concatenate(c)) = &op.kind {
            out.extend(c.other.as_ref());
        }
    }
    out
}

/// `children`, mutably (same order).
pub fn children_mut(def: &mut pb::DatasetDef) -> Vec<&mut pb::DatasetDef> {
    let mut out = source_children_mut(&mut def.source);
    for op in &mut def.ops {
        if let Some(OpKind::Concatenate(c)) = &mut op.kind {
            out.extend(c.other.as_mut());
        }
    }
    out
}

fn source_children_mut(source: &mut Option<pb::Source>) -> Vec<&mut pb::DatasetDef> {
    match source.as_mut().and_then(|s| s.kind.as_mut()) {
        Some(SourceKind::Zip(z)) => z.inputs.iter_mut().collect(),
        Some(SourceKind::Sample(s)) => s.inputs.iter_mut().collect(),
        Some(SourceKind::Choose(c)) => c.inputs.iter_mut().chain(&mut c.choice).collect(),
        _ => Vec::new(),
    }
}

/// Visits `root` and every definition nested in it, depth first, each with its nesting level
/// (0 for `root`), using a heap stack: any nesting is walked without growing the call stack.
pub fn walk<'a>(root: &'a pb::DatasetDef, mut visit: impl FnMut(&'a pb::DatasetDef, usize)) {
    let mut stack = vec![(root, 0usize)];
    while let Some((def, level)) = stack.pop() {
        visit(def, level);
        stack.extend(children(def).into_iter().rev().map(|c| (c, level + 1)));
    }
}

/// Applies `f` to `root` and every nested definition (parents before children), with a heap
/// stack.
pub fn walk_mut(root: &mut pb::DatasetDef, f: &mut impl FnMut(&mut pb::DatasetDef)) {
    let mut stack = vec![root];
    while let Some(def) = stack.pop() {
        f(def);
        stack.extend(children_mut(def).into_iter().rev());
    }
}

/// The template an op holds: an interleave's inner dataset, a group_by_window's reduce. A
/// template is built per element on the worker and reads no split of the job, so templates are
/// not among `children`.
pub fn op_template(op: &pb::Op) -> Option<&pb::DatasetDef> {
    match &op.kind {
        Some(OpKind::Interleave(i)) => i.template.as_ref(),
        Some(OpKind::GroupByWindow(g)) => g.reduce.as_ref(),
        _ => None,
    }
}

/// `walk_mut`, with the templates of every definition's ops visited too.
pub fn walk_all_mut(root: &mut pb::DatasetDef, f: &mut impl FnMut(&mut pb::DatasetDef)) {
    let mut stack = vec![root];
    while let Some(def) = stack.pop() {
        f(def);
        let mut nested = Vec::new();
        let pb::DatasetDef { source, ops, .. } = def;
        nested.extend(source_children_mut(source));
        for op in ops.iter_mut() {
            match &mut op.kind {
                Some(OpKind::Concatenate(c)) => nested.extend(c.other.as_mut()),
                Some(OpKind::Interleave(i)) => nested.extend(i.template.as_mut()),
                Some(OpKind::GroupByWindow(g)) => nested.extend(g.reduce.as_mut()),
                _ => {}
            }
        }
        stack.extend(nested.into_iter().rev());
    }
}

/// Whether `def`'s source reads data itself (range, slices, files, tensors) rather than
/// combining nested datasets.
pub fn is_leaf_source(kind: &SourceKind) -> bool {
    // Exhaustive, so a new source decides.
    match kind {
        SourceKind::Range(_)
        | SourceKind::Slices(_)
        | SourceKind::Files(_)
        | SourceKind::Tensors(_)
        | SourceKind::Random(_)
        | SourceKind::Element(_) => true,
        SourceKind::Zip(_) | SourceKind::Sample(_) | SourceKind::Choose(_) => false,
    }
}

#[cfg(test)]
#[path = "nested_tests.rs"]
mod tests;
