//! The linear ops of tf.data (padded_batch, unbatch, ignore_errors, cache, random, options):
//! their expression forms, element specs, cardinalities and argument checks.

use sluice_element::{pb, Tensor};

use crate::analysis::{cardinality, element_spec, validate, INFINITE, UNKNOWN};
use crate::dataset::{Dataset, Transform};
use crate::parser::parse;
use crate::registry::FunctionRegistry;

fn def(expr: &str) -> pb::DatasetDef {
    parse(expr)
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
        .into_def()
}

#[test]
fn forms_round_trip_through_display() {
    for form in [
        "random()",
        "random(seed=7).take(3)",
        "range(4).batch(2).unbatch()",
        "range(4).ignore_errors()",
        "range(4).ignore_errors(log_warning=true)",
        "range(4).cache()",
        "range(4).cache(\"/tmp/c.cache\").repeat(2)",
        "range(4).padded_batch(2)",
        "range(4).padded_batch(2, drop_remainder=true)",
        "range(4).padded_batch(2, padded_shapes=[[]], padding_values=[-1])",
        "range(4).padded_batch(3, padded_shapes=[[-1, 5], []], padding_values=[float32(0.5), \"x\"], drop_remainder=true)",
        "range(4).padded_batch(3, padding_values=[int32(7)])",
    ] {
        let d = parse(form).unwrap_or_else(|e| panic!("{form}: {e}"));
        assert_eq!(d.to_string(), form);
        assert_eq!(parse(&d.to_string()).unwrap(), d, "{form}");
    }
}

#[test]
fn builder_and_parser_agree() {
    assert_eq!(
        parse("range(4).padded_batch(2, padded_shapes=[[3]], padding_values=[int32(1)])").unwrap(),
        Dataset::range(4).padded_batch(2, false, vec![vec![3]], vec![Tensor::scalar(1i32)])
    );
    assert_eq!(parse("random(seed=3)").unwrap(), Dataset::random(Some(3)));
    assert_eq!(
        parse("range(2).unbatch().ignore_errors().cache(\"f\")").unwrap(),
        Dataset::range(2).unbatch().ignore_errors(false).cache("f")
    );
}

#[test]
fn malformed_forms_name_the_problem() {
    for (expr, want) in [
        ("range(4).padded_batch(0)", "batch size must be positive"),
        (
            "range(4).padded_batch(2, padded_shapes=[[-2]])",
            "must be -1 or a size",
        ),
        (
            "range(4).padded_batch(2, padding_values=[[1]])",
            "a scalar padding value",
        ),
        (
            "range(4).padded_batch(2, padding_values=[bogus(1)])",
            "unknown dtype 'bogus'",
        ),
        (
            "range(4).padded_batch(2, size=3)",
            "'padded_shapes=', 'padding_values=' or 'drop_remainder='",
        ),
        ("range(4).cache(f)", "a quoted cache file name"),
        ("random(seed=-1)", "must not be negative"),
    ] {
        let err = parse(expr).unwrap_err().to_string();
        assert!(err.contains(want), "{expr}: {err}");
    }
}

#[test]
fn specs_follow_tf_data() {
    let r = FunctionRegistry::with_builtins();
    for (expr, want) in [
        ("random(seed=1)", "TensorSpec(shape=(), dtype=int64)"),
        (
            "range(9).batch(3).unbatch()",
            "TensorSpec(shape=(), dtype=int64)",
        ),
        (
            "from_slices([[[1, 2]], [[3, 4]]]).unbatch()",
            "TensorSpec(shape=(2,), dtype=int64)",
        ),
        (
            "range(9).padded_batch(3)",
            "TensorSpec(shape=(None,), dtype=int64)",
        ),
        (
            "range(9).padded_batch(3, drop_remainder=true)",
            "TensorSpec(shape=(3,), dtype=int64)",
        ),
        (
            "from_slices([[1, 2], [3, 4]]).padded_batch(2)",
            "TensorSpec(shape=(None, 2), dtype=int64)",
        ),
        (
            "from_slices([[1, 2], [3, 4]]).padded_batch(2, padded_shapes=[[5]])",
            "TensorSpec(shape=(None, 5), dtype=int64)",
        ),
        (
            "from_slices([[1, 2], [3, 4]]).padded_batch(2, padded_shapes=[[-1]])",
            "TensorSpec(shape=(None, None), dtype=int64)",
        ),
        (
            "range(3).ignore_errors().cache()",
            "TensorSpec(shape=(), dtype=int64)",
        ),
    ] {
        let spec = element_spec(&def(expr), &r).unwrap_or_else(|e| panic!("{expr}: {e}"));
        assert_eq!(spec.to_string(), want, "{expr}");
    }
}

#[test]
fn nested_padded_batch_spec_pads_each_component() {
    let r = FunctionRegistry::with_builtins();
    let columns = sluice_element::Element::Tuple(vec![
        Tensor::from_i64s(vec![2, 3], &[1, 2, 3, 4, 5, 6])
            .unwrap()
            .into(),
        sluice_element::Element::Dict(
            [(
                "s".to_string(),
                Tensor::from_strings(vec![2], vec!["a".into(), "b".into()])
                    .unwrap()
                    .into(),
            )]
            .into(),
        ),
    ]);
    let ds = Dataset::from_structured_slices(columns).unwrap();
    let padded = ds.clone().padded_batch(
        4,
        true,
        vec![vec![5], vec![]],
        vec![Tensor::scalar_i64(-1), Tensor::scalar_string("?")],
    );
    assert_eq!(
        element_spec(padded.def(), &r).unwrap().to_string(),
        "(TensorSpec(shape=(4, 5), dtype=int64), {'s': TensorSpec(shape=(4,), dtype=string)})"
    );
    for (bad, want) in [
        (
            ds.clone()
                .padded_batch(2, false, vec![vec![2], vec![]], vec![]),
            "The padded shape (2) is not compatible with the shape (3)",
        ),
        (
            ds.clone()
                .padded_batch(2, false, vec![vec![3, 1], vec![]], vec![]),
            "not compatible",
        ),
        (
            ds.clone().padded_batch(2, false, vec![vec![3]], vec![]),
            "padded_shapes has 1 components but the element has 2",
        ),
        (
            ds.clone().padded_batch(
                2,
                false,
                vec![],
                vec![Tensor::scalar_f64(0.0), Tensor::scalar_string("")],
            ),
            "Mismatched type between padding value float64 and input elements int64",
        ),
        (
            ds.clone().padded_batch(
                2,
                false,
                vec![],
                vec![
                    Tensor::from_i64s(vec![1], &[0]).unwrap(),
                    Tensor::scalar_string(""),
                ],
            ),
            "Padding values should be scalars",
        ),
    ] {
        let err = validate(bad.def(), &r).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn absurd_padded_shapes_are_refused_by_validation() {
    let r = FunctionRegistry::with_builtins();
    for shape in [vec![i64::MAX], vec![1 << 20, 1 << 20], vec![1 << 40]] {
        let d = Dataset::range(4).padded_batch(1 << 20, false, vec![shape.clone()], vec![]);
        let err = validate(d.def(), &r).unwrap_err().to_string();
        assert!(err.contains("more than the limit of"), "{shape:?}: {err}");
    }
    let deep = Dataset::range(4).padded_batch(2, false, vec![vec![1; 33]], vec![]);
    assert!(validate(deep.def(), &r)
        .unwrap_err()
        .to_string()
        .contains("more than the limit of 32"));
}

#[test]
fn unbatch_refuses_scalars_and_different_batch_sizes() {
    let r = FunctionRegistry::with_builtins();
    let err = validate(&def("range(3).unbatch()"), &r)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "Cannot unbatch an input with scalar components.");
    let columns = sluice_element::Element::Tuple(vec![
        Tensor::from_i64s(vec![1, 2], &[1, 2]).unwrap().into(),
        Tensor::from_i64s(vec![1, 3], &[1, 2, 3]).unwrap().into(),
    ]);
    let ds = Dataset::from_structured_slices(columns).unwrap().unbatch();
    let err = validate(ds.def(), &r).unwrap_err().to_string();
    assert!(err.contains("Encountered both 2 and 3"), "{err}");
}

#[test]
fn cardinalities_follow_tf_data() {
    for (expr, want) in [
        ("random()", INFINITE),
        ("random().take(5)", 5),
        ("range(10).padded_batch(3)", 4),
        ("range(10).padded_batch(3, drop_remainder=true)", 3),
        ("range(10).batch(3, drop_remainder=true).unbatch()", 9),
        // The last batch is short: the batch dimension is not known.
        ("range(10).batch(3).unbatch()", UNKNOWN),
        ("from_slices([[1, 2], [3, 4], [5, 6]]).unbatch()", 6),
        ("range(10).ignore_errors()", UNKNOWN),
        ("range(10).repeat().ignore_errors()", INFINITE),
        ("range(10).cache().repeat(2)", 20),
    ] {
        assert_eq!(cardinality(&def(expr)), want, "{expr}");
    }
}

#[test]
fn options_merge_field_by_field() {
    let first = pb::DatasetOptions {
        deterministic: Some(false),
        external_state_policy: pb::DatasetOptionsExternalStatePolicy::ExternalStatePolicyFail
            as i32,
        auto_shard_policy: 0,
    };
    let second = pb::DatasetOptions {
        deterministic: None,
        external_state_policy: 0,
        auto_shard_policy: pb::DatasetOptionsAutoShardPolicy::AutoShardPolicyData as i32,
    };
    let d = Dataset::range(3).with_options(&first).with_options(&second);
    let got = d.def().options.unwrap();
    assert_eq!(got.deterministic, Some(false));
    assert_eq!(got.external_state_policy, first.external_state_policy);
    assert_eq!(got.auto_shard_policy, second.auto_shard_policy);
    let third = pb::DatasetOptions {
        deterministic: Some(true),
        ..Default::default()
    };
    let d = d.with_options(&third);
    assert_eq!(d.def().options.as_ref().unwrap().deterministic, Some(true));
}
