//! `Slices`: the columns of a `from_slices` source, one tensor or a tuple or dict of tensors
//! (nested), sliced together along their first dimension as tf.data's `from_tensor_slices`.
//!
//! Invariant: every column has rank at least 1 and all columns share the first dimension, the
//! number of rows; row `i` is the element with every column replaced by its `i`th slice.
//! A single tensor keeps the proto's original `tensor` field, so definitions written before
//! structured slices existed still decode, and a one-tensor definition encodes as it always did.

use std::collections::BTreeMap;

use sluice_element::pb::slices_structure::Kind as StructureKind;
use sluice_element::{pb, DatasetError, Element, ElementSpec, Tensor};

/// The validated columns of a slices source.
#[derive(Debug, Clone)]
pub struct Slices {
    columns: Element,
    len: usize,
}

impl Slices {
    /// Checks `columns`: at least one tensor, none a scalar, all first dimensions equal (tf's
    /// `Dimensions 3 and 2 are not compatible` otherwise).
    pub(crate) fn new(columns: Element) -> Result<Slices, DatasetError> {
        let mut len = None;
        check_columns(&columns, &mut len)?;
        let len =
            len.ok_or_else(|| DatasetError::invalid("from_slices needs at least one tensor"))?;
        Ok(Slices { columns, len })
    }

    /// Decodes and checks the source of a definition.
    pub fn from_proto(s: &pb::SlicesSource) -> Result<Slices, DatasetError> {
        let columns = match (&s.tensor, &s.structure) {
            (Some(t), None) => Element::Tensor(Tensor::from_proto(t)?),
            (None, Some(st)) => structure_from_proto(st)?,
            (None, None) => return Err(DatasetError::invalid("from_slices source has no tensor")),
            (Some(_), Some(_)) => {
                return Err(DatasetError::invalid(
                    "from_slices source has both a tensor and a structure",
                ))
            }
        };
        Slices::new(columns)
    }

    /// The proto form: the `tensor` field for one tensor, `structure` otherwise.
    pub(crate) fn to_proto(&self) -> pb::SlicesSource {
        match &self.columns {
            Element::Tensor(t) => pb::SlicesSource {
                tensor: Some(t.to_proto()),
                structure: None,
            },
            other => pb::SlicesSource {
                tensor: None,
                structure: Some(structure_to_proto(other)),
            },
        }
    }

    /// The columns, each with its leading (row) dimension.
    pub(crate) fn columns(&self) -> &Element {
        &self.columns
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Row `index`: every column's slice `index`, in the columns' structure.
    pub fn row(&self, index: usize) -> Result<Element, DatasetError> {
        row_of(&self.columns, index)
    }

    /// The spec of a row: the columns' dtypes and shapes without their first dimension.
    pub(crate) fn row_spec(&self) -> ElementSpec {
        drop_first_dim(self.columns.spec())
    }
}

/// The number of rows of a slices source read from its first tensor's shape, without decoding
/// any data; `None` when the source has no tensor. Only a hint for `cardinality`: `validate`
/// checks the columns agree.
pub(crate) fn proto_len(s: &pb::SlicesSource) -> Option<u64> {
    fn first(st: &pb::SlicesStructure) -> Option<u64> {
        match st.kind.as_ref()? {
            StructureKind::Tensor(t) => t.shape.first().copied(),
            StructureKind::Tuple(l) => l.items.iter().find_map(first),
            StructureKind::Dict(d) => d.fields.iter().find_map(|f| first(f.value.as_ref()?)),
        }
    }
    match (&s.tensor, &s.structure) {
        (Some(t), _) => t.shape.first().copied(),
        (None, Some(st)) => first(st),
        (None, None) => None,
    }
}

/// Every column of a `from_slices` has as many rows as the first one (`len`, set by it).
fn same_rows(len: &mut Option<usize>, rows: usize) -> Result<(), DatasetError> {
    match *len {
        Some(n) if n != rows => Err(DatasetError::invalid(format!(
            "Dimensions {n} and {rows} are not compatible"
        ))),
        _ => {
            *len = Some(rows);
            Ok(())
        }
    }
}

fn check_columns(e: &Element, len: &mut Option<usize>) -> Result<(), DatasetError> {
    match e {
        Element::Tensor(t) => {
            let Some(&rows) = t.shape().first() else {
                return Err(DatasetError::invalid(
                    "from_slices needs a tensor of rank at least 1, got a scalar",
                ));
            };
            same_rows(len, rows)
        }
        Element::Tuple(items) => items.iter().try_for_each(|i| check_columns(i, len)),
        Element::Dict(fields) => fields.values().try_for_each(|v| check_columns(v, len)),
    }
}

fn row_of(e: &Element, index: usize) -> Result<Element, DatasetError> {
    Ok(match e {
        Element::Tensor(t) => Element::Tensor(t.slice(index)?),
        Element::Tuple(items) => Element::Tuple(
            items
                .iter()
                .map(|i| row_of(i, index))
                .collect::<Result<_, _>>()?,
        ),
        Element::Dict(fields) => Element::Dict(
            fields
                .iter()
                .map(|(k, v)| Ok((k.clone(), row_of(v, index)?)))
                .collect::<Result<_, DatasetError>>()?,
        ),
    })
}

pub(crate) fn drop_first_dim(spec: ElementSpec) -> ElementSpec {
    match spec {
        ElementSpec::Tensor { dtype, mut shape } => {
            if !shape.is_empty() {
                shape.remove(0);
            }
            ElementSpec::Tensor { dtype, shape }
        }
        ElementSpec::Tuple(items) => {
            ElementSpec::Tuple(items.into_iter().map(drop_first_dim).collect())
        }
        ElementSpec::Dict(fields) => ElementSpec::Dict(
            fields
                .into_iter()
                .map(|(k, v)| (k, drop_first_dim(v)))
                .collect(),
        ),
        ElementSpec::Unknown => ElementSpec::Unknown,
    }
}

pub(crate) fn structure_to_proto(e: &Element) -> pb::SlicesStructure {
    let kind = match e {
        Element::Tensor(t) => StructureKind::Tensor(t.to_proto()),
        Element::Tuple(items) => StructureKind::Tuple(pb::SlicesList {
            items: items.iter().map(structure_to_proto).collect(),
        }),
        Element::Dict(fields) => StructureKind::Dict(pb::SlicesDict {
            fields: fields
                .iter()
                .map(|(k, v)| pb::NamedSlices {
                    name: k.clone(),
                    value: Some(structure_to_proto(v)),
                })
                .collect(),
        }),
    };
    pb::SlicesStructure { kind: Some(kind) }
}

pub(crate) fn structure_from_proto(st: &pb::SlicesStructure) -> Result<Element, DatasetError> {
    let missing = || DatasetError::invalid("from_slices structure has an empty entry");
    Ok(match st.kind.as_ref().ok_or_else(missing)? {
        StructureKind::Tensor(t) => Element::Tensor(Tensor::from_proto(t)?),
        StructureKind::Tuple(l) => Element::Tuple(
            l.items
                .iter()
                .map(structure_from_proto)
                .collect::<Result<_, _>>()?,
        ),
        StructureKind::Dict(d) => {
            let mut fields = BTreeMap::new();
            for f in &d.fields {
                let value = structure_from_proto(f.value.as_ref().ok_or_else(missing)?)?;
                if fields.insert(f.name.clone(), value).is_some() {
                    return Err(DatasetError::invalid(format!(
                        "from_slices dict has the key '{}' twice",
                        f.name
                    )));
                }
            }
            Element::Dict(fields)
        }
    })
}

#[cfg(test)]
#[path = "slices_tests.rs"]
mod tests;

/// Whether a tensor of `st` keeps its data in a blob (see `sluice_element::blob_tensors`): then
/// the dispatcher, which never holds a blob's bytes in its state, analyses the structure from
/// its tensors' dtypes and shapes alone ([`proto_spec`], [`proto_rows`]).
pub(crate) fn names_blobs(st: &pb::SlicesStructure) -> bool {
    match &st.kind {
        Some(StructureKind::Tensor(t)) => !t.blob_digest.is_empty(),
        Some(StructureKind::Tuple(l)) => l.items.iter().any(names_blobs),
        Some(StructureKind::Dict(d)) => d
            .fields
            .iter()
            .any(|f| f.value.as_ref().is_some_and(names_blobs)),
        None => false,
    }
}

/// Whether a tensor of the slices source `s` keeps its data in a blob.
pub(crate) fn source_names_blobs(s: &pb::SlicesSource) -> bool {
    s.tensor.as_ref().is_some_and(|t| !t.blob_digest.is_empty())
        || s.structure.as_ref().is_some_and(names_blobs)
}

/// The spec of `st` read from its tensors' dtypes and shapes, without decoding any data; the
/// structure is checked as `structure_from_proto` checks it (no empty entry, no key twice).
pub(crate) fn proto_spec(st: &pb::SlicesStructure) -> Result<ElementSpec, DatasetError> {
    let missing = || DatasetError::invalid("from_slices structure has an empty entry");
    Ok(match st.kind.as_ref().ok_or_else(missing)? {
        StructureKind::Tensor(t) => tensor_proto_spec(t)?,
        StructureKind::Tuple(l) => {
            ElementSpec::Tuple(l.items.iter().map(proto_spec).collect::<Result<_, _>>()?)
        }
        StructureKind::Dict(d) => {
            let mut fields = BTreeMap::new();
            for f in &d.fields {
                let value = proto_spec(f.value.as_ref().ok_or_else(missing)?)?;
                if fields.insert(f.name.clone(), value).is_some() {
                    return Err(DatasetError::invalid(format!(
                        "from_slices dict has the key '{}' twice",
                        f.name
                    )));
                }
            }
            ElementSpec::Dict(fields)
        }
    })
}

/// A tensor's spec from its dtype and shape.
fn tensor_proto_spec(t: &pb::TensorProto) -> Result<ElementSpec, DatasetError> {
    let dtype = sluice_element::DType::try_from(t.dtype)?;
    let shape = t
        .shape
        .iter()
        .map(|&d| {
            usize::try_from(d)
                .map(Some)
                .map_err(|_| DatasetError::invalid(format!("dimension {d} is too large")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ElementSpec::Tensor { dtype, shape })
}

/// The row spec and the number of rows of a slices source, from its tensors' dtypes and shapes
/// alone: every column has rank at least 1 and all share the first dimension, as
/// `Slices::new` checks.
pub(crate) fn proto_rows(s: &pb::SlicesSource) -> Result<(ElementSpec, usize), DatasetError> {
    fn check(spec: &ElementSpec, len: &mut Option<usize>) -> Result<(), DatasetError> {
        match spec {
            ElementSpec::Tensor { shape, .. } => {
                let Some(&Some(rows)) = shape.first() else {
                    return Err(DatasetError::invalid(
                        "from_slices needs a tensor of rank at least 1, got a scalar",
                    ));
                };
                same_rows(len, rows)
            }
            ElementSpec::Tuple(items) => items.iter().try_for_each(|i| check(i, len)),
            ElementSpec::Dict(fields) => fields.values().try_for_each(|v| check(v, len)),
            ElementSpec::Unknown => Ok(()),
        }
    }
    let spec = match (&s.tensor, &s.structure) {
        (Some(t), None) => tensor_proto_spec(t)?,
        (None, Some(st)) => proto_spec(st)?,
        (None, None) => return Err(DatasetError::invalid("from_slices source has no tensor")),
        (Some(_), Some(_)) => {
            return Err(DatasetError::invalid(
                "from_slices source has both a tensor and a structure",
            ))
        }
    };
    let mut len = None;
    check(&spec, &mut len)?;
    let len = len.ok_or_else(|| DatasetError::invalid("from_slices needs at least one tensor"))?;
    Ok((drop_first_dim(spec), len))
}
