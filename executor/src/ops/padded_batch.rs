//! `padded_batch`: `batch` whose components are first padded to a common shape (the given
//! padded shape, or the batch's largest size in each dimension), with tf.data's rules.
//!
//! The batch is filled by `BatchIter` (same memory accounting, same cancellation); this file
//! pads and stacks one batch. Before a padded component's buffer is allocated its size is
//! checked against `MAX_PADDED_BATCH_BYTES` and reserved on the memory budget, so elements that
//! would pad to an absurd size fail instead of exhausting memory.

use bytes::Bytes;
use sluice_element::{pb, DType, DatasetError, Element, Tensor};
use sluice_pipeline::batching::{check_counts, check_padded_size, padding_values, slot_bytes};

use crate::memory_budget::Reservation;

/// A `padded_batch` op's padded shapes and padding values, resolved.
#[derive(Debug)]
pub(crate) struct Padding {
    shapes: Vec<Vec<i64>>,
    values: Vec<Tensor>,
}

/// An element's structure without its tensors, to check that a batch's elements agree.
#[derive(Debug, PartialEq)]
enum Skeleton {
    Leaf,
    Tuple(Vec<Skeleton>),
    Dict(Vec<(String, Skeleton)>),
}

impl Padding {
    pub(crate) fn new(op: &pb::PaddedBatchOp) -> Result<Padding, DatasetError> {
        sluice_pipeline::batching::check_padded_batch(op)?;
        Ok(Padding {
            shapes: op.padded_shapes.iter().map(|s| s.dims.clone()).collect(),
            values: padding_values(op)?,
        })
    }

    /// Pads each component of `parts` and stacks them; the padded buffers are reserved on
    /// `held` while they are built.
    pub(crate) fn pad_and_stack(
        &self,
        parts: Vec<Element>,
        held: &Reservation,
    ) -> Result<Element, DatasetError> {
        let Some(first) = parts.first() else {
            return Err(DatasetError::invalid("cannot batch zero elements"));
        };
        let skeleton = skeleton(first);
        let batch = parts.len();
        let mut columns: Vec<Vec<Tensor>> = Vec::new();
        for p in parts {
            let (leaves, shape) = flatten(p);
            if shape != skeleton {
                return Err(DatasetError::invalid(
                    "cannot batch elements with different structures",
                ));
            }
            if columns.is_empty() {
                columns = (0..leaves.len())
                    .map(|_| Vec::with_capacity(batch))
                    .collect();
            }
            for (col, t) in columns.iter_mut().zip(leaves) {
                col.push(t);
            }
        }
        check_counts(self.shapes.len(), self.values.len(), columns.len())?;
        let mut padded = Vec::with_capacity(columns.len());
        for (c, column) in columns.iter().enumerate() {
            padded.push(self.pad_component(c, column, held)?);
        }
        Ok(rebuild(&skeleton, &mut padded.into_iter()))
    }

    fn pad_component(
        &self,
        c: usize,
        column: &[Tensor],
        held: &Reservation,
    ) -> Result<Tensor, DatasetError> {
        let first = &column[0];
        let dtype = first.dtype();
        let rank = first.rank();
        let given = self.shapes.get(c);
        if let Some(dims) = given {
            if dims.len() != rank {
                return Err(DatasetError::invalid(format!(
                    "padded_batch: padded shape {dims:?} of component {c} has rank {} but an \
                     element's component has shape {:?}",
                    dims.len(),
                    first.shape()
                )));
            }
        }
        let mut target: Vec<u64> = match given {
            Some(dims) => dims.iter().map(|&d| d.max(0) as u64).collect(),
            None => vec![0; rank],
        };
        for t in column {
            if t.dtype() != dtype {
                return Err(DatasetError::invalid(format!(
                    "cannot batch elements with different dtypes: {dtype} and {} (component {c})",
                    t.dtype()
                )));
            }
            if t.rank() != rank {
                return Err(DatasetError::invalid(format!(
                    "padded_batch: component {c} has elements of different ranks: shapes {:?} \
                     and {:?}",
                    first.shape(),
                    t.shape()
                )));
            }
            for (d, &size) in t.shape().iter().enumerate() {
                let fixed = given.is_some_and(|dims| dims[d] >= 0);
                if !fixed {
                    target[d] = target[d].max(size as u64);
                } else if size as u64 > target[d] {
                    return Err(DatasetError::invalid(format!(
                        "Attempted to pad to a smaller size than the input element: padded \
                         shape {:?} of component {c} is smaller than the element's shape {:?}",
                        given.map(Vec::as_slice).unwrap_or_default(),
                        t.shape()
                    )));
                }
            }
        }
        let value = match self.values.get(c) {
            Some(v) if v.dtype() != dtype => {
                return Err(DatasetError::invalid(format!(
                    "Mismatched type between padding value {} and input elements {dtype} \
                     (component {c})",
                    v.dtype()
                )))
            }
            Some(v) => Some(v),
            None => None,
        };
        let bytes = check_padded_size(column.len() as u64, &target, slot_bytes(dtype), c)?;
        held.grow(bytes)?;
        let target: Vec<usize> = target.iter().map(|&d| d as usize).collect();
        let per_element: usize = target.iter().product();
        let mut shape = Vec::with_capacity(rank + 1);
        shape.push(column.len());
        shape.extend_from_slice(&target);
        if dtype == DType::String {
            let pad = value
                .and_then(|v| v.strings().and_then(|s| s.first().cloned()))
                .unwrap_or_default();
            let mut out = vec![pad; per_element * column.len()];
            for (b, t) in column.iter().enumerate() {
                let src = t.strings().unwrap_or(&[]);
                let dst = &mut out[b * per_element..(b + 1) * per_element];
                copy_padded(src, t.shape(), dst, &target, 1);
            }
            Tensor::from_strings(shape, out)
        } else {
            let size = dtype.size().unwrap_or(1);
            let pad: Vec<u8> = match value.and_then(Tensor::raw_data) {
                Some(b) => b.to_vec(),
                None => vec![0; size],
            };
            let total = per_element * column.len() * size;
            let mut out = if pad.iter().all(|&b| b == 0) {
                vec![0u8; total]
            } else {
                pad.iter().copied().cycle().take(total).collect()
            };
            for (b, t) in column.iter().enumerate() {
                let src = t.raw_data().map(|d| d.as_ref()).unwrap_or(&[]);
                let dst = &mut out[b * per_element * size..(b + 1) * per_element * size];
                copy_padded(src, t.shape(), dst, &target, size);
            }
            Tensor::from_raw(dtype, shape, Bytes::from(out))
        }
    }
}

/// Copies a row-major tensor of `shape` (`unit` slots per value) into the top-left corner of
/// `dst`, a row-major buffer of `target` (every dimension at least `shape`'s).
fn copy_padded<T: Clone>(src: &[T], shape: &[usize], dst: &mut [T], target: &[usize], unit: usize) {
    let Some((&last, outer)) = shape.split_last() else {
        dst[..unit].clone_from_slice(&src[..unit]);
        return;
    };
    if shape.contains(&0) {
        return;
    }
    let row = last * unit;
    // Slots between consecutive indices of each outer dimension of `target`.
    let mut strides = vec![0usize; outer.len()];
    let mut stride = target[outer.len()] * unit;
    for d in (0..outer.len()).rev() {
        strides[d] = stride;
        stride *= target[d];
    }
    let rows: usize = outer.iter().product();
    let mut index = vec![0usize; outer.len()];
    for k in 0..rows {
        let at: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        dst[at..at + row].clone_from_slice(&src[k * row..(k + 1) * row]);
        for d in (0..outer.len()).rev() {
            index[d] += 1;
            if index[d] < outer[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

fn skeleton(e: &Element) -> Skeleton {
    match e {
        Element::Tensor(_) => Skeleton::Leaf,
        Element::Tuple(items) => Skeleton::Tuple(items.iter().map(skeleton).collect()),
        Element::Dict(fields) => Skeleton::Dict(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), skeleton(v)))
                .collect(),
        ),
    }
}

/// The tensors of `e` in tf.data's flattening order, and its structure.
fn flatten(e: Element) -> (Vec<Tensor>, Skeleton) {
    let mut out = Vec::new();
    let s = flatten_into(e, &mut out);
    (out, s)
}

fn flatten_into(e: Element, out: &mut Vec<Tensor>) -> Skeleton {
    match e {
        Element::Tensor(t) => {
            out.push(t);
            Skeleton::Leaf
        }
        Element::Tuple(items) => {
            Skeleton::Tuple(items.into_iter().map(|i| flatten_into(i, out)).collect())
        }
        Element::Dict(fields) => Skeleton::Dict(
            fields
                .into_iter()
                .map(|(k, v)| {
                    let s = flatten_into(v, out);
                    (k, s)
                })
                .collect(),
        ),
    }
}

fn rebuild(s: &Skeleton, leaves: &mut impl Iterator<Item = Tensor>) -> Element {
    match s {
        Skeleton::Leaf => Element::Tensor(
            leaves
                .next()
                .expect("one padded tensor per leaf of the skeleton"),
        ),
        Skeleton::Tuple(items) => {
            Element::Tuple(items.iter().map(|i| rebuild(i, leaves)).collect())
        }
        Skeleton::Dict(fields) => Element::Dict(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), rebuild(v, leaves)))
                .collect(),
        ),
    }
}

/// `unbatch`'s row count of `e`: the first dimension every component shares (tf.data's texts
/// for a scalar component and for components that differ).
pub(crate) fn unbatch_rows(e: &Element) -> Result<usize, DatasetError> {
    let mut leaves = Vec::new();
    collect_leaves(e, &mut leaves);
    let mut rows = None;
    for (i, t) in leaves.iter().enumerate() {
        let Some(&d) = t.shape().first() else {
            return Err(DatasetError::invalid(
                "Input element must have a non-scalar value in each component.",
            ));
        };
        match rows {
            Some(r) if r != d => {
                return Err(DatasetError::invalid(format!(
                    "Input element must have the same batch size in each component. Component \
                     0 has batch size: {r} but component {i} has batch size: {d}."
                )))
            }
            _ => rows = Some(d),
        }
    }
    Ok(rows.unwrap_or(0))
}

fn collect_leaves<'a>(e: &'a Element, out: &mut Vec<&'a Tensor>) {
    match e {
        Element::Tensor(t) => out.push(t),
        Element::Tuple(items) => items.iter().for_each(|i| collect_leaves(i, out)),
        Element::Dict(fields) => fields.values().for_each(|v| collect_leaves(v, out)),
    }
}

/// Row `i` of every component of `e`, sharing the buffers.
pub(crate) fn row_of(e: &Element, i: usize) -> Result<Element, DatasetError> {
    Ok(match e {
        Element::Tensor(t) => Element::Tensor(t.slice(i)?),
        Element::Tuple(items) => Element::Tuple(
            items
                .iter()
                .map(|x| row_of(x, i))
                .collect::<Result<_, _>>()?,
        ),
        Element::Dict(fields) => Element::Dict(
            fields
                .iter()
                .map(|(k, v)| Ok((k.clone(), row_of(v, i)?)))
                .collect::<Result<_, DatasetError>>()?,
        ),
    })
}
