//! Tests of `parse_example`: Examples built with the prost messages, parsed by tables of
//! feature specs, and the errors naming the feature.

use sluice_pipeline::{fixed_len_feature, var_len_feature};

use super::*;

fn int64s(v: &[i64]) -> ex::Feature {
    ex::Feature {
        kind: Some(ex::feature::Kind::Int64List(ex::Int64List {
            value: v.to_vec(),
        })),
    }
}

fn floats(v: &[f32]) -> ex::Feature {
    ex::Feature {
        kind: Some(ex::feature::Kind::FloatList(ex::FloatList {
            value: v.to_vec(),
        })),
    }
}

fn bytes_list(v: &[&str]) -> ex::Feature {
    ex::Feature {
        kind: Some(ex::feature::Kind::BytesList(ex::BytesList {
            value: v.iter().map(|s| Bytes::from(s.to_string())).collect(),
        })),
    }
}

/// A serialized Example as a scalar string element.
fn record(features: Vec<(&str, ex::Feature)>) -> Element {
    let example = ex::Example {
        features: Some(ex::Features {
            feature: features
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        }),
    };
    Element::Tensor(Tensor::scalar_string(example.encode_to_vec()))
}

fn parser(features: Vec<pb::FeatureSpec>) -> ExampleParser {
    ExampleParser::new(&pb::ParseExampleOp { features }).unwrap()
}

fn parse_json(p: &ExampleParser, e: &Element) -> String {
    p.parse(e).unwrap().to_json().to_string()
}

#[test]
fn fixed_and_var_len_features_give_a_dict_of_tensors() {
    let p = parser(vec![
        fixed_len_feature("label", vec![], DType::Int64, None),
        fixed_len_feature("xy", vec![2], DType::Float32, None),
        fixed_len_feature("m", vec![2, 2], DType::Int64, None),
        fixed_len_feature("image", vec![], DType::String, None),
        var_len_feature("tags", DType::Int64),
        var_len_feature("words", DType::String),
    ]);
    let e = record(vec![
        ("label", int64s(&[7])),
        ("xy", floats(&[0.5, -1.0])),
        ("m", int64s(&[1, 2, 3, 4])),
        ("image", bytes_list(&["\u{1}jpeg"])),
        ("tags", int64s(&[3, 1, 4])),
        ("ignored", floats(&[1.0])),
    ]);
    let cases: Vec<(&str, &str)> = vec![
        ("label", "7"),
        ("xy", "[0.5,-1.0]"),
        ("m", "[[1,2],[3,4]]"),
        ("image", "\"\\u0001jpeg\""),
        ("tags", "[3,1,4]"),
        ("words", "[]"),
    ];
    let Element::Dict(got) = p.parse(&e).unwrap() else {
        panic!("a dict")
    };
    for (name, json) in cases {
        assert_eq!(got[name].to_json().to_string(), json, "feature {name}");
    }
    assert_eq!(got.len(), 6);
    assert_eq!(got["words"].as_tensor().unwrap().dtype(), DType::String);
    assert_eq!(got["xy"].as_tensor().unwrap().dtype(), DType::Float32);
    assert_eq!(
        p.spec().to_string(),
        ElementSpec::Dict(
            [
                ("image", ElementSpec::scalar(DType::String)),
                ("label", ElementSpec::scalar(DType::Int64)),
                (
                    "m",
                    ElementSpec::Tensor {
                        dtype: DType::Int64,
                        shape: vec![Some(2), Some(2)]
                    }
                ),
                (
                    "tags",
                    ElementSpec::Tensor {
                        dtype: DType::Int64,
                        shape: vec![None]
                    }
                ),
                (
                    "words",
                    ElementSpec::Tensor {
                        dtype: DType::String,
                        shape: vec![None]
                    }
                ),
                (
                    "xy",
                    ElementSpec::Tensor {
                        dtype: DType::Float32,
                        shape: vec![Some(2)]
                    }
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
        )
        .to_string()
    );
}

#[test]
fn a_missing_feature_takes_its_default() {
    let p = parser(vec![
        fixed_len_feature(
            "w",
            vec![2],
            DType::Float32,
            Some(Tensor::from_f32s(vec![2], &[1.5, 2.5]).unwrap()),
        ),
        // A flat default of the right count is reshaped to the feature's shape.
        fixed_len_feature(
            "m",
            vec![1, 2],
            DType::Int64,
            Some(Tensor::from_i64s(vec![2], &[8, 9]).unwrap()),
        ),
        fixed_len_feature(
            "s",
            vec![],
            DType::String,
            Some(Tensor::scalar_string("none")),
        ),
    ]);
    let cases = vec![
        (record(vec![]), r#"{"m":[[8,9]],"s":"none","w":[1.5,2.5]}"#),
        (
            record(vec![("w", floats(&[0.0, 1.0])), ("s", bytes_list(&["x"]))]),
            r#"{"m":[[8,9]],"s":"x","w":[0.0,1.0]}"#,
        ),
        // An empty list of the feature's type is a missing feature, as in tf.
        (
            record(vec![("m", int64s(&[]))]),
            r#"{"m":[[8,9]],"s":"none","w":[1.5,2.5]}"#,
        ),
    ];
    for (e, want) in cases {
        assert_eq!(parse_json(&p, &e), want);
    }
    // An Example without any `features` message at all.
    let empty = Element::Tensor(Tensor::scalar_string(Vec::<u8>::new()));
    assert_eq!(
        parse_json(&p, &empty),
        r#"{"m":[[8,9]],"s":"none","w":[1.5,2.5]}"#
    );
}

#[test]
fn bad_records_name_the_feature_and_what_was_found() {
    let p = parser(vec![
        fixed_len_feature("label", vec![], DType::Int64, None),
        fixed_len_feature("xy", vec![2], DType::Float32, None),
        var_len_feature("tags", DType::String),
    ]);
    let ok = || vec![("label", int64s(&[1])), ("xy", floats(&[1.0, 2.0]))];
    let with = |name: &'static str, f: ex::Feature| {
        let mut v = ok();
        v.retain(|(n, _)| *n != name);
        v.push((name, f));
        record(v)
    };
    let without = |name: &str| {
        let mut v = ok();
        v.retain(|(n, _)| *n != name);
        record(v)
    };
    let cases = vec![
        (
            without("label"),
            "parse_example: feature 'label' is missing from the record and has no default value",
        ),
        (
            with("label", floats(&[1.0])),
            "parse_example: feature 'label' should be an int64_list (int64), found a float_list of 1 value",
        ),
        (
            with("xy", floats(&[1.0, 2.0, 3.0])),
            "parse_example: feature 'xy' should have 2 values (shape [2]), found 3 values",
        ),
        (
            with("label", int64s(&[])),
            "parse_example: feature 'label' is missing from the record and has no default value",
        ),
        (
            with("tags", int64s(&[5])),
            "parse_example: feature 'tags' should be a bytes_list (string), found an int64_list of 1 value",
        ),
    ];
    for (e, want) in cases {
        let err = p.parse(&e).unwrap_err();
        assert!(matches!(err, DatasetError::BadExample { .. }), "{err:?}");
        assert_eq!(err.to_string(), want);
    }
    let not_an_example = Element::Tensor(Tensor::scalar_string(vec![0xffu8, 0xff, 0xff]));
    assert!(p
        .parse(&not_an_example)
        .unwrap_err()
        .to_string()
        .starts_with("parse_example: a record is not a tf.train.Example"));
    assert_eq!(
        p.parse(&Element::Tensor(Tensor::scalar_i64(3)))
            .unwrap_err()
            .to_string(),
        "parse_example needs scalar string elements (serialized tf.train.Example records), got TensorSpec(shape=(), dtype=int64)"
    );
}

#[test]
fn bad_feature_specs_are_refused_when_the_parser_is_built() {
    let cases = vec![
        (vec![], "parse_example needs at least one feature"),
        (
            vec![var_len_feature("", DType::Int64)],
            "parse_example: a feature has no name",
        ),
        (
            vec![
                var_len_feature("a", DType::Int64),
                var_len_feature("a", DType::Float32),
            ],
            "parse_example: feature 'a' is given twice",
        ),
        (
            vec![var_len_feature("a", DType::Int32)],
            "parse_example: feature 'a' has dtype int32; a tf.train.Example holds int64, float32 or string (bytes) values",
        ),
        (
            vec![fixed_len_feature(
                "a",
                vec![],
                DType::Int64,
                Some(Tensor::scalar_string("x")),
            )],
            "parse_example: the default value of feature 'a' is string, the feature is int64",
        ),
        (
            vec![fixed_len_feature(
                "a",
                vec![3],
                DType::Int64,
                Some(Tensor::from_i64s(vec![2], &[1, 2]).unwrap()),
            )],
            "parse_example: the default value of feature 'a' has shape [2], which does not fit the feature's shape [3]",
        ),
    ];
    for (features, want) in cases {
        assert_eq!(
            ExampleParser::new(&pb::ParseExampleOp { features })
                .unwrap_err()
                .to_string(),
            want
        );
    }
}

#[test]
fn an_example_serialized_by_tensorflow_decodes() {
    // `tf.train.Example(features=tf.train.Features(feature={"a": Feature(int64_list=
    // Int64List(value=[1, 2]))})).SerializeToString()`, as TensorFlow writes it (packed).
    let bytes: &[u8] = &[
        0x0a, 0x0d, // features, 13 bytes
        0x0a, 0x0b, // feature map entry, 11 bytes
        0x0a, 0x01, b'a', // key "a"
        0x12, 0x06, // value: Feature, 6 bytes
        0x1a, 0x04, // int64_list, 4 bytes
        0x0a, 0x02, 0x01, 0x02, // packed values [1, 2]
    ];
    let p = parser(vec![var_len_feature("a", DType::Int64)]);
    let e = Element::Tensor(Tensor::scalar_string(bytes.to_vec()));
    assert_eq!(parse_json(&p, &e), r#"{"a":[1,2]}"#);
}

#[test]
fn serialized_examples_parse_back() {
    let features: BTreeMap<String, Tensor> = [
        ("i", Tensor::from_i64s(vec![2], &[1, -2]).unwrap()),
        ("f", Tensor::from_f64s(vec![1], &[0.5]).unwrap()),
        ("s", Tensor::scalar_string("x")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let bytes = serialize_example(&features).unwrap();
    let p = parser(vec![
        var_len_feature("i", DType::Int64),
        fixed_len_feature("f", vec![], DType::Float32, None),
        fixed_len_feature("s", vec![], DType::String, None),
    ]);
    let e = Element::Tensor(Tensor::scalar_string(bytes));
    assert_eq!(parse_json(&p, &e), r#"{"f":0.5,"i":[1,-2],"s":"x"}"#);
    let bad: BTreeMap<String, Tensor> = [("b".to_string(), Tensor::scalar_bool(true))].into();
    assert_eq!(
        serialize_example(&bad).unwrap_err().to_string(),
        "feature 'b' is bool; a tf.train.Example holds integers (up to int64), floats or strings"
    );
}
