//! `ExampleParser`: the `parse_example` op, serialized `tf.train.Example` records to a dict of
//! tensors, natively (no Python, no TensorFlow on the workers).
//!
//! Rules, as tf.io.parse_single_example has them:
//! - a fixed-length feature fills its shape exactly: `shape` `[]` takes one value, `[2, 3]`
//!   six, row-major; a record that lacks the feature (or holds an empty list for a feature that
//!   needs values) takes the default, and without a default the record is an error naming the
//!   feature;
//! - a variable-length feature is a 1-D tensor of the record's values, empty when it lacks it;
//! - a feature holding another list type than its dtype, or the wrong number of values, is an
//!   error naming the feature and what the record holds.
//!
//! The op's features are checked once when the parser is built (names unique and non-empty,
//! dtype int64, float32 or string, a default of the feature's dtype and shape), so a bad
//! definition fails at registration and the per-record path only matches values.

use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message as _;
use sluice_proto::example as ex;

use crate::dtype::DType;
use crate::element::Element;
use crate::error::DatasetError;
use crate::pb;
use crate::spec::ElementSpec;
use crate::tensor::Tensor;

/// A fixed-length feature of `shape` and `dtype` (int64, float32 or string), with an optional
/// default for records that lack it.
pub fn fixed_len_feature(
    name: &str,
    shape: Vec<u64>,
    dtype: DType,
    default_value: Option<Tensor>,
) -> pb::FeatureSpec {
    pb::FeatureSpec {
        name: name.to_string(),
        dtype: pb::DType::from(dtype) as i32,
        var_len: false,
        shape,
        default_value: default_value.map(|t| t.to_proto()),
    }
}

/// A variable-length feature: a 1-D tensor of however many values each record has.
pub fn var_len_feature(name: &str, dtype: DType) -> pb::FeatureSpec {
    pb::FeatureSpec {
        name: name.to_string(),
        dtype: pb::DType::from(dtype) as i32,
        var_len: true,
        shape: Vec::new(),
        default_value: None,
    }
}

/// The checked features of one `parse_example` op, ready to parse records.
#[derive(Debug, Clone)]
pub struct ExampleParser {
    features: Vec<Feature>,
}

#[derive(Debug, Clone)]
struct Feature {
    name: String,
    dtype: DType,
    kind: FeatureKind,
}

#[derive(Debug, Clone)]
enum FeatureKind {
    Fixed {
        shape: Vec<usize>,
        /// Number of values the shape holds.
        len: usize,
        default: Option<Tensor>,
    },
    Var,
}

/// The values of one feature in a record, by list type.
enum Values<'a> {
    Int64(&'a [i64]),
    Float(&'a [f32]),
    Bytes(&'a [Bytes]),
}

impl Values<'_> {
    fn len(&self) -> usize {
        match self {
            Values::Int64(v) => v.len(),
            Values::Float(v) => v.len(),
            Values::Bytes(v) => v.len(),
        }
    }

    fn list_name(&self) -> &'static str {
        match self {
            Values::Int64(_) => "an int64_list",
            Values::Float(_) => "a float_list",
            Values::Bytes(_) => "a bytes_list",
        }
    }

    /// A tensor of `shape` from these values; the caller checked the count and the type.
    fn to_tensor(&self, shape: Vec<usize>) -> Result<Tensor, DatasetError> {
        match self {
            Values::Int64(v) => Tensor::from_i64s(shape, v),
            Values::Float(v) => Tensor::from_f32s(shape, v),
            Values::Bytes(v) => Tensor::from_strings(shape, v.to_vec()),
        }
    }
}

fn list_name(dtype: DType) -> &'static str {
    match dtype {
        DType::Int64 => "an int64_list",
        DType::Float32 => "a float_list",
        _ => "a bytes_list",
    }
}

fn values_of(feature: &ex::Feature) -> Option<Values<'_>> {
    Some(match feature.kind.as_ref()? {
        ex::feature::Kind::Int64List(l) => Values::Int64(&l.value),
        ex::feature::Kind::FloatList(l) => Values::Float(&l.value),
        ex::feature::Kind::BytesList(l) => Values::Bytes(&l.value),
    })
}

fn matches_dtype(values: &Values<'_>, dtype: DType) -> bool {
    matches!(
        (values, dtype),
        (Values::Int64(_), DType::Int64)
            | (Values::Float(_), DType::Float32)
            | (Values::Bytes(_), DType::String)
    )
}

fn bad(feature: &str, message: String) -> DatasetError {
    DatasetError::BadExample {
        feature: feature.to_string(),
        message,
    }
}

impl ExampleParser {
    /// Checks the op's features (see the module header).
    pub fn new(op: &pb::ParseExampleOp) -> Result<ExampleParser, DatasetError> {
        if op.features.is_empty() {
            return Err(DatasetError::invalid(
                "parse_example needs at least one feature",
            ));
        }
        let mut features = Vec::with_capacity(op.features.len());
        for f in &op.features {
            if f.name.is_empty() {
                return Err(DatasetError::invalid(
                    "parse_example: a feature has no name",
                ));
            }
            if features.iter().any(|g: &Feature| g.name == f.name) {
                return Err(DatasetError::invalid(format!(
                    "parse_example: feature '{}' is given twice",
                    f.name
                )));
            }
            let dtype = DType::try_from(f.dtype())?;
            if !matches!(dtype, DType::Int64 | DType::Float32 | DType::String) {
                return Err(DatasetError::invalid(format!(
                    "parse_example: feature '{}' has dtype {dtype}; a tf.train.Example holds \
                     int64, float32 or string (bytes) values",
                    f.name
                )));
            }
            let kind = if f.var_len {
                FeatureKind::Var
            } else {
                let shape = f
                    .shape
                    .iter()
                    .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
                    .collect::<Vec<_>>();
                let len = shape
                    .iter()
                    .try_fold(1usize, |n, &d| n.checked_mul(d))
                    .ok_or_else(|| {
                        DatasetError::invalid(format!(
                            "parse_example: feature '{}' has a shape too large: {shape:?}",
                            f.name
                        ))
                    })?;
                let default = match &f.default_value {
                    None => None,
                    Some(p) => Some(checked_default(&f.name, dtype, &shape, p)?),
                };
                FeatureKind::Fixed {
                    shape,
                    len,
                    default,
                }
            };
            features.push(Feature {
                name: f.name.clone(),
                dtype,
                kind,
            });
        }
        Ok(ExampleParser { features })
    }

    /// The spec of the dicts this parser produces.
    pub fn spec(&self) -> ElementSpec {
        ElementSpec::Dict(
            self.features
                .iter()
                .map(|f| {
                    let shape = match &f.kind {
                        FeatureKind::Fixed { shape, .. } => {
                            shape.iter().map(|&d| Some(d)).collect()
                        }
                        FeatureKind::Var => vec![None],
                    };
                    (
                        f.name.clone(),
                        ElementSpec::Tensor {
                            dtype: f.dtype,
                            shape,
                        },
                    )
                })
                .collect(),
        )
    }

    /// Checks that the input elements are scalar strings (serialized Examples).
    pub fn check_input(input: &ElementSpec) -> Result<(), DatasetError> {
        match input {
            ElementSpec::Tensor {
                dtype: DType::String,
                shape,
            } if shape.is_empty() => Ok(()),
            other => Err(DatasetError::invalid(format!(
                "parse_example needs scalar string elements (serialized tf.train.Example \
                 records), got {other}"
            ))),
        }
    }

    /// Parses one serialized Example (a scalar string element) into a dict of tensors.
    pub fn parse(&self, element: &Element) -> Result<Element, DatasetError> {
        let record = match element {
            Element::Tensor(t) if t.rank() == 0 => t.strings().and_then(|s| s.first()),
            _ => None,
        };
        let Some(record) = record else {
            return Err(DatasetError::invalid(format!(
                "parse_example needs scalar string elements (serialized tf.train.Example \
                 records), got {}",
                element.spec()
            )));
        };
        // Decoding from `Bytes` lets every bytes value share the record's buffer.
        let example = ex::Example::decode(record.clone()).map_err(|e| {
            DatasetError::invalid(format!(
                "parse_example: a record is not a tf.train.Example: {e}"
            ))
        })?;
        let found = example.features.map(|f| f.feature).unwrap_or_default();
        let mut out = BTreeMap::new();
        for f in &self.features {
            let values = found.get(&f.name).and_then(values_of);
            let tensor = f.parse(values)?;
            out.insert(f.name.clone(), Element::Tensor(tensor));
        }
        Ok(Element::Dict(out))
    }
}

impl Feature {
    fn parse(&self, values: Option<Values<'_>>) -> Result<Tensor, DatasetError> {
        if let Some(v) = &values {
            if !matches_dtype(v, self.dtype) && v.len() > 0 {
                return Err(bad(
                    &self.name,
                    format!(
                        "should be {} ({}), found {} of {}",
                        list_name(self.dtype),
                        self.dtype,
                        v.list_name(),
                        count(v.len())
                    ),
                ));
            }
        }
        // An empty list of another type carries nothing: the feature holds no values.
        let values = values.filter(|v| matches_dtype(v, self.dtype));
        match &self.kind {
            FeatureKind::Var => match values {
                Some(v) => v.to_tensor(vec![v.len()]),
                None => empty(self.dtype),
            },
            FeatureKind::Fixed {
                shape,
                len,
                default,
            } => match (values.filter(|v| v.len() > 0 || *len == 0), default) {
                (Some(v), _) if v.len() == *len => v.to_tensor(shape.clone()),
                (Some(v), _) => Err(bad(
                    &self.name,
                    format!(
                        "should have {} (shape {shape:?}), found {}",
                        count(*len),
                        count(v.len())
                    ),
                )),
                (None, Some(d)) => Ok(d.clone()),
                (None, None) if *len == 0 => empty(self.dtype)?.reshaped(shape),
                (None, None) => Err(bad(
                    &self.name,
                    "is missing from the record and has no default value".to_string(),
                )),
            },
        }
    }
}

fn count(n: usize) -> String {
    if n == 1 {
        "1 value".to_string()
    } else {
        format!("{n} values")
    }
}

fn empty(dtype: DType) -> Result<Tensor, DatasetError> {
    match dtype {
        DType::Int64 => Tensor::from_i64s(vec![0], &[]),
        DType::Float32 => Tensor::from_f32s(vec![0], &[]),
        _ => Tensor::from_strings(vec![0], Vec::new()),
    }
}

/// The default of a fixed-length feature as a tensor of its dtype and shape; a default with as
/// many values in another shape (a flat list) is reshaped, as tf reshapes it.
fn checked_default(
    name: &str,
    dtype: DType,
    shape: &[usize],
    proto: &pb::TensorProto,
) -> Result<Tensor, DatasetError> {
    let t = Tensor::from_proto(proto)?;
    if t.dtype() != dtype {
        return Err(DatasetError::invalid(format!(
            "parse_example: the default value of feature '{name}' is {}, the feature is {dtype}",
            t.dtype()
        )));
    }
    t.reshaped(shape).map_err(|_| {
        DatasetError::invalid(format!(
            "parse_example: the default value of feature '{name}' has shape {:?}, which does \
             not fit the feature's shape {shape:?}",
            t.shape()
        ))
    })
}

/// A `tf.train.Example` holding `features`, serialized (for tests and data generation): integer
/// tensors become int64 lists, float tensors float lists (float64 narrowed to float32, as
/// TensorFlow stores them), strings bytes lists; every tensor is flattened row-major.
pub fn serialize_example(features: &BTreeMap<String, Tensor>) -> Result<Vec<u8>, DatasetError> {
    let mut out = std::collections::HashMap::new();
    for (name, t) in features {
        let kind = match t.dtype() {
            DType::String => ex::feature::Kind::BytesList(ex::BytesList {
                value: t.strings().unwrap_or(&[]).to_vec(),
            }),
            DType::Float32 | DType::Float64 => ex::feature::Kind::FloatList(ex::FloatList {
                value: t
                    .to_f64s()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|v| v as f32)
                    .collect(),
            }),
            d if d.is_integer() && d != DType::UInt64 => {
                ex::feature::Kind::Int64List(ex::Int64List {
                    value: t.to_i64s().unwrap_or_default(),
                })
            }
            d => {
                return Err(DatasetError::invalid(format!(
                    "feature '{name}' is {d}; a tf.train.Example holds integers (up to int64), \
                     floats or strings"
                )))
            }
        };
        out.insert(name.clone(), ex::Feature { kind: Some(kind) });
    }
    Ok(ex::Example {
        features: Some(ex::Features { feature: out }),
    }
    .encode_to_vec())
}

#[cfg(test)]
#[path = "example_parser_tests.rs"]
mod tests;
