use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message;

use super::*;
use crate::analysis::validate;
use crate::dataset::Dataset;
use crate::registry::FunctionRegistry;

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

#[test]
fn mismatched_first_dimensions_fail_with_tf_text() {
    let err =
        Dataset::from_structured_slices(Element::Tuple(vec![ints(&[1, 2, 3]), ints(&[1, 2])]))
            .unwrap_err();
    assert_eq!(err.to_string(), "Dimensions 3 and 2 are not compatible");
    let scalar = Element::Tensor(Tensor::scalar_i64(1));
    let err = Dataset::from_structured_slices(Element::Tuple(vec![scalar])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "from_slices needs a tensor of rank at least 1, got a scalar"
    );
    let err = Dataset::from_structured_slices(Element::Tuple(vec![])).unwrap_err();
    assert_eq!(err.to_string(), "from_slices needs at least one tensor");
}

#[test]
fn a_mismatched_structure_in_a_definition_fails_validation() {
    let d = Dataset::from_structured_slices(Element::Tuple(vec![ints(&[1, 2]), ints(&[3, 4])]))
        .unwrap();
    let mut def = d.into_def();
    if let Some(pb::source::Kind::Slices(s)) = def.source.as_mut().and_then(|s| s.kind.as_mut()) {
        let Some(StructureKind::Tuple(l)) = s.structure.as_mut().and_then(|st| st.kind.as_mut())
        else {
            panic!("not a tuple structure");
        };
        l.items[1] = structure_to_proto(&ints(&[3]));
    }
    let r = FunctionRegistry::with_builtins();
    assert_eq!(
        validate(&def, &r).unwrap_err().to_string(),
        "Dimensions 2 and 1 are not compatible"
    );
}

#[test]
fn one_tensor_keeps_the_original_encoding_and_old_definitions_decode() {
    let t = Tensor::from_i64s(vec![2], &[1, 2]).unwrap();
    let one = Dataset::from_structured_slices(Element::Tensor(t.clone())).unwrap();
    assert_eq!(one, Dataset::from_slices(t.clone()));
    // A definition written before `structure` existed: only field 1 of SlicesSource.
    let old = pb::SlicesSource {
        tensor: Some(t.to_proto()),
        structure: None,
    }
    .encode_to_vec();
    let decoded = pb::SlicesSource::decode(old.as_slice()).unwrap();
    assert_eq!(
        Slices::from_proto(&decoded).unwrap().row(1).unwrap(),
        Element::Tensor(Tensor::scalar_i64(2))
    );
    // A structured source survives the wire.
    let s = Slices::new(nested()).unwrap();
    let wire = pb::SlicesSource::decode(s.to_proto().encode_to_vec().as_slice()).unwrap();
    assert_eq!(Slices::from_proto(&wire).unwrap().columns(), &nested());
}

#[test]
fn structured_slices_render_for_reading() {
    let d = Dataset::from_structured_slices(Element::Tuple(vec![
        ints(&[1, 2]),
        Element::Dict(BTreeMap::from([("k".to_string(), ints(&[3, 4]))])),
    ]))
    .unwrap();
    assert_eq!(d.to_string(), "from_slices(([1, 2], {\"k\": [3, 4]}))");
    let single = Dataset::from_structured_slices(Element::Tuple(vec![ints(&[1])])).unwrap();
    assert_eq!(single.to_string(), "from_slices(([1],))");
}

/// A definition whose tensors are blobs is analysed from dtypes and shapes alone, as the
/// dispatcher does (it never holds a blob's bytes): the same spec, cardinality and splits as
/// with the data in place, and the same checks.
#[test]
fn tensors_kept_as_blobs_are_analysed_from_their_shapes() {
    use crate::{cardinality, element_spec, split_counts};
    use sluice_element::blob_tensors;
    let registry = FunctionRegistry::global();
    let images = Tensor::from_raw(
        sluice_element::DType::UInt8,
        vec![6, 4, 4],
        Bytes::from(vec![9u8; 96]),
    )
    .unwrap();
    let slices = Dataset::from_structured_slices(Element::Tuple(vec![
        Element::Tensor(images.clone()),
        ints(&[0, 1, 2, 3, 4, 5]),
    ]))
    .unwrap()
    .into_def();
    let tensors = Dataset::from_tensors(&Element::Tensor(images)).into_def();
    for inline in [slices.clone(), tensors] {
        let mut kept = inline.clone();
        let blobs = blob_tensors::extract(&mut kept, 64);
        assert_eq!(blobs.len(), 1, "the images, not the labels");
        assert_eq!(
            element_spec(&kept, &registry).unwrap(),
            element_spec(&inline, &registry).unwrap()
        );
        assert_eq!(cardinality(&kept), cardinality(&inline));
        assert_eq!(split_counts(&kept).ok(), split_counts(&inline).ok());
        validate(&kept, &registry).unwrap();
        assert!(crate::render_def(&kept).contains("<tensors kept as blobs>"));
    }
    // Columns of different lengths are refused from their shapes too.
    let mut uneven = slices;
    blob_tensors::extract(&mut uneven, 64);
    blob_tensors::visit_mut(&mut uneven, &mut |t| {
        if t.blob_digest.is_empty() {
            t.shape = vec![5];
        }
    });
    let err = element_spec(&uneven, &registry).unwrap_err();
    assert!(
        err.to_string()
            .contains("Dimensions 6 and 5 are not compatible"),
        "{err}"
    );
}
