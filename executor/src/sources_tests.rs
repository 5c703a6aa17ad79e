use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::json;
use sluice_element::{Element, Tensor};
use sluice_formats::FileAccess;
use sluice_pipeline::{cardinality, element_spec, validate, Dataset, FunctionRegistry, Transform};

use super::*;
use crate::executor::{iterate, ExecOptions};

fn ints(v: &[i64]) -> Element {
    Element::Tensor(Tensor::from_i64s(vec![v.len()], v).unwrap())
}

fn strings(v: &[&str]) -> Element {
    let v = v
        .iter()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect();
    Element::Tensor(Tensor::from_strings(vec![3], v).unwrap())
}

/// `({"x": [[1, 2], [3, 4], [5, 6]], "y": ["a", "b", "c"]}, [7, 8, 9])`.
fn nested() -> Element {
    let x = Element::Tensor(Tensor::from_i64s(vec![3, 2], &[1, 2, 3, 4, 5, 6]).unwrap());
    let dict = BTreeMap::from([
        ("x".to_string(), x),
        ("y".to_string(), strings(&["a", "b", "c"])),
    ]);
    Element::Tuple(vec![Element::Dict(dict), ints(&[7, 8, 9])])
}

fn rows(d: &Dataset) -> Vec<serde_json::Value> {
    iterate(d.def(), &ExecOptions::default())
        .unwrap()
        .map(|e| e.unwrap().to_json())
        .collect()
}

#[test]
fn a_tuple_and_dict_are_sliced_together_row_by_row() {
    let d = Dataset::from_structured_slices(nested()).unwrap();
    assert_eq!(
        rows(&d),
        vec![
            json!([{"x": [1, 2], "y": "a"}, 7]),
            json!([{"x": [3, 4], "y": "b"}, 8]),
            json!([{"x": [5, 6], "y": "c"}, 9]),
        ]
    );
    assert_eq!(cardinality(d.def()), 3);
    let r = FunctionRegistry::with_builtins();
    validate(d.def(), &r).unwrap();
    assert_eq!(
        element_spec(d.def(), &r).unwrap().to_string(),
        "({'x': TensorSpec(shape=(2,), dtype=int64), 'y': TensorSpec(shape=(), dtype=string)}, \
         TensorSpec(shape=(), dtype=int64))"
    );
}

#[test]
fn ops_apply_to_structured_rows() {
    let d =
        Dataset::from_structured_slices(Element::Tuple(vec![ints(&[1, 2, 3]), ints(&[4, 5, 6])]))
            .unwrap()
            .batch(2);
    assert_eq!(rows(&d), vec![json!([[1, 2], [4, 5]]), json!([[3], [6]])]);
}

#[test]
fn each_split_is_one_structured_row() {
    let d = Dataset::from_structured_slices(nested()).unwrap();
    let source = Source::from_def(d.def(), &FileAccess::Unrestricted).unwrap();
    assert!(source.split_is_one_element());
    assert_eq!(source.num_splits(), 3);
    let split: Vec<_> = source
        .split(1)
        .unwrap()
        .map(|e| e.unwrap().to_json())
        .collect();
    assert_eq!(split, vec![json!([{"x": [3, 4], "y": "b"}, 8])]);
    assert!(source.split(3).is_err());
}
