//! A pipeline that parses `tf.train.Example` records of GZIP TFRecord files, run.

use prost::Message as _;
use sluice_element::{pb, DType, Element, Tensor};
use sluice_formats::ExampleParser;
use sluice_pipeline::{fixed_len_feature, var_len_feature};
use sluice_proto::example as ex;

use crate::executor::iterate;

fn int64s(v: &[i64]) -> ex::Feature {
    ex::Feature {
        kind: Some(ex::feature::Kind::Int64List(ex::Int64List {
            value: v.to_vec(),
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

#[test]
fn a_pipeline_parses_gzip_tfrecords_of_examples() {
    use sluice_pipeline::{Dataset, Transform};
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let mut framed = sluice_formats::tfrecord::TfRecordWriter::new(Vec::new());
    for i in 0..3i64 {
        let Element::Tensor(t) = record(vec![
            ("label", int64s(&[i])),
            ("tags", int64s(&vec![i; i as usize])),
        ]) else {
            unreachable!()
        };
        framed.write_record(&t.strings().unwrap()[0]).unwrap();
    }
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&framed.into_inner().unwrap()).unwrap();
    std::fs::write(dir.path().join("a.tfrecord.gz"), z.finish().unwrap()).unwrap();

    let pattern = format!("{}/*.gz", dir.path().display());
    let ds = Dataset::files(&pattern)
        .tfrecord_compressed(pb::RecordCompression::Gzip)
        .parse_example(vec![
            var_len_feature("tags", DType::Int64),
            fixed_len_feature("label", vec![], DType::Int64, None),
        ]);
    let registry = sluice_pipeline::FunctionRegistry::new();
    assert_eq!(
        sluice_pipeline::element_spec(ds.def(), &registry)
            .unwrap()
            .to_string(),
        parser(vec![
            fixed_len_feature("label", vec![], DType::Int64, None),
            var_len_feature("tags", DType::Int64),
        ])
        .spec()
        .to_string()
    );
    let got: Vec<String> = iterate(ds.def(), &Default::default())
        .unwrap()
        .map(|e| e.unwrap().to_json().to_string())
        .collect();
    assert_eq!(
        got,
        [
            r#"{"label":0,"tags":[]}"#,
            r#"{"label":1,"tags":[1]}"#,
            r#"{"label":2,"tags":[2,2]}"#
        ]
    );

    // Elements that are not scalar strings are refused statically.
    let bad = Dataset::range(3).parse_example(vec![var_len_feature("a", DType::Int64)]);
    assert_eq!(
        sluice_pipeline::validate(bad.def(), &registry)
            .unwrap_err()
            .to_string(),
        "parse_example needs scalar string elements (serialized tf.train.Example records), got TensorSpec(shape=(), dtype=int64)"
    );
}
