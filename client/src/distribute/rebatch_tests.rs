use super::*;
use serde_json::{json, Value};
use sluice_element::DType;
use sluice_pipeline::{parse, FunctionRegistry};
use std::collections::BTreeMap;

fn ints(values: &[i64]) -> Element {
    Element::Tensor(Tensor::from_i64s(vec![values.len()], values).expect("a vector"))
}

fn pieces_json(plan: &Rebatch, element: &Element) -> Vec<Value> {
    plan.split(element)
        .expect("splits")
        .iter()
        .map(Element::to_json)
        .collect()
}

#[test]
fn batch_sizes_for_worker_table() {
    // (global, workers, replicas per worker, worker) -> sizes; the examples of tf's docstring.
    let cases: &[(usize, usize, usize, usize, &[usize])] = &[
        (4, 1, 2, 0, &[2, 2]),
        (5, 1, 2, 0, &[3, 2]),
        (8, 1, 3, 0, &[3, 3, 2]),
        (1, 1, 2, 0, &[1, 0]),
        (0, 1, 2, 0, &[0, 0]),
        (7, 2, 2, 0, &[2, 2, 2, 1]),
        (7, 2, 2, 1, &[2, 1, 2, 2]),
        (9, 3, 1, 2, &[3, 3, 3]),
        (10, 3, 1, 2, &[3, 4, 3]),
        (10, 1, 1, 0, &[10]),
    ];
    for &(global, workers, replicas, worker, want) in cases {
        let got = batch_sizes_for_worker(global, workers, replicas, worker);
        assert_eq!(got, want, "G={global} W={workers} R={replicas} w={worker}");
        assert_eq!(got.iter().sum::<usize>(), global);
    }
}

#[test]
fn splitting_a_global_batch_table() {
    let sizes = |s: &[usize]| Rebatch::Sizes(s.to_vec());
    let even = |pieces| Rebatch::Even { pieces };
    let cases: Vec<(Rebatch, Element, Value)> = vec![
        // range(9).batch(4) over 2 replicas: full batches split evenly, the last one fills
        // the replicas in order and leaves the second one an empty batch.
        (sizes(&[2, 2]), ints(&[0, 1, 2, 3]), json!([[0, 1], [2, 3]])),
        (sizes(&[2, 2]), ints(&[8]), json!([[8], []])),
        (
            sizes(&[3, 2]),
            ints(&[0, 1, 2, 3, 4]),
            json!([[0, 1, 2], [3, 4]]),
        ),
        (sizes(&[3, 2]), ints(&[5, 6, 7, 8]), json!([[5, 6, 7], [8]])),
        (
            sizes(&[2, 2, 2, 2]),
            ints(&[0, 1, 2, 3, 4]),
            json!([[0, 1], [2, 3], [4], []]),
        ),
        (sizes(&[1, 0]), ints(&[7]), json!([[7], []])),
        // Legacy cut when the global batch size is unknown: ceil(b / N) rows per piece.
        (even(3), ints(&[0, 1, 2, 3]), json!([[0, 1], [2, 3], []])),
        (even(2), ints(&[0, 1, 2, 3, 4]), json!([[0, 1, 2], [3, 4]])),
        (
            even(4),
            ints(&[0, 1, 2, 3, 4]),
            json!([[0, 1], [2, 3], [4], []]),
        ),
        (even(2), ints(&[]), json!([[], []])),
        (even(1), ints(&[1, 2]), json!([[1, 2]])),
    ];
    for (plan, element, want) in cases {
        assert_eq!(
            Value::Array(pieces_json(&plan, &element)),
            want,
            "{plan:?} {}",
            element.to_json()
        );
    }
}

#[test]
fn tuples_and_dicts_split_every_component_along_its_first_dimension() {
    let plan = Rebatch::Sizes(vec![2, 1]);
    let matrix = Tensor::from_i64s(vec![3, 2], &[1, 2, 3, 4, 5, 6]).expect("a matrix");
    let names =
        Tensor::from_strings(vec![3], vec!["a".into(), "b".into(), "c".into()]).expect("strings");
    let tuple = Element::Tuple(vec![Element::Tensor(matrix.clone()), names.clone().into()]);
    assert_eq!(
        pieces_json(&plan, &tuple),
        vec![
            json!([[[1, 2], [3, 4]], ["a", "b"]]),
            json!([[[5, 6]], ["c"]])
        ]
    );
    let dict = Element::Dict(BTreeMap::from([
        ("features".to_string(), Element::Tensor(matrix)),
        ("label".to_string(), Element::Tuple(vec![names.into()])),
    ]));
    let pieces = plan.split(&dict).expect("splits");
    assert_eq!(
        pieces[1].to_json(),
        json!({"features": [[5, 6]], "label": [["c"]]})
    );
    // An empty piece keeps dtypes and inner dimensions.
    let pieces = Rebatch::Sizes(vec![3, 3]).split(&dict).expect("splits");
    assert!(is_empty_batch(&pieces[1]));
    assert_eq!(
        pieces[1].spec().to_string(),
        "{'features': TensorSpec(shape=(0, 2), dtype=int64), 'label': (TensorSpec(shape=(0,), dtype=string),)}"
    );
    assert!(!is_empty_batch(&pieces[0]));
}

#[test]
fn bad_batches_are_refused_with_tf_texts() {
    let scalar_second = Element::Tuple(vec![ints(&[1, 2]), Tensor::scalar_i64(3).into()]);
    assert_eq!(
        Rebatch::Even { pieces: 2 }
            .split(&scalar_second)
            .unwrap_err()
            .to_string(),
        "Cannot rebatch dataset: All components must have at least one dimension. Perhaps your \
         input dataset is not batched? Component 1 is scalar."
    );
    assert_eq!(
        Rebatch::Sizes(vec![1, 1])
            .split(&ints(&[1, 2, 3]))
            .unwrap_err()
            .to_string(),
        "cannot rebatch a batch of 3 rows: it is larger than the global batch size 2"
    );
    assert_eq!(
        per_replica_spec(&ElementSpec::scalar(DType::Int64), 2)
            .unwrap_err()
            .to_string(),
        "Invalid `input_dataset`. Expected a dataset whose elements have rank >= 1 but found a \
         dataset whose elements are scalars. Fix the issue by adding the `batch` transformation \
         to the dataset."
    );
}

fn spec_of(expr: &str) -> (ElementSpec, pb::DatasetDef) {
    let def = parse(expr).expect("parses").into_def();
    let spec = sluice_pipeline::element_spec(&def, &FunctionRegistry::global()).expect("a spec");
    (spec, def)
}

#[test]
fn compute_batch_size_table() {
    let cases: &[(&str, Option<usize>)] = &[
        ("range(9).batch(4)", Some(4)),
        ("range(9).batch(4, drop_remainder=true)", Some(4)),
        (
            "range(9).batch(4).shuffle(2).repeat(2).prefetch(1)",
            Some(4),
        ),
        (
            "range(9).batch(4).filter(is_even).take(3).skip(1).shard(2, 0)",
            Some(4),
        ),
        // A map may change the first dimension: tf stops there.
        ("range(9).batch(4).map(square)", None),
        ("range(9).batch(4).enumerate()", None),
        ("range(9).enumerate().batch(4)", Some(4)),
        ("range(9)", None),
        ("from_slices([[1, 2], [3, 4]])", Some(2)),
        ("range(9).batch(2).batch(3)", Some(3)),
    ];
    for (expr, want) in cases {
        let (spec, def) = spec_of(expr);
        assert_eq!(compute_batch_size(&spec, def.ops.iter()), *want, "{expr}");
    }
}

#[test]
fn per_replica_specs_divide_known_batch_dimensions() {
    let cases: &[(&str, usize, &str)] = &[
        (
            "range(9).batch(4)",
            2,
            "TensorSpec(shape=(None,), dtype=int64)",
        ),
        (
            "range(9).batch(4, drop_remainder=true)",
            2,
            "TensorSpec(shape=(2,), dtype=int64)",
        ),
        (
            "range(9).batch(4, drop_remainder=true)",
            3,
            "TensorSpec(shape=(None,), dtype=int64)",
        ),
        (
            "range(9).enumerate().batch(6, drop_remainder=true)",
            3,
            "(TensorSpec(shape=(2,), dtype=int64), TensorSpec(shape=(2,), dtype=int64))",
        ),
        (
            "from_slices([[1, 2], [3, 4]]).batch(4, drop_remainder=true)",
            4,
            "TensorSpec(shape=(1, 2), dtype=int64)",
        ),
    ];
    for (expr, replicas, want) in cases {
        let (spec, _) = spec_of(expr);
        assert_eq!(
            per_replica_spec(&spec, *replicas)
                .expect("a spec")
                .to_string(),
            *want,
            "{expr} over {replicas}"
        );
    }
}

#[test]
fn empty_like_keeps_structure_and_refuses_scalars() {
    let e = Element::Tuple(vec![
        ints(&[1, 2]),
        Tensor::from_f32s(vec![2, 3], &[0.0; 6])
            .expect("floats")
            .into(),
    ]);
    assert_eq!(
        empty_like(&e).expect("empty").spec().to_string(),
        "(TensorSpec(shape=(0,), dtype=int64), TensorSpec(shape=(0, 3), dtype=float32))"
    );
    assert!(empty_like(&Tensor::scalar_i64(1).into()).is_err());
}
