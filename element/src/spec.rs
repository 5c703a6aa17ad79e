//! `ElementSpec`: the static type of a dataset's elements (structure, dtypes, shapes with unknown
//! dimensions), as tf.data's `element_spec`.
//!
//! Computing a definition's spec is in `analysis.rs`; this file holds the type, its proto form
//! (unknown dimension = -1) and its tf-like `Display`.

use std::collections::BTreeMap;
use std::fmt;

use crate::dtype::DType;
use crate::error::DatasetError;
use crate::pb;

/// Structure, dtypes and shapes of a dataset's elements. `None` in a shape is an unknown dim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElementSpec {
    Tensor {
        dtype: DType,
        shape: Vec<Option<usize>>,
    },
    Tuple(Vec<ElementSpec>),
    Dict(BTreeMap<String, ElementSpec>),
    /// Not known before elements exist: the output of a Python function given no output spec
    /// (and whatever follows it). Its proto form is an `ElementSpec` with no kind.
    Unknown,
}

impl ElementSpec {
    /// A scalar of `dtype`.
    pub fn scalar(dtype: DType) -> ElementSpec {
        ElementSpec::Tensor {
            dtype,
            shape: Vec::new(),
        }
    }

    /// The spec after batching: every component gains a leading dimension, known only when the
    /// partial last batch is dropped.
    pub fn batched(&self, batch_size: u64, drop_remainder: bool) -> ElementSpec {
        match self {
            ElementSpec::Tensor { dtype, shape } => {
                let lead = if drop_remainder {
                    usize::try_from(batch_size).ok()
                } else {
                    None
                };
                let mut s = Vec::with_capacity(shape.len() + 1);
                s.push(lead);
                s.extend_from_slice(shape);
                ElementSpec::Tensor {
                    dtype: *dtype,
                    shape: s,
                }
            }
            ElementSpec::Tuple(items) => ElementSpec::Tuple(
                items
                    .iter()
                    .map(|i| i.batched(batch_size, drop_remainder))
                    .collect(),
            ),
            ElementSpec::Dict(fields) => ElementSpec::Dict(
                fields
                    .iter()
                    .map(|(k, v)| (k.clone(), v.batched(batch_size, drop_remainder)))
                    .collect(),
            ),
            ElementSpec::Unknown => ElementSpec::Unknown,
        }
    }

    /// This spec with its `Unknown` parts taken from `element`, the first element a dataset
    /// produced (so every dimension of those parts is the element's); known parts stay as
    /// they are. A structure that does not match the element's keeps its `Unknown` parts.
    pub fn filled_from(&self, element: &crate::Element) -> ElementSpec {
        use crate::Element;
        match (self, element) {
            (ElementSpec::Unknown, e) => e.spec(),
            (ElementSpec::Tuple(specs), Element::Tuple(items)) if specs.len() == items.len() => {
                ElementSpec::Tuple(
                    specs
                        .iter()
                        .zip(items)
                        .map(|(s, e)| s.filled_from(e))
                        .collect(),
                )
            }
            (ElementSpec::Dict(specs), Element::Dict(fields)) => ElementSpec::Dict(
                specs
                    .iter()
                    .map(|(k, s)| {
                        let filled = fields
                            .get(k)
                            .map_or_else(|| s.clone(), |e| s.filled_from(e));
                        (k.clone(), filled)
                    })
                    .collect(),
            ),
            (known, _) => known.clone(),
        }
    }

    /// Whether any part is `Unknown`.
    pub fn has_unknown(&self) -> bool {
        match self {
            ElementSpec::Tensor { .. } => false,
            ElementSpec::Tuple(items) => items.iter().any(ElementSpec::has_unknown),
            ElementSpec::Dict(fields) => fields.values().any(ElementSpec::has_unknown),
            ElementSpec::Unknown => true,
        }
    }

    /// Every tensor component's dtype, in structure order (dict fields sorted).
    pub fn dtypes(&self) -> Vec<DType> {
        let mut out = Vec::new();
        self.collect_dtypes(&mut out);
        out
    }

    fn collect_dtypes(&self, out: &mut Vec<DType>) {
        match self {
            ElementSpec::Tensor { dtype, .. } => out.push(*dtype),
            ElementSpec::Tuple(items) => items.iter().for_each(|i| i.collect_dtypes(out)),
            ElementSpec::Dict(fields) => fields.values().for_each(|v| v.collect_dtypes(out)),
            ElementSpec::Unknown => {}
        }
    }

    /// Replaces the dtype of every component, keeping shapes.
    pub fn with_dtype(&self, to: DType) -> ElementSpec {
        match self {
            ElementSpec::Tensor { shape, .. } => ElementSpec::Tensor {
                dtype: to,
                shape: shape.clone(),
            },
            ElementSpec::Tuple(items) => {
                ElementSpec::Tuple(items.iter().map(|i| i.with_dtype(to)).collect())
            }
            ElementSpec::Dict(fields) => ElementSpec::Dict(
                fields
                    .iter()
                    .map(|(k, v)| (k.clone(), v.with_dtype(to)))
                    .collect(),
            ),
            ElementSpec::Unknown => ElementSpec::Unknown,
        }
    }

    pub fn to_proto(&self) -> pb::ElementSpec {
        use pb::element_spec::Kind;
        let kind = match self {
            ElementSpec::Unknown => return pb::ElementSpec { kind: None },
            ElementSpec::Tensor { dtype, shape } => Kind::Tensor(pb::ComponentSpec {
                dtype: pb::DType::from(*dtype) as i32,
                shape: shape.iter().map(|d| d.map_or(-1, |d| d as i64)).collect(),
            }),
            ElementSpec::Tuple(items) => Kind::Tuple(pb::SpecList {
                items: items.iter().map(ElementSpec::to_proto).collect(),
            }),
            ElementSpec::Dict(fields) => Kind::Dict(pb::SpecDict {
                fields: fields
                    .iter()
                    .map(|(k, v)| pb::NamedSpec {
                        name: k.clone(),
                        spec: Some(v.to_proto()),
                    })
                    .collect(),
            }),
        };
        pb::ElementSpec { kind: Some(kind) }
    }

    pub fn from_proto(p: &pb::ElementSpec) -> Result<Self, DatasetError> {
        use pb::element_spec::Kind;
        match &p.kind {
            None => Ok(ElementSpec::Unknown),
            Some(Kind::Tensor(c)) => {
                let dtype = DType::try_from(c.dtype)?;
                let shape = c
                    .shape
                    .iter()
                    .map(|&d| match d {
                        -1 => Ok(None),
                        d => usize::try_from(d).map(Some).map_err(|_| {
                            DatasetError::invalid(format!("invalid dimension {d} in element spec"))
                        }),
                    })
                    .collect::<Result<_, _>>()?;
                Ok(ElementSpec::Tensor { dtype, shape })
            }
            Some(Kind::Tuple(l)) => Ok(ElementSpec::Tuple(
                l.items
                    .iter()
                    .map(ElementSpec::from_proto)
                    .collect::<Result<_, _>>()?,
            )),
            Some(Kind::Dict(d)) => {
                let mut fields = BTreeMap::new();
                for f in &d.fields {
                    let spec = f.spec.as_ref().ok_or_else(|| {
                        DatasetError::invalid(format!("dict field '{}' has no spec", f.name))
                    })?;
                    if fields
                        .insert(f.name.clone(), ElementSpec::from_proto(spec)?)
                        .is_some()
                    {
                        return Err(DatasetError::invalid(format!(
                            "duplicate dict field '{}'",
                            f.name
                        )));
                    }
                }
                Ok(ElementSpec::Dict(fields))
            }
        }
    }
}

/// tf-like: `TensorSpec(shape=(None, 3), dtype=int64)`, tuples as `(a, b)`, dicts as
/// `{'k': spec}`.
impl fmt::Display for ElementSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElementSpec::Tensor { dtype, shape } => {
                f.write_str("TensorSpec(shape=(")?;
                for (i, d) in shape.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    match d {
                        Some(d) => write!(f, "{d}")?,
                        None => f.write_str("None")?,
                    }
                }
                if shape.len() == 1 {
                    f.write_str(",")?;
                }
                write!(f, "), dtype={dtype})")
            }
            ElementSpec::Tuple(items) => {
                f.write_str("(")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                if items.len() == 1 {
                    f.write_str(",")?;
                }
                f.write_str(")")
            }
            ElementSpec::Dict(fields) => {
                f.write_str("{")?;
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "'{k}': {v}")?;
                }
                f.write_str("}")
            }
            ElementSpec::Unknown => f.write_str("<known from the first element>"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dtype: DType, shape: &[Option<usize>]) -> ElementSpec {
        ElementSpec::Tensor {
            dtype,
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn unknown_parts_are_filled_from_the_first_element_and_known_ones_kept() {
        use crate::{Element, Tensor};
        let element = Element::Tuple(vec![
            Element::Tensor(Tensor::scalar_i64(1)),
            Element::Tensor(Tensor::from_values(vec![2], &[1.0f32, 2.0]).unwrap()),
        ]);
        let cases = [
            (
                ElementSpec::Unknown,
                ElementSpec::Tuple(vec![t(DType::Int64, &[]), t(DType::Float32, &[Some(2)])]),
            ),
            (
                ElementSpec::Tuple(vec![t(DType::Int64, &[]), ElementSpec::Unknown]),
                ElementSpec::Tuple(vec![t(DType::Int64, &[]), t(DType::Float32, &[Some(2)])]),
            ),
            (
                ElementSpec::Tuple(vec![t(DType::Int64, &[]), t(DType::Float32, &[None])]),
                ElementSpec::Tuple(vec![t(DType::Int64, &[]), t(DType::Float32, &[None])]),
            ),
            // A structure other than the element's stays as it was.
            (
                ElementSpec::Tuple(vec![ElementSpec::Unknown]),
                ElementSpec::Tuple(vec![ElementSpec::Unknown]),
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(spec.filled_from(&element), want, "{spec}");
        }
        let dict = Element::Dict(BTreeMap::from([(
            "a".to_string(),
            Element::Tensor(Tensor::scalar_bool(true)),
        )]));
        let spec = ElementSpec::Dict(BTreeMap::from([("a".to_string(), ElementSpec::Unknown)]));
        assert_eq!(
            spec.filled_from(&dict),
            ElementSpec::Dict(BTreeMap::from([("a".to_string(), t(DType::Bool, &[]))]))
        );
    }

    #[test]
    fn display_is_tf_like() {
        assert_eq!(
            t(DType::Int64, &[]).to_string(),
            "TensorSpec(shape=(), dtype=int64)"
        );
        assert_eq!(
            t(DType::Int64, &[None]).to_string(),
            "TensorSpec(shape=(None,), dtype=int64)"
        );
        assert_eq!(
            t(DType::Float32, &[Some(2), None]).to_string(),
            "TensorSpec(shape=(2, None), dtype=float32)"
        );
        assert_eq!(
            ElementSpec::Tuple(vec![t(DType::Bool, &[])]).to_string(),
            "(TensorSpec(shape=(), dtype=bool),)"
        );
        let d = ElementSpec::Dict(BTreeMap::from([("a".to_string(), t(DType::String, &[]))]));
        assert_eq!(d.to_string(), "{'a': TensorSpec(shape=(), dtype=string)}");
    }

    #[test]
    fn proto_round_trip() {
        let spec = ElementSpec::Tuple(vec![
            t(DType::Int64, &[None, Some(3)]),
            ElementSpec::Dict(BTreeMap::from([
                ("a".to_string(), t(DType::String, &[])),
                ("b".to_string(), t(DType::UInt8, &[Some(0)])),
            ])),
        ]);
        assert_eq!(ElementSpec::from_proto(&spec.to_proto()).unwrap(), spec);
        assert_eq!(
            ElementSpec::from_proto(&pb::ElementSpec { kind: None }).unwrap(),
            ElementSpec::Unknown
        );
        let bad = pb::ElementSpec {
            kind: Some(pb::element_spec::Kind::Tensor(pb::ComponentSpec {
                dtype: 5,
                shape: vec![-7],
            })),
        };
        assert!(ElementSpec::from_proto(&bad).is_err());
    }

    #[test]
    fn batching_adds_a_leading_dimension() {
        let s = t(DType::Int64, &[Some(2)]);
        assert_eq!(s.batched(4, false), t(DType::Int64, &[None, Some(2)]));
        assert_eq!(s.batched(4, true), t(DType::Int64, &[Some(4), Some(2)]));
    }
}
