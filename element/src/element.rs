//! `Element`: one item of a dataset, a nested structure (tuple, dict) of tensors; and
//! `ElementIter`, a stream of them.
//!
//! Dict keys are kept in a `BTreeMap` so iteration order is the sorted order tf.data uses; specs,
//! batching and the codec rely on that order.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::dtype::DType;
use crate::error::DatasetError;
use crate::spec::ElementSpec;
use crate::tensor::Tensor;

/// A stream of elements; an `Err` item reports a failure at that point of the stream.
pub type ElementIter = Box<dyn Iterator<Item = Result<Element, DatasetError>> + Send>;

/// One dataset element.
#[derive(Debug, Clone, PartialEq)]
pub enum Element {
    Tensor(Tensor),
    Tuple(Vec<Element>),
    Dict(BTreeMap<String, Element>),
}

impl From<Tensor> for Element {
    fn from(t: Tensor) -> Self {
        Element::Tensor(t)
    }
}

impl Element {
    /// The JSON form `sluice read` prints: a scalar as a number (bool as `true`/`false`, string
    /// as a JSON string, invalid UTF-8 replaced), a tensor as nested arrays, a tuple as an array,
    /// a dict as an object. Non-finite floats become `null` (JSON has no NaN).
    pub fn to_json(&self) -> Value {
        match self {
            Element::Tensor(t) => tensor_json(t),
            Element::Tuple(items) => Value::Array(items.iter().map(Element::to_json).collect()),
            Element::Dict(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The value of a scalar integer tensor.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Element::Tensor(t) => t.as_i64_scalar(),
            Element::Tuple(_) | Element::Dict(_) => None,
        }
    }

    /// The tensor, if this element is a bare tensor.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Element::Tensor(t) => Some(t),
            Element::Tuple(_) | Element::Dict(_) => None,
        }
    }

    /// Sum of the payload sizes of all tensors.
    pub fn byte_size(&self) -> usize {
        match self {
            Element::Tensor(t) => t.byte_size(),
            Element::Tuple(items) => items.iter().map(Element::byte_size).sum(),
            Element::Dict(fields) => fields.values().map(Element::byte_size).sum(),
        }
    }

    /// The spec of this concrete element (every dimension known).
    pub fn spec(&self) -> ElementSpec {
        match self {
            Element::Tensor(t) => ElementSpec::Tensor {
                dtype: t.dtype(),
                shape: t.shape().iter().map(|&d| Some(d)).collect(),
            },
            Element::Tuple(items) => ElementSpec::Tuple(items.iter().map(Element::spec).collect()),
            Element::Dict(fields) => {
                ElementSpec::Dict(fields.iter().map(|(k, v)| (k.clone(), v.spec())).collect())
            }
        }
    }
}

fn tensor_json(t: &Tensor) -> Value {
    let flat: Vec<Value> = match t.dtype() {
        DType::String => t
            .strings()
            .unwrap_or(&[])
            .iter()
            .map(|s| Value::String(String::from_utf8_lossy(s).into_owned()))
            .collect(),
        DType::Bool => t
            .to_values::<bool>()
            .unwrap_or_default()
            .into_iter()
            .map(Value::Bool)
            .collect(),
        DType::UInt64 => t
            .to_values::<u64>()
            .unwrap_or_default()
            .into_iter()
            .map(Value::from)
            .collect(),
        DType::Float32 | DType::Float64 => t
            .to_f64s()
            .unwrap_or_default()
            .into_iter()
            .map(|v| serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
            .collect(),
        DType::Int8
        | DType::Int16
        | DType::Int32
        | DType::Int64
        | DType::UInt8
        | DType::UInt16
        | DType::UInt32 => t
            .to_i64s()
            .unwrap_or_default()
            .into_iter()
            .map(Value::from)
            .collect(),
    };
    let mut flat = flat.into_iter();
    nest(&mut flat, t.shape())
}

/// Builds nested arrays of `shape` from row-major values.
fn nest(flat: &mut impl Iterator<Item = Value>, shape: &[usize]) -> Value {
    match shape.split_first() {
        None => flat.next().unwrap_or(Value::Null),
        Some((&d, rest)) => Value::Array((0..d).map(|_| nest(flat, rest)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use serde_json::json;

    #[test]
    fn json_shapes() {
        let cases: Vec<(Element, Value)> = vec![
            (Tensor::scalar_i64(3).into(), json!(3)),
            (Tensor::scalar_f64(1.5).into(), json!(1.5)),
            (Tensor::scalar(true).into(), json!(true)),
            (Tensor::scalar_string("hi").into(), json!("hi")),
            (
                Tensor::scalar_string(Bytes::from_static(b"\xff")).into(),
                json!("\u{fffd}"),
            ),
            (Tensor::scalar(u64::MAX).into(), json!(u64::MAX)),
            (Tensor::scalar_f64(f64::NAN).into(), Value::Null),
            (
                Tensor::from_i64s(vec![2, 2], &[1, 2, 3, 4]).unwrap().into(),
                json!([[1, 2], [3, 4]]),
            ),
            (Tensor::from_i64s(vec![0], &[]).unwrap().into(), json!([])),
            (
                Element::Tuple(vec![
                    Tensor::scalar_i64(1).into(),
                    Tensor::scalar_string("a").into(),
                ]),
                json!([1, "a"]),
            ),
            (
                Element::Dict(BTreeMap::from([
                    (
                        "x".to_string(),
                        Tensor::from_f32s(vec![2], &[0.5, 1.0]).unwrap().into(),
                    ),
                    ("y".to_string(), Tensor::scalar(7i32).into()),
                ])),
                json!({"x": [0.5, 1.0], "y": 7}),
            ),
        ];
        for (el, want) in cases {
            assert_eq!(el.to_json(), want, "{el:?}");
        }
    }

    #[test]
    fn accessors() {
        let el = Element::Tuple(vec![
            Tensor::scalar_i64(1).into(),
            Tensor::scalar_string("abc").into(),
        ]);
        assert_eq!(el.byte_size(), 11);
        assert_eq!(el.as_i64(), None);
        assert_eq!(Element::from(Tensor::scalar(5u32)).as_i64(), Some(5));
        assert_eq!(
            el.spec().to_string(),
            "(TensorSpec(shape=(), dtype=int64), TensorSpec(shape=(), dtype=string))"
        );
    }
}
