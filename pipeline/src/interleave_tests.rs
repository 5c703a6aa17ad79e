use sluice_element::{pb, DType, ElementSpec, Tensor};

use crate::dataset::{Dataset, Transform};
use crate::{cardinality, element_spec, parse, validate, FunctionRegistry, UNKNOWN};

fn names() -> Dataset {
    let t = Tensor::from_strings(vec![2], vec!["a".into(), "b".into()]).unwrap();
    Dataset::from_slices(t)
}

#[test]
fn expressions_with_templates_parse_and_render_back() {
    let cases = [
        "from_slices([\"a\", \"b\"]).interleave(element_lines(), cycle_length=2, block_length=1)",
        "from_slices([\"a\"]).interleave(element_tfrecord(compression=\"GZIP\").map(identity), \
         cycle_length=4, block_length=2, num_parallel_calls=0)",
        "from_slices([[1, 2], [3, 4]]).interleave(element_slices().filter(is_even), \
         cycle_length=0, block_length=3).take_while(is_even)",
        "range(2).interleave(range(1).interleave(element_slices(), cycle_length=1, \
         block_length=1), cycle_length=1, block_length=1)",
    ];
    for text in cases {
        let ds = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(ds.to_string(), text);
        assert_eq!(parse(&ds.to_string()).unwrap(), ds);
    }
    let built = names().parallel_interleave(Dataset::element_lines(), 2, 1, 3);
    assert_eq!(parse(&built.to_string()).unwrap(), built);
}

#[test]
fn element_sources_and_bad_arguments_are_refused_by_the_parser() {
    for (text, message) in [
        ("element_lines()", "only valid as the source of a template"),
        (
            "range(2).interleave(element_lines(), block_length=0)",
            "block_length",
        ),
        (
            "range(2).interleave(element_lines(), cycles=2)",
            "expected 'cycle_length='",
        ),
    ] {
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains(message), "{text}: {err}");
    }
    let deep = format!(
        "range(1){}",
        ".interleave(range(1)".repeat(40) + &")".repeat(40)
    );
    let err = parse(&deep).unwrap_err().to_string();
    assert!(
        err.contains("interleave templates nest more than 16 deep"),
        "{err}"
    );
}

#[test]
fn the_spec_comes_from_the_template_and_the_cardinality_is_unknown() {
    let registry = FunctionRegistry::global();
    let files = names().interleave(Dataset::element_tfrecord(pb::RecordCompression::None), 2, 1);
    assert_eq!(
        element_spec(files.def(), &registry).unwrap(),
        ElementSpec::scalar(DType::String)
    );
    assert_eq!(cardinality(files.def()), UNKNOWN);
    let matrix = Tensor::from_i64s(vec![2, 3, 4], &[0; 24]).unwrap();
    let rows =
        Dataset::from_slices(matrix).interleave(Dataset::element_slices().map("to_float"), 2, 1);
    assert_eq!(
        element_spec(rows.def(), &registry).unwrap(),
        ElementSpec::Tensor {
            dtype: DType::Float64,
            shape: vec![Some(4)]
        }
    );
    validate(rows.def(), &registry).unwrap();
    assert_eq!(
        cardinality(Dataset::range(3).take_while("is_even").def()),
        UNKNOWN
    );
}

#[test]
fn validation_refuses_malformed_interleaves() {
    let registry = FunctionRegistry::global();
    let check = |def: pb::DatasetDef| validate(&def, &registry).unwrap_err().to_string();
    let mut no_template = names()
        .interleave(Dataset::element_lines(), 2, 1)
        .into_def();
    if let Some(pb::op::Kind::Interleave(i)) = no_template.ops[0].kind.as_mut() {
        i.template = None;
    }
    assert!(check(no_template).contains("neither a template nor a python function"));
    assert!(check(
        Dataset::range(2)
            .interleave(Dataset::element_lines(), 2, 1)
            .into_def()
    )
    .contains("interleave reads files named by scalar string elements"));
    assert!(check(
        names()
            .interleave(Dataset::element_lines(), 2, 0)
            .into_def()
    )
    .contains("block_length must be greater than zero."));
    assert!(check(Dataset::range(2).take_while("nope").into_def()).contains("nope"));
}

#[test]
fn group_by_window_expressions_parse_and_render_back() {
    let text = "from_slices([1, 2]).group_by_window(identity, window_size=2, \
                reduce=element_window().batch(2))";
    let ds = parse(text).unwrap();
    assert_eq!(ds.to_string(), text);
    let registry = FunctionRegistry::global();
    assert_eq!(
        element_spec(ds.def(), &registry).unwrap(),
        ElementSpec::Tensor {
            dtype: DType::Int64,
            shape: vec![None]
        }
    );
    assert_eq!(cardinality(ds.def()), UNKNOWN);
    let err = parse("range(2).group_by_window(identity, window_size=0, reduce=element_window())")
        .unwrap_err()
        .to_string();
    assert!(err.contains("window_size"), "{err}");
}
