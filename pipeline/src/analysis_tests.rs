use super::*;
use crate::dataset::{Dataset, Transform};
use crate::parser::parse;

fn def(expr: &str) -> pb::DatasetDef {
    parse(expr)
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
        .into_def()
}

#[test]
fn element_specs() {
    let r = FunctionRegistry::with_builtins();
    for (expr, want) in [
        ("range(10)", "TensorSpec(shape=(), dtype=int64)"),
        (
            "range(10).batch(4)",
            "TensorSpec(shape=(None,), dtype=int64)",
        ),
        (
            "range(10).batch(4, drop_remainder=true)",
            "TensorSpec(shape=(4,), dtype=int64)",
        ),
        (
            "range(10).batch(4).batch(2, drop_remainder=true)",
            "TensorSpec(shape=(2, None), dtype=int64)",
        ),
        (
            "range(10).map(to_float).shuffle(3).repeat()",
            "TensorSpec(shape=(), dtype=float64)",
        ),
        (
            "range(10).filter(is_even).take(2).skip(1).shard(2, 0).prefetch(1)",
            "TensorSpec(shape=(), dtype=int64)",
        ),
        (
            "from_slices([[1, 2], [3, 4]])",
            "TensorSpec(shape=(2,), dtype=int64)",
        ),
        (
            "from_slices([1.5]).map(square)",
            "TensorSpec(shape=(), dtype=float64)",
        ),
        ("from_slices([\"a\"])", "TensorSpec(shape=(), dtype=string)"),
        (
            "files(\"x/*.txt\").lines()",
            "TensorSpec(shape=(), dtype=string)",
        ),
        (
            "files(\"x/*.tfrecord\").tfrecord().batch(8)",
            "TensorSpec(shape=(None,), dtype=string)",
        ),
        (
            "range(10).enumerate()",
            "(TensorSpec(shape=(), dtype=int64), TensorSpec(shape=(), dtype=int64))",
        ),
        (
            "from_slices([\"a\"]).enumerate(5).batch(2, drop_remainder=true)",
            "(TensorSpec(shape=(2,), dtype=int64), TensorSpec(shape=(2,), dtype=string))",
        ),
    ] {
        assert_eq!(
            element_spec(&def(expr), &r).unwrap().to_string(),
            want,
            "{expr}"
        );
    }
    assert!(matches!(
        element_spec(&def("range(3).map(nope)"), &r),
        Err(DatasetError::UnknownFunction { .. })
    ));
    assert!(matches!(
        element_spec(&def("from_slices([\"a\"]).map(square)"), &r),
        Err(DatasetError::Function { .. })
    ));
}

#[test]
fn cardinalities() {
    for (expr, want) in [
        ("range(10)", 10),
        ("range(0, 100, 3)", 34),
        ("range(10, 0, -1)", 10),
        ("range(5, 0)", 0),
        ("from_slices([[1, 2], [3, 4]])", 2),
        ("files(\"x/*.txt\").lines()", UNKNOWN),
        ("range(10).map(square)", 10),
        ("range(10).filter(is_even)", UNKNOWN),
        ("range(10).batch(4)", 3),
        ("range(10).batch(4, drop_remainder=true)", 2),
        ("range(8).batch(4)", 2),
        ("range(10).repeat(2)", 20),
        ("range(10).repeat()", INFINITE),
        ("range(0).repeat()", 0),
        ("range(10).repeat(0)", 0),
        ("range(10).filter(is_even).repeat(2)", UNKNOWN),
        ("range(10).filter(is_even).repeat()", INFINITE),
        ("range(10).repeat().take(5)", 5),
        ("range(10).repeat().skip(5)", INFINITE),
        ("range(10).repeat().batch(3)", INFINITE),
        ("range(10).filter(is_odd).take(3)", UNKNOWN),
        ("range(10).take(3)", 3),
        ("range(10).take(20)", 10),
        ("range(10).skip(3)", 7),
        ("range(10).skip(20)", 0),
        ("range(10).shard(3, 0)", 4),
        ("range(10).shard(3, 1)", 3),
        ("range(10).shard(3, 2)", 3),
        ("range(2).shard(3, 2)", 0),
        ("range(10).shuffle(4).prefetch(2)", 10),
        ("range(10).enumerate()", 10),
        ("range(10).repeat().enumerate()", INFINITE),
        ("range(10).filter(is_odd).enumerate()", UNKNOWN),
    ] {
        assert_eq!(cardinality(&def(expr)), want, "{expr}");
    }
    assert_eq!(cardinality(&pb::DatasetDef::default()), UNKNOWN);
}

#[test]
fn specs_of_op_chains() {
    let r = FunctionRegistry::with_builtins();
    let input = ElementSpec::scalar(sluice_element::DType::Int32);
    let ops = crate::parser::parse_ops("map(to_float).enumerate().batch(3)").unwrap();
    assert_eq!(
        ops_element_spec(input.clone(), &ops, &r)
            .unwrap()
            .to_string(),
        "(TensorSpec(shape=(None,), dtype=int64), TensorSpec(shape=(None,), dtype=float64))"
    );
    assert_eq!(ops_element_spec(input.clone(), &[], &r), Ok(input));
}

#[test]
fn validation() {
    let r = FunctionRegistry::with_builtins();
    assert_eq!(
        validate(&def("range(10).map(square).filter(is_even)"), &r),
        Ok(())
    );
    for (d, want) in [
        (
            Dataset::range(10).map("foo").into_def(),
            "unknown function 'foo' in map; registered map functions: add_one, identity, negate, square, to_float",
        ),
        (
            Dataset::range(10).filter("bar").into_def(),
            "unknown function 'bar' in filter; registered filter functions: is_even, is_odd",
        ),
        (Dataset::range(10).batch(0).into_def(), "batch size must be positive, got 0"),
        (Dataset::range(10).shuffle(0, None).into_def(), "shuffle buffer size must be positive, got 0"),
        (Dataset::range(10).shard(0, 0).into_def(), "number of shards must be positive, got 0"),
        (Dataset::range(10).shard(2, 2).into_def(), "shard index 2 must be less than the number of shards 2"),
        (Dataset::range_with(0, 10, 0).into_def(), "range step must not be zero"),
        (pb::DatasetDef::default(), "dataset definition has no source"),
        (
            Dataset::range(3).push_op(pb::Op { kind: None }).into_def(),
            "dataset definition has an empty op",
        ),
        (
            def("from_slices([\"a\"]).map(square)"),
            "function 'square' failed: expects numeric tensors, got string",
        ),
    ] {
        assert_eq!(validate(&d, &r).unwrap_err().to_string(), want);
    }
    let mut bad = def("from_slices([1, 2])");
    if let Some(pb::source::Kind::Slices(s)) = bad.source.as_mut().and_then(|s| s.kind.as_mut()) {
        let data = &mut s.tensor.as_mut().unwrap().data;
        data.truncate(data.len() - 1);
    }
    assert!(validate(&bad, &r).is_err());
}
