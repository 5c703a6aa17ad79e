//! Splitting global batches between replicas, as tf.distribute's rebatching does.
//!
//! The input of a `DistributedDataset` is batched by the *global* batch size G; each replica
//! must get about G / N rows per step (N = `num_replicas_in_sync`). tf does this with a rebatch
//! op chosen by whether G is known statically (`input_lib.py` `_make_rebatch_fn`):
//! - G known (`compute_batch_size`): `RebatchDatasetV2` with `batch_sizes_for_worker(G, W, R,
//!   worker)`, N sizes that sum to G and differ by at most one, the larger ones first, rotated
//!   by `worker * R` so that every step takes G rows across all W workers.
//! - G unknown: the legacy `RebatchDataset`, which cuts each batch of b rows into N pieces of
//!   ceil(b / N) rows, in order; the last pieces may be short or empty.
//!
//! Here each input element (a global batch) is cut on its own into N pieces (`Rebatch::split`),
//! a short final batch filling the pieces in order and leaving the rest empty; tf's V2 op may
//! also carry rows of a short batch over into the next one, which only differs when a short
//! batch is not the last (e.g. `batch` followed by `repeat`). Every component is cut along its
//! first dimension independently, as tf does. Grouping pieces into steps is the iterator's job.
//!
//! Deliberately elsewhere: auto-sharding (`sluice_pipeline::auto_shard`), iteration
//! (`distributed_iterator.rs`).

use crate::error::ClientError;
use sluice_element::{pb, Element, ElementSpec, Tensor};

/// How each global batch is cut into one piece per replica slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rebatch {
    /// The global batch size is known: piece k takes the next `sizes[k]` rows, in order.
    Sizes(Vec<usize>),
    /// It is not: a batch of b rows is cut into `pieces` pieces of ceil(b / pieces) rows.
    Even { pieces: usize },
}

/// tf's `batch_sizes_for_worker`: the sizes of the W * R pieces of a global batch of `global`
/// rows for worker `worker` of `workers` with `replicas` replicas each. They sum to `global`,
/// differ by at most one (the larger first for worker 0), and worker w's list is worker 0's
/// rotated left by `w * replicas`, so each step (R pieces on every worker) takes `global` rows.
pub(crate) fn batch_sizes_for_worker(
    global: usize,
    workers: usize,
    replicas: usize,
    worker: usize,
) -> Vec<usize> {
    let pieces = workers * replicas;
    if pieces == 0 {
        return Vec::new();
    }
    let floor = global / pieces;
    let num_ceil = global - pieces * floor;
    let mut sizes: Vec<usize> = (0..pieces)
        .map(|k| if k < num_ceil { floor + 1 } else { floor })
        .collect();
    sizes.rotate_left((worker * replicas) % pieces);
    sizes
}

/// tf's `compute_batch_size`: the global batch size of a dataset whose elements have `spec`
/// and which its `ops` (in pipeline order) produce. Known when every component's first
/// dimension is known and equal; otherwise found by walking back from the last op through ops
/// that cannot change the first dimension (filter, prefetch, repeat, shard, shuffle, skip,
/// take) to a `batch`. `None` when neither works (tf's -1).
pub(crate) fn compute_batch_size<'a>(
    spec: &ElementSpec,
    ops: impl DoubleEndedIterator<Item = &'a pb::Op>,
) -> Option<usize> {
    let mut dims = Vec::new();
    leading_dims(spec, &mut dims);
    if let Some(Some(first)) = dims.first() {
        if dims.iter().all(|d| *d == Some(*first)) {
            return Some(*first);
        }
        if dims.iter().all(Option::is_some) {
            return None; // known but different: contradictory
        }
    }
    use pb::op::Kind;
    for op in ops.rev() {
        match &op.kind {
            Some(Kind::Batch(b)) => return usize::try_from(b.batch_size).ok(),
            Some(Kind::PaddedBatch(b)) => return usize::try_from(b.batch_size).ok(),
            Some(
                Kind::Filter(_)
                | Kind::IgnoreErrors(_)
                | Kind::Cache(_)
                | Kind::Prefetch(_)
                | Kind::Repeat(_)
                | Kind::Shard(_)
                | Kind::Shuffle(_)
                | Kind::Skip(_)
                | Kind::Take(_)
                | Kind::TakeWhile(_),
            ) => continue,
            Some(Kind::PyFunction(f))
                if matches!(
                    f.kind(),
                    pb::PyFunctionKind::Filter | pb::PyFunctionKind::TakeWhile
                ) =>
            {
                continue
            }
            Some(
                Kind::Map(_)
                | Kind::Enumerate(_)
                | Kind::DecodeImage(_)
                | Kind::Resize(_)
                | Kind::ParseExample(_)
                | Kind::Unbatch(_)
                | Kind::PyFunction(_)
                | Kind::Concatenate(_)
                | Kind::Interleave(_)
                | Kind::GroupByWindow(_),
            )
            | None => return None,
        }
    }
    None
}

/// The first dimension of every component (`None` for an unknown one or a scalar).
fn leading_dims(spec: &ElementSpec, out: &mut Vec<Option<usize>>) {
    match spec {
        ElementSpec::Tensor { shape, .. } => out.push(shape.first().copied().flatten()),
        ElementSpec::Tuple(items) => items.iter().for_each(|i| leading_dims(i, out)),
        ElementSpec::Dict(fields) => fields.values().for_each(|v| leading_dims(v, out)),
        ElementSpec::Unknown => out.push(None),
    }
}

/// The spec of one replica's batch: the first dimension divided by `num_replicas` where it is
/// known and divisible, unknown otherwise (pieces of an uneven split differ in size, and a
/// replica may get an empty piece). Scalar components cannot be split: tf's error.
pub(crate) fn per_replica_spec(
    spec: &ElementSpec,
    num_replicas: usize,
) -> Result<ElementSpec, ClientError> {
    Ok(match spec {
        ElementSpec::Tensor { dtype, shape } => {
            let Some((first, rest)) = shape.split_first() else {
                return Err(ClientError::InvalidArgument(
                    "Invalid `input_dataset`. Expected a dataset whose elements have rank >= 1 \
                     but found a dataset whose elements are scalars. Fix the issue by adding the \
                     `batch` transformation to the dataset."
                        .into(),
                ));
            };
            let first = first.filter(|d| num_replicas > 0 && d % num_replicas == 0);
            let mut shape = Vec::with_capacity(rest.len() + 1);
            shape.push(first.map(|d| d / num_replicas));
            shape.extend_from_slice(rest);
            ElementSpec::Tensor {
                dtype: *dtype,
                shape,
            }
        }
        ElementSpec::Tuple(items) => ElementSpec::Tuple(
            items
                .iter()
                .map(|i| per_replica_spec(i, num_replicas))
                .collect::<Result<_, _>>()?,
        ),
        ElementSpec::Dict(fields) => ElementSpec::Dict(
            fields
                .iter()
                .map(|(k, v)| Ok((k.clone(), per_replica_spec(v, num_replicas)?)))
                .collect::<Result<_, ClientError>>()?,
        ),
        ElementSpec::Unknown => ElementSpec::Unknown,
    })
}

impl Rebatch {
    /// The plan for the pipeline `worker` of `workers`, each with `replicas` local replicas,
    /// given the global batch size if it is known.
    pub(crate) fn plan(
        global: Option<usize>,
        workers: usize,
        replicas: usize,
        worker: usize,
    ) -> Rebatch {
        match global {
            Some(g) => Rebatch::Sizes(batch_sizes_for_worker(g, workers, replicas, worker)),
            None => Rebatch::Even {
                pieces: workers * replicas,
            },
        }
    }

    pub(crate) fn num_pieces(&self) -> usize {
        match self {
            Rebatch::Sizes(sizes) => sizes.len(),
            Rebatch::Even { pieces } => *pieces,
        }
    }

    /// The row ranges of the pieces of a batch of `rows` rows.
    fn ranges(&self, rows: usize) -> Result<Vec<(usize, usize)>, ClientError> {
        match self {
            Rebatch::Sizes(sizes) => {
                let global: usize = sizes.iter().sum();
                if rows > global {
                    return Err(ClientError::InvalidArgument(format!(
                        "cannot rebatch a batch of {rows} rows: it is larger than the global \
                         batch size {global}"
                    )));
                }
                let mut start = 0;
                Ok(sizes
                    .iter()
                    .map(|size| {
                        let end = (start + size).min(rows);
                        let range = (start, end);
                        start = end;
                        range
                    })
                    .collect())
            }
            Rebatch::Even { pieces } => {
                let interval = rows.div_ceil((*pieces).max(1));
                Ok((0..*pieces)
                    .map(|k| {
                        let start = (k * interval).min(rows);
                        (start, (start + interval).min(rows))
                    })
                    .collect())
            }
        }
    }

    /// Cuts one global batch into `num_pieces()` pieces, every component along its first
    /// dimension.
    pub(crate) fn split(&self, element: &Element) -> Result<Vec<Element>, ClientError> {
        let mut component = 0;
        self.split_nested(element, &mut component)
    }

    fn split_nested(
        &self,
        element: &Element,
        component: &mut usize,
    ) -> Result<Vec<Element>, ClientError> {
        match element {
            Element::Tensor(t) => {
                let index = *component;
                *component += 1;
                let Some(&rows) = t.shape().first() else {
                    return Err(ClientError::InvalidArgument(format!(
                        "Cannot rebatch dataset: All components must have at least one \
                         dimension. Perhaps your input dataset is not batched? Component {index} \
                         is scalar."
                    )));
                };
                self.ranges(rows)?
                    .into_iter()
                    .map(|(start, end)| Ok(Element::Tensor(t.rows(start, end)?)))
                    .collect()
            }
            Element::Tuple(items) => {
                let columns = items
                    .iter()
                    .map(|i| self.split_nested(i, component))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(transpose(columns, self.num_pieces())
                    .into_iter()
                    .map(Element::Tuple)
                    .collect())
            }
            Element::Dict(fields) => {
                let columns = fields
                    .values()
                    .map(|v| self.split_nested(v, component))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(transpose(columns, self.num_pieces())
                    .into_iter()
                    .map(|values| Element::Dict(fields.keys().cloned().zip(values).collect()))
                    .collect())
            }
        }
    }
}

/// `columns[c][p]` (component c of piece p) to `pieces[p][c]`.
fn transpose(columns: Vec<Vec<Element>>, pieces: usize) -> Vec<Vec<Element>> {
    let mut out: Vec<Vec<Element>> = (0..pieces)
        .map(|_| Vec::with_capacity(columns.len()))
        .collect();
    for column in columns {
        for (piece, value) in out.iter_mut().zip(column) {
            piece.push(value);
        }
    }
    out
}

/// Whether every component of `element` has no rows: a piece that got no data.
pub(crate) fn is_empty_batch(element: &Element) -> bool {
    match element {
        Element::Tensor(t) => t.shape().first() == Some(&0),
        Element::Tuple(items) => items.iter().all(is_empty_batch),
        Element::Dict(fields) => fields.values().all(is_empty_batch),
    }
}

/// An element with the structure, dtypes and inner shapes of `like` and no rows: what a
/// replica without data gets (tf's dummy batch of the right shape and dtype).
pub(crate) fn empty_like(like: &Element) -> Result<Element, ClientError> {
    Ok(match like {
        Element::Tensor(t) => {
            if t.rank() == 0 {
                return Err(ClientError::InvalidArgument(
                    "cannot give a replica without data an empty batch: the dataset's elements \
                     have scalar components; batch the dataset"
                        .into(),
                ));
            }
            Element::Tensor(Tensor::rows(t, 0, 0)?)
        }
        Element::Tuple(items) => {
            Element::Tuple(items.iter().map(empty_like).collect::<Result<_, _>>()?)
        }
        Element::Dict(fields) => Element::Dict(
            fields
                .iter()
                .map(|(k, v)| Ok((k.clone(), empty_like(v)?)))
                .collect::<Result<_, ClientError>>()?,
        ),
    })
}

#[cfg(test)]
#[path = "rebatch_tests.rs"]
mod tests;
