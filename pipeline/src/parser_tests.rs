use bytes::Bytes;
use sluice_element::Tensor;

use super::*;
use crate::render::render_ops;

/// Every documented form: parses, and renders back to the same text.
const FORMS: &[&str] = &[
    "range(10)",
    "range(0, 100, 3)",
    "range(2, 8)",
    "range(10, 0, -2)",
    "range(10).map(square)",
    "range(20).batch(4)",
    "range(20).batch(4, drop_remainder=true)",
    "range(5).repeat(2)",
    "range(5).repeat()",
    "range(100).shuffle(10, seed=1)",
    "range(100).shuffle(10)",
    "range(10).filter(is_even)",
    "range(10).take(3)",
    "range(10).skip(3)",
    "range(10).shard(3, 1)",
    "range(10).shard(SHARD_HINT, SHARD_HINT)",
    "range(10).prefetch(2)",
    "from_slices([1, 2, 3])",
    "from_slices([[1, 2], [3, 4]])",
    "from_slices([1.5, 2.5])",
    "from_slices([\"a\", \"b\"])",
    "from_slices([true, false])",
    "from_slices([1, 2], dtype=uint8)",
    "from_slices([0.5, -1.0], dtype=float32)",
    "from_slices([], dtype=string)",
    "files(\"data/*.txt\").lines()",
    "files(\"data/*.tfrecord\").tfrecord()",
    "range(10).map(\"my.module/fn\").filter(is_odd)",
    "range(100).shuffle(10, seed=1).map(square).batch(4, drop_remainder=true).repeat().take(7)",
    "range(9).enumerate()",
    "range(9).enumerate(-3).batch(4)",
    "files(\"d/*.tfrecord\").tfrecord(compression=\"GZIP\")",
    "files(\"d/*.tfrecord\").names().shuffle(10)",
    "files(\"d/*.tfrecord.z\").tfrecord(compression=\"ZLIB\").take(2)",
    "files(\"d/*\").tfrecord().parse_example(label=fixed(int64))",
    "files(\"d/*\").tfrecord(compression=\"GZIP\").parse_example(\"a b\"=var(float32), \
     image=fixed(bytes), label=fixed(int64, default=-1), m=fixed(int64, shape=[2, 2]), \
     name=fixed(bytes, default=\"none\"), tags=var(int64), \
     xy=fixed(float32, shape=[2], default=[0.0, 0.5])).batch(8)",
];

#[test]
fn every_form_round_trips_through_display() {
    for form in FORMS {
        let d = parse(form).unwrap_or_else(|e| panic!("{form}: {e}"));
        assert_eq!(d.to_string(), *form);
        assert_eq!(parse(&d.to_string()).unwrap(), d, "{form}");
    }
}

#[test]
fn parses_to_the_builder_definitions() {
    let t = |s: &str| parse(s).unwrap();
    assert_eq!(t("range(10).map(square)"), Dataset::range(10).map("square"));
    assert_eq!(t("range(0, 100, 3)"), Dataset::range_with(0, 100, 3));
    assert_eq!(
        t("range(20).batch(4, drop_remainder=true)"),
        Dataset::range(20).batch_with(4, true)
    );
    assert_eq!(
        t("range(20).batch(4, true)"),
        Dataset::range(20).batch_with(4, true)
    );
    assert_eq!(
        t("range(20).batch(4, drop_remainder=false)"),
        Dataset::range(20).batch(4)
    );
    assert_eq!(t("range(5).repeat()"), Dataset::range(5).repeat_forever());
    assert_eq!(t("range(5).enumerate()"), Dataset::range(5).enumerate());
    assert_eq!(
        t("range(5).enumerate(start=10)"),
        Dataset::range(5).enumerate_from(10)
    );
    assert_eq!(
        t("range(5).enumerate(-1)"),
        Dataset::range(5).enumerate_from(-1)
    );
    assert_eq!(
        t("range(100).shuffle(10, 7)"),
        Dataset::range(100).shuffle(10, Some(7))
    );
    assert_eq!(
        t("range(100).shuffle(10)"),
        Dataset::range(100).shuffle(10, None)
    );
    assert_eq!(
        t("files('data/*.txt').lines()"),
        Dataset::files("data/*.txt").lines()
    );
    assert_eq!(
        t("  range ( 10 ) . map ( \"square\" ) .batch( 2 ,drop_remainder = true )"),
        t("range(10).map(square).batch(2, drop_remainder=true)")
    );
    let slices = |s: &str| {
        let d = t(s);
        let Some(pb::source::Kind::Slices(sl)) = d.def().source.clone().and_then(|s| s.kind) else {
            panic!("{s}: not a slices source");
        };
        Tensor::from_proto(sl.tensor.as_ref().unwrap()).unwrap()
    };
    assert_eq!(
        slices("from_slices([[1, 2], [3, 4]])"),
        Tensor::from_i64s(vec![2, 2], &[1, 2, 3, 4]).unwrap()
    );
    assert_eq!(
        slices("from_slices([1.5, 2.5])"),
        Tensor::from_f64s(vec![2], &[1.5, 2.5]).unwrap()
    );
    assert_eq!(
        slices("from_slices([1, 2.5])"),
        Tensor::from_f64s(vec![2], &[1.0, 2.5]).unwrap()
    );
    assert_eq!(
        slices("from_slices([1e3, -2E-1])"),
        Tensor::from_f64s(vec![2], &[1000.0, -0.2]).unwrap()
    );
    assert_eq!(slices("from_slices([\"a\", \"b\"])").dtype(), DType::String);
    assert_eq!(slices("from_slices([[], []])").shape(), &[2, 0]);
    assert_eq!(slices("from_slices([1, 2,])").shape(), &[2]);
    assert_eq!(
        slices("from_slices([\"a\\\"b\\x00\\n\"])")
            .strings()
            .unwrap()[0],
        Bytes::from_static(b"a\"b\x00\n")
    );
}

#[test]
fn builder_definitions_round_trip() {
    let odd = Tensor::from_strings(
        vec![2],
        vec![
            Bytes::from_static(b"q\"u\\o\te"),
            Bytes::from_static(b"\xff\x01"),
        ],
    )
    .unwrap();
    let cases = vec![
        Dataset::from_slices(odd),
        Dataset::from_slices(Tensor::from_f32s(vec![3], &[0.1, f32::MAX, -0.0]).unwrap()),
        Dataset::from_slices(Tensor::from_f64s(vec![2], &[1e300, f64::INFINITY]).unwrap()),
        Dataset::from_slices(Tensor::from_values::<u64>(vec![1], &[u64::MAX]).unwrap()),
        Dataset::from_slices(Tensor::from_values::<i8>(vec![2, 1], &[-128, 127]).unwrap()),
        Dataset::range_with(i64::MIN, i64::MAX, i64::MAX)
            .skip(0)
            .take(u64::MAX),
        Dataset::files("dir with \"quotes\"/*.tfrecord")
            .tfrecord()
            .shard(4, 3)
            .prefetch(0),
    ];
    for d in cases {
        let text = d.to_string();
        assert_eq!(
            parse(&text).unwrap_or_else(|e| panic!("{text}: {e}")),
            d,
            "{text}"
        );
    }
}

#[test]
fn malformed_expressions_name_the_column() {
    // 100,000 open lists: refused at the 33rd, never a stack overflow.
    let deep = format!("from_slices({}", "[".repeat(100_000));
    let cases: &[(&str, &str)] = &[
        ("range(0, 100 x)", "invalid dataset expression at column 14: expected ')' or ',', found 'x'"),
        ("range(10", "invalid dataset expression at column 9: expected ')' or ',', found end of input"),
        (
            "range(10).mapp(square)",
            "unknown transformation 'mapp' at column 11; expected one of map, filter, batch, shuffle, repeat, take, skip, shard, prefetch, enumerate, decode_image, resize, parse_example, padded_batch, unbatch, ignore_errors, cache, snapshot, concatenate, interleave, take_while, group_by_window",
        ),
        ("rang(10)", "unknown source 'rang' at column 1; expected one of range, from_slices, from_tensors, files, random, zip, sample_from_datasets, choose_from_datasets"),
        ("", "invalid dataset expression at column 1: expected a source (range, from_slices, from_tensors, files, random, zip, sample_from_datasets, choose_from_datasets), found end of input"),
        ("range(20).batch(0)", "invalid dataset expression at column 17: batch size must be positive, found 0"),
        ("range(20).batch(-4)", "invalid dataset expression at column 17: batch size must be positive, found -4"),
        ("range(0, 10, 0)", "invalid dataset expression at column 14: range step must not be zero"),
        ("range(10) x", "invalid dataset expression at column 11: expected '.' or end of input, found 'x'"),
        ("range(10).", "invalid dataset expression at column 11: expected a transformation name, found end of input"),
        ("range(10).map()", "invalid dataset expression at column 15: expected a function name, found ')'"),
        ("range(10).map(square", "invalid dataset expression at column 21: expected ')', found end of input"),
        ("range(10).shard(3, 3)", "invalid dataset expression at column 20: shard index 3 must be less than the number of shards 3"),
        ("range(10).shard(0, 0)", "invalid dataset expression at column 17: number of shards must be positive, found 0"),
        ("range(10).shard(3, SHARD_HINT)", "invalid dataset expression at column 20: SHARD_HINT as the shard index needs SHARD_HINT as the number of shards too: shard(SHARD_HINT, SHARD_HINT)"),
        ("range(10).shard(SHARD_HINT)", "invalid dataset expression at column 27: expected ',', found ')'"),
        ("range(10).shard(SHARD_HINT, x)", "invalid dataset expression at column 29: expected an integer shard index or SHARD_HINT, found 'x'"),
        ("range(10).take(1.5)", "invalid dataset expression at column 16: expected an integer take count, found '1.5'"),
        ("range(10).take(-1)", "invalid dataset expression at column 16: take count must not be negative, found -1"),
        ("range(10).shuffle(0)", "invalid dataset expression at column 19: shuffle buffer size must be positive, found 0"),
        (
            "range(10).batch(4, drop_remainder=maybe)",
            "invalid dataset expression at column 35: expected 'drop_remainder=true' or 'drop_remainder=false', found 'maybe'",
        ),
        ("range(9223372036854775808)", "invalid dataset expression at column 7: range bound 9223372036854775808 is out of range"),
        ("from_slices([1, \"a\"])", "invalid dataset expression at column 14: expected a string value, found '1'"),
        ("from_slices([[1, 2], [3]])", "invalid dataset expression at column 22: ragged list: expected shape [2], found [1] (list at column 13)"),
        ("from_slices([300], dtype=uint8)", "invalid dataset expression at column 14: value 300 is out of range for uint8"),
        ("from_slices(1)", "invalid dataset expression at column 13: expected '[', found '1'"),
        ("from_slices([1], dtype=int65)", "invalid dataset expression at column 24: unknown dtype 'int65'; expected one of bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, string"),
        ("from_slices([x])", "invalid dataset expression at column 14: expected a value or '[', found 'x'"),
        ("files(\"data/*.txt", "invalid dataset expression at column 7: unterminated string literal"),
        ("files(data).lines()", "invalid dataset expression at column 7: expected a quoted file pattern, found 'data'"),
        ("files(\"a\").csv()", "invalid dataset expression at column 12: expected 'lines', 'tfrecord' or 'names', found 'csv'"),
        ("range(10).map(@)", "invalid dataset expression at column 15: expected a function name, found '@'"),
        ("range(10).enumerate(x)", "invalid dataset expression at column 21: expected an integer enumerate start, found 'x'"),
        ("range(10).enumerate(1, 2)", "invalid dataset expression at column 22: expected ')', found ','"),
        (&deep, "invalid dataset expression at column 45: list literal nested deeper than 32 levels"),
    ];
    for (expr, want) in cases {
        match parse(expr) {
            Err(e @ DatasetError::Parse { .. }) => assert_eq!(e.to_string(), *want, "{expr}"),
            other => panic!("{expr}: expected a parse error, got {other:?}"),
        }
    }
    match parse("range(10).mapp(x)") {
        Err(DatasetError::Parse { column, .. }) => assert_eq!(column, 11),
        other => panic!("{other:?}"),
    }
}

#[test]
fn shard_hint_placeholder() {
    let hinted = Dataset::range(10).shard_hint();
    assert_eq!(
        parse("range(10).shard(SHARD_HINT, SHARD_HINT)").unwrap(),
        hinted
    );
    // As in tf.data, the index next to SHARD_HINT is not used.
    assert_eq!(parse("range(10).shard(SHARD_HINT, 7)").unwrap(), hinted);
    assert_eq!(
        render_ops(&parse_ops(".shard(SHARD_HINT, SHARD_HINT).batch(2)").unwrap()),
        ".shard(SHARD_HINT, SHARD_HINT).batch(2)"
    );
}

#[test]
fn unknown_functions_parse() {
    assert!(parse("range(10).map(no_such_fn)").is_ok());
}

#[test]
fn op_chains() {
    for (expr, want) in [
        (".map(square).batch(2)", ".map(square).batch(2)"),
        ("map(square).batch(2)", ".map(square).batch(2)"),
        ("  .take(3) ", ".take(3)"),
        ("", ""),
    ] {
        assert_eq!(render_ops(&parse_ops(expr).unwrap()), want, "{expr}");
    }
    assert_eq!(
        parse_ops("range(10)").unwrap_err().to_string(),
        "unknown transformation 'range' at column 1; expected one of map, filter, batch, shuffle, repeat, take, skip, shard, prefetch, enumerate, decode_image, resize, parse_example, padded_batch, unbatch, ignore_errors, cache, snapshot, concatenate, interleave, take_while, group_by_window"
    );
    assert_eq!(
        parse_ops("map(square) batch(2)").unwrap_err().to_string(),
        "invalid dataset expression at column 13: expected '.' or end of input, found 'batch'"
    );
    assert_eq!(
        parse_ops("(").unwrap_err().to_string(),
        "invalid dataset expression at column 1: expected a transformation, found '('"
    );
}

#[test]
fn parse_example_and_compression_parse_to_the_builder_definitions() {
    use crate::example_spec::{fixed_len_feature, var_len_feature};
    let got = parse(
        "files(\"d/*.tfrecord\").tfrecord(compression=\"GZIP\")\
         .parse_example(tags=var(int64), label=fixed(int64), image=fixed(string), \
         xy=fixed(float32, shape=[2], default=[0, 1]))",
    )
    .unwrap();
    let want = Dataset::files("d/*.tfrecord")
        .tfrecord_compressed(pb::RecordCompression::Gzip)
        .parse_example(vec![
            var_len_feature("tags", DType::Int64),
            fixed_len_feature("label", vec![], DType::Int64, None),
            fixed_len_feature("image", vec![], DType::String, None),
            fixed_len_feature(
                "xy",
                vec![2],
                DType::Float32,
                Some(Tensor::from_f32s(vec![2], &[0.0, 1.0]).unwrap()),
            ),
        ]);
    assert_eq!(got, want);
    assert_eq!(
        parse("files(\"d\").tfrecord(\"\")").unwrap(),
        Dataset::files("d").tfrecord()
    );
}

#[test]
fn parse_example_and_compression_errors_name_the_column() {
    let cases = [
        (
            "files(\"d\").tfrecord(compression=\"LZ4\")",
            "invalid dataset expression at column 33: unknown compression 'LZ4'; expected \"GZIP\", \"ZLIB\" or \"\"",
        ),
        (
            "files(\"d\").tfrecord().parse_example(a=fixed(int32))",
            "invalid dataset expression at column 45: unknown feature dtype 'int32'; expected int64, float32 or bytes",
        ),
        (
            "files(\"d\").tfrecord().parse_example(a=list(int64))",
            "invalid dataset expression at column 39: expected 'fixed(...)' or 'var(...)', found 'list'",
        ),
        (
            "files(\"d\").tfrecord().parse_example(a=fixed(int64, size=[2]))",
            "invalid dataset expression at column 52: expected 'shape=' or 'default=', found 'size'",
        ),
        (
            "files(\"d\").tfrecord().parse_example(a=var(int64, shape=[2]))",
            "invalid dataset expression at column 48: expected ')', found ','",
        ),
        (
            "files(\"d\").tfrecord().parse_example()",
            "invalid dataset expression at column 37: expected a feature name, found ')'",
        ),
    ];
    for (expr, want) in cases {
        assert_eq!(parse(expr).unwrap_err().to_string(), want, "{expr}");
    }
}
