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
//! The op's features are checked once when the parser is built (`ExampleSpec` of
//! `sluice-pipeline`: names unique and non-empty, dtype int64, float32 or string, a default of the
//! feature's dtype and shape), so a bad definition fails at registration and the per-record path
//! only matches values.

use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message as _;
use sluice_element::{pb, DType, DatasetError, Element, ElementSpec, Tensor};
use sluice_pipeline::example_spec::{ExampleSpec, Feature, FeatureKind};
use sluice_proto::example as ex;

/// The checked features of one `parse_example` op, ready to parse records.
#[derive(Debug, Clone)]
pub struct ExampleParser {
    spec: ExampleSpec,
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
    /// Checks the op's features (see `ExampleSpec`).
    pub fn new(op: &pb::ParseExampleOp) -> Result<ExampleParser, DatasetError> {
        Ok(ExampleParser {
            spec: ExampleSpec::new(op)?,
        })
    }

    /// The spec of the dicts this parser produces.
    pub fn spec(&self) -> ElementSpec {
        self.spec.element_spec()
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
        for f in &self.spec.features {
            let values = found.get(&f.name).and_then(values_of);
            let tensor = parse_feature(f, values)?;
            out.insert(f.name.clone(), Element::Tensor(tensor));
        }
        Ok(Element::Dict(out))
    }
}

/// The tensor of feature `f` from a record's `values` of it (`None` when the record lacks it).
fn parse_feature(f: &Feature, values: Option<Values<'_>>) -> Result<Tensor, DatasetError> {
    if let Some(v) = &values {
        if !matches_dtype(v, f.dtype) && v.len() > 0 {
            return Err(bad(
                &f.name,
                format!(
                    "should be {} ({}), found {} of {}",
                    list_name(f.dtype),
                    f.dtype,
                    v.list_name(),
                    count(v.len())
                ),
            ));
        }
    }
    // An empty list of another type carries nothing: the feature holds no values.
    let values = values.filter(|v| matches_dtype(v, f.dtype));
    match &f.kind {
        FeatureKind::Var => match values {
            Some(v) => v.to_tensor(vec![v.len()]),
            None => empty(f.dtype),
        },
        FeatureKind::Fixed {
            shape,
            len,
            default,
        } => match (values.filter(|v| v.len() > 0 || *len == 0), default) {
            (Some(v), _) if v.len() == *len => v.to_tensor(shape.clone()),
            (Some(v), _) => Err(bad(
                &f.name,
                format!(
                    "should have {} (shape {shape:?}), found {}",
                    count(*len),
                    count(v.len())
                ),
            )),
            (None, Some(d)) => Ok(d.clone()),
            (None, None) if *len == 0 => empty(f.dtype)?.reshaped(shape),
            (None, None) => Err(bad(
                &f.name,
                "is missing from the record and has no default value".to_string(),
            )),
        },
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
