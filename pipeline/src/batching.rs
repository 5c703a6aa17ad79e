//! `padded_batch` and `unbatch`: the checks of their arguments and the specs of their outputs,
//! with tf.data's rules and texts. Running them is the executor's; both sides flatten elements
//! the same way (`flatten_spec`: tuples in order, dicts by sorted key, depth first).

use sluice_element::{pb, DType, DatasetError, ElementSpec, Tensor};

/// The most bytes one padded component of one batch may take (4 GiB): a `padded_batch` whose
/// given padded shapes (times the batch size) pass it is refused when the definition is
/// checked, and a batch padded to its elements' largest dimensions is refused before its
/// buffer is allocated. Strings count 8 bytes per slot, what an empty string's handle takes.
pub const MAX_PADDED_BATCH_BYTES: u64 = 4 << 30;

/// The most dimensions one padded shape may have (what tensors of any sane element have).
pub const MAX_PADDED_RANK: usize = 32;

/// The leaves of `spec` in tf.data's flattening order, each with its path for messages.
pub fn flatten_spec(spec: &ElementSpec) -> Vec<&ElementSpec> {
    let mut out = Vec::new();
    let mut stack = vec![spec];
    while let Some(s) = stack.pop() {
        match s {
            ElementSpec::Tuple(items) => stack.extend(items.iter().rev()),
            ElementSpec::Dict(fields) => stack.extend(fields.values().rev()),
            leaf => out.push(leaf),
        }
    }
    out
}

/// The bytes one slot of `dtype` takes in a padded batch.
pub fn slot_bytes(dtype: DType) -> u64 {
    dtype.size().unwrap_or(8) as u64
}

/// Checks a `padded_batch` op alone: a positive batch size, padded dimensions of -1 or more,
/// at most `MAX_PADDED_RANK` of them, scalar padding values, one padding value per padded
/// shape when both are given, and no fully given padded component past
/// `MAX_PADDED_BATCH_BYTES`.
pub fn check_padded_batch(op: &pb::PaddedBatchOp) -> Result<(), DatasetError> {
    if op.batch_size == 0 {
        return Err(DatasetError::invalid("batch size must be positive, got 0"));
    }
    for (i, shape) in op.padded_shapes.iter().enumerate() {
        if shape.dims.len() > MAX_PADDED_RANK {
            return Err(DatasetError::invalid(format!(
                "padded_batch: padded shape {i} has {} dimensions, more than the limit of \
                 {MAX_PADDED_RANK}",
                shape.dims.len()
            )));
        }
        if let Some(d) = shape.dims.iter().find(|&&d| d < -1) {
            return Err(DatasetError::invalid(format!(
                "padded_batch: padded shape {i} has dimension {d}; a dimension is -1 (the \
                 batch's largest) or a size"
            )));
        }
    }
    let values = padding_values(op)?;
    if !op.padded_shapes.is_empty() && !values.is_empty() && values.len() != op.padded_shapes.len()
    {
        return Err(DatasetError::invalid(format!(
            "padded_batch: {} padding values for {} padded shapes; give one per component",
            values.len(),
            op.padded_shapes.len()
        )));
    }
    for (i, shape) in op.padded_shapes.iter().enumerate() {
        if shape.dims.iter().all(|&d| d >= 0) {
            let slot = values.get(i).map_or(1, |v| slot_bytes(v.dtype()));
            let dims: Vec<u64> = shape.dims.iter().map(|&d| d as u64).collect();
            check_padded_size(op.batch_size, &dims, slot, i)?;
        }
    }
    Ok(())
}

/// Refuses a padded component of `batch` elements of shape `dims`, `slot` bytes each, past
/// `MAX_PADDED_BATCH_BYTES` (or past what a `u64` counts).
pub fn check_padded_size(
    batch: u64,
    dims: &[u64],
    slot: u64,
    component: usize,
) -> Result<u64, DatasetError> {
    let bytes = dims
        .iter()
        .try_fold(batch.checked_mul(slot), |acc, &d| {
            acc.map(|a| a.checked_mul(d))
        })
        .flatten();
    match bytes {
        Some(b) if b <= MAX_PADDED_BATCH_BYTES => Ok(b),
        _ => Err(DatasetError::invalid(format!(
            "padded_batch: component {component} padded to {dims:?} in batches of {batch} would \
             take {} bytes, more than the limit of {MAX_PADDED_BATCH_BYTES}",
            bytes.map_or_else(|| "more than 2^64".to_string(), |b| b.to_string())
        ))),
    }
}

/// The padding values of `op`, each checked to be a scalar (tf.data's text).
pub fn padding_values(op: &pb::PaddedBatchOp) -> Result<Vec<Tensor>, DatasetError> {
    op.padding_values
        .iter()
        .map(|p| {
            let t = Tensor::from_proto(p)?;
            if t.rank() != 0 {
                return Err(DatasetError::invalid(format!(
                    "Invalid padding value: a tensor of shape {:?}. Padding values should be \
                     scalars.",
                    t.shape()
                )));
            }
            Ok(t)
        })
        .collect()
}

/// The spec `padded_batch` produces from elements of spec `input`, with tf.data's checks: one
/// padded shape (and padding value) per component, of the component's rank, no given
/// dimension smaller than a known one of the input, padding values of the component's dtype.
/// An input not known before elements exist (a Python function's output) gives `Unknown`,
/// checked on the first batch instead.
pub fn padded_batch_spec(
    op: &pb::PaddedBatchOp,
    input: &ElementSpec,
) -> Result<ElementSpec, DatasetError> {
    check_padded_batch(op)?;
    if input.has_unknown() {
        return Ok(ElementSpec::Unknown);
    }
    let components = flatten_spec(input);
    let values = padding_values(op)?;
    check_counts(op.padded_shapes.len(), values.len(), components.len())?;
    let mut padded = Vec::with_capacity(components.len());
    for (i, c) in components.iter().enumerate() {
        let ElementSpec::Tensor { dtype, shape } = c else {
            unreachable!("flatten_spec yields tensor leaves of a known spec")
        };
        if let Some(v) = values.get(i) {
            if v.dtype() != *dtype {
                return Err(DatasetError::invalid(format!(
                    "Mismatched type between padding value {} and input elements {} \
                     (component {i})",
                    v.dtype(),
                    dtype
                )));
            }
        }
        let out: Vec<Option<usize>> = match op.padded_shapes.get(i) {
            None => shape.clone(),
            Some(given) => {
                let compatible = given.dims.len() == shape.len()
                    && given.dims.iter().zip(shape).all(|(&g, &s)| match s {
                        Some(s) => g < 0 || g as u64 >= s as u64,
                        None => true,
                    });
                if !compatible {
                    return Err(DatasetError::invalid(format!(
                        "The padded shape {} is not compatible with the shape {} of the \
                         corresponding input component (component {i}).",
                        show_dims(&given.dims),
                        show_shape(shape)
                    )));
                }
                given
                    .dims
                    .iter()
                    .map(|&g| usize::try_from(g).ok())
                    .collect()
            }
        };
        padded.push(ElementSpec::Tensor {
            dtype: *dtype,
            shape: out,
        });
    }
    let padded = rebuild(input, &mut padded.into_iter());
    Ok(padded.batched(op.batch_size, op.drop_remainder))
}

/// Refuses padded shapes or padding values that are not one per component.
pub fn check_counts(shapes: usize, values: usize, components: usize) -> Result<(), DatasetError> {
    for (what, n) in [("padded_shapes", shapes), ("padding_values", values)] {
        if n != 0 && n != components {
            return Err(DatasetError::invalid(format!(
                "padded_batch: {what} has {n} components but the element has {components}; \
                 they must have the same structure"
            )));
        }
    }
    Ok(())
}

/// `like`'s structure with its leaves taken in order from `leaves`.
fn rebuild(like: &ElementSpec, leaves: &mut impl Iterator<Item = ElementSpec>) -> ElementSpec {
    match like {
        ElementSpec::Tuple(items) => {
            ElementSpec::Tuple(items.iter().map(|i| rebuild(i, leaves)).collect())
        }
        ElementSpec::Dict(fields) => ElementSpec::Dict(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), rebuild(v, leaves)))
                .collect(),
        ),
        _ => leaves.next().unwrap_or(ElementSpec::Unknown),
    }
}

/// `(3, ?)` as tf prints shapes.
fn show_shape(shape: &[Option<usize>]) -> String {
    let dims: Vec<String> = shape
        .iter()
        .map(|d| d.map_or_else(|| "None".to_string(), |d| d.to_string()))
        .collect();
    format!("({})", dims.join(", "))
}

fn show_dims(dims: &[i64]) -> String {
    let dims: Vec<String> = dims
        .iter()
        .map(|&d| {
            if d < 0 {
                "None".to_string()
            } else {
                d.to_string()
            }
        })
        .collect();
    format!("({})", dims.join(", "))
}

/// The spec `unbatch` produces: every component without its first dimension, with
/// tf.data's errors for a scalar component and for known first dimensions that differ.
pub fn unbatch_spec(input: &ElementSpec) -> Result<ElementSpec, DatasetError> {
    if input.has_unknown() {
        return Ok(ElementSpec::Unknown);
    }
    unbatch_batch_dim(input)?;
    Ok(strip_first(input))
}

/// The first dimension every component of `input` shares, when it is known (`None`: not
/// known statically).
pub fn unbatch_batch_dim(input: &ElementSpec) -> Result<Option<usize>, DatasetError> {
    let mut known: Option<usize> = None;
    for c in flatten_spec(input) {
        let ElementSpec::Tensor { shape, .. } = c else {
            return Ok(None);
        };
        match shape.first() {
            None => {
                return Err(DatasetError::invalid(
                    "Cannot unbatch an input with scalar components.",
                ))
            }
            Some(Some(d)) => match known {
                Some(k) if k != *d => {
                    return Err(DatasetError::invalid(format!(
                        "`unbatch()` is only supported for datasets of elements whose \
                         components have a matching leading dimension. Encountered both {k} \
                         and {d}."
                    )))
                }
                _ => known = Some(*d),
            },
            Some(None) => {}
        }
    }
    Ok(known)
}

fn strip_first(spec: &ElementSpec) -> ElementSpec {
    match spec {
        ElementSpec::Tensor { dtype, shape } => ElementSpec::Tensor {
            dtype: *dtype,
            shape: shape.iter().skip(1).copied().collect(),
        },
        ElementSpec::Tuple(items) => ElementSpec::Tuple(items.iter().map(strip_first).collect()),
        ElementSpec::Dict(fields) => ElementSpec::Dict(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), strip_first(v)))
                .collect(),
        ),
        ElementSpec::Unknown => ElementSpec::Unknown,
    }
}
