//! The nested definitions through every part of the crate: the text syntax both ways, element
//! specs, cardinalities, validation and the auto-shard rewrite.

use sluice_element::{DType, Element, ElementSpec, Tensor};

use crate::autoshard::{auto_shard, AutoShardPolicy};
use crate::dataset::{Dataset, Transform};
use crate::parser::parse;
use crate::render::render_def;
use crate::{cardinality, element_spec, validate, FunctionRegistry, INFINITE, UNKNOWN};

fn def(expr: &str) -> sluice_element::pb::DatasetDef {
    parse(expr)
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
        .into_def()
}

#[test]
fn nested_forms_round_trip_through_the_text_syntax() {
    for form in [
        "from_tensors(7)",
        "from_tensors([1, 2, 3])",
        "from_tensors([0.5], dtype=float32).repeat()",
        "zip(range(3), range(10, 20))",
        "zip(range(3), zip(range(4), from_tensors(1).repeat()))",
        "zip(a=range(3), b=from_slices([1, 2]).map(square)).batch(2)",
        "zip(\"a b\"=range(3), c=range(2))",
        "range(3).concatenate(range(5, 7).map(square)).take(4)",
        "range(3).concatenate(zip(range(2), range(2)).map(first))",
        "sample_from_datasets([range(3), range(10, 13)])",
        "sample_from_datasets([range(3), range(10, 13)], weights=[0.25, 0.75], seed=4)",
        "sample_from_datasets([range(3)], seed=1, stop_on_empty_dataset=true)",
        "choose_from_datasets([range(3), range(10, 13)], range(2).repeat(3))",
        "choose_from_datasets([range(3)], from_tensors(0).repeat(), stop_on_empty_dataset=false)",
    ] {
        let parsed = def(form);
        assert_eq!(render_def(&parsed), form);
    }
}

#[test]
fn the_text_syntax_builds_what_the_builder_builds() {
    let x = Element::Tensor(Tensor::scalar_i64(7));
    let cases: Vec<(&str, Dataset)> = vec![
        ("from_tensors(7)", Dataset::from_tensors(&x)),
        (
            "zip(b=range(2), a=range(3))",
            Dataset::zip_dict(vec![
                ("b".into(), Dataset::range(2)),
                ("a".into(), Dataset::range(3)),
            ]),
        ),
        (
            "range(2).concatenate(range(3))",
            Dataset::range(2).concatenate(Dataset::range(3).into_def()),
        ),
        (
            "choose_from_datasets([range(2)], choice_dataset=range(1), stop_on_empty_dataset=false)",
            Dataset::choose_from_datasets(vec![Dataset::range(2)], Dataset::range(1), false),
        ),
    ];
    for (expr, want) in cases {
        assert_eq!(def(expr), want.into_def(), "{expr}");
    }
}

#[test]
fn malformed_nested_expressions_name_the_column() {
    let deep = format!("{}range(1){}", "zip(".repeat(100), ")".repeat(100));
    let cases: Vec<(&str, &str)> = vec![
        ("zip(range(3), a=range(2))", "column 15"),
        ("zip(a=range(3), a=range(2))", "zip has the key 'a' twice"),
        ("zip(range(3)", "expected ')' or ','"),
        (
            "sample_from_datasets(range(3))",
            "expected '[' and a list of datasets",
        ),
        (
            "sample_from_datasets([range(3)], wait=1)",
            "'weights=', 'seed=' or 'stop_on_empty_dataset='",
        ),
        (
            "choose_from_datasets([range(3)])",
            "expected ',' and the choice dataset",
        ),
        ("range(3).concatenate(4)", "expected a source"),
        (&deep, "datasets nested deeper than 64 levels"),
    ];
    for (expr, want) in cases {
        let err = parse(expr).unwrap_err().to_string();
        assert!(err.contains(want), "{expr}: {err}");
    }
}

fn int_vec(len: Option<usize>) -> ElementSpec {
    ElementSpec::Tensor {
        dtype: DType::Int64,
        shape: vec![len],
    }
}

#[test]
fn element_specs_and_cardinalities() {
    let registry = FunctionRegistry::global();
    let i64s = ElementSpec::scalar(DType::Int64);
    // (expression, spec, cardinality)
    let cases: Vec<(&str, ElementSpec, i64)> = vec![
        ("from_tensors([1, 2])", int_vec(Some(2)), 1),
        ("from_tensors(1).repeat()", i64s.clone(), INFINITE),
        (
            "zip(range(3), from_slices([1.5, 2.5]))",
            ElementSpec::Tuple(vec![i64s.clone(), ElementSpec::scalar(DType::Float64)]),
            2,
        ),
        (
            "zip(range(3), zip(range(5), from_tensors(1).repeat()))",
            ElementSpec::Tuple(vec![
                i64s.clone(),
                ElementSpec::Tuple(vec![i64s.clone(), i64s.clone()]),
            ]),
            3,
        ),
        (
            "zip(b=range(3), a=range(7).filter(is_even))",
            ElementSpec::Dict(
                [
                    ("a".to_string(), i64s.clone()),
                    ("b".to_string(), i64s.clone()),
                ]
                .into_iter()
                .collect(),
            ),
            UNKNOWN,
        ),
        (
            "zip(range(3).repeat(), from_tensors(1).repeat())",
            ElementSpec::Tuple(vec![i64s.clone(), i64s.clone()]),
            INFINITE,
        ),
        ("range(3).concatenate(range(4))", i64s.clone(), 7),
        (
            "range(3).concatenate(range(4).repeat())",
            i64s.clone(),
            INFINITE,
        ),
        (
            "range(3).concatenate(range(4).filter(is_even))",
            i64s.clone(),
            UNKNOWN,
        ),
        // Shapes that differ become unknown dimensions.
        (
            "from_tensors([1, 2]).concatenate(from_tensors([1, 2, 3]))",
            int_vec(None),
            2,
        ),
        (
            "sample_from_datasets([range(3), range(4)])",
            i64s.clone(),
            UNKNOWN,
        ),
        (
            "sample_from_datasets([range(3), range(4).repeat()])",
            i64s.clone(),
            INFINITE,
        ),
        (
            "sample_from_datasets([range(3), range(4).repeat()], stop_on_empty_dataset=true)",
            i64s.clone(),
            UNKNOWN,
        ),
        (
            "choose_from_datasets([range(3), range(4)], range(2))",
            i64s.clone(),
            UNKNOWN,
        ),
        (
            "choose_from_datasets([range(3)], range(0))",
            i64s.clone(),
            0,
        ),
    ];
    for (expr, spec, card) in cases {
        let d = def(expr);
        assert_eq!(element_spec(&d, &registry), Ok(spec), "{expr}");
        assert_eq!(cardinality(&d), card, "{expr}");
        assert_eq!(validate(&d, &registry), Ok(()), "{expr}");
    }
}

#[test]
fn incompatible_or_malformed_nested_definitions_are_refused() {
    let registry = FunctionRegistry::global();
    let cases: Vec<(Dataset, &str)> = vec![
        (
            Dataset::range(3).concatenate(def("from_slices([1.5])")),
            "Incompatible dataset elements:\n  TensorSpec(shape=(), dtype=int64) vs.   TensorSpec(shape=(), dtype=float64)",
        ),
        (
            Dataset::range(3).concatenate(def("zip(range(1), range(1))")),
            "Incompatible dataset elements",
        ),
        (
            Dataset::sample_from_datasets(
                vec![Dataset::range(3), Dataset::from_def(def("from_slices([\"a\"])"))],
                None,
                None,
                false,
            ),
            "dataset 0 has TensorSpec(shape=(), dtype=int64), dataset 1 has TensorSpec(shape=(), dtype=string)",
        ),
        (
            Dataset::sample_from_datasets(vec![Dataset::range(3)], Some(vec![0.5, 0.5]), None, false),
            "Invalid `weights`. The shape of `weights` should be compatible with `[len(datasets)]` but is [2] for 1 datasets.",
        ),
        (
            Dataset::sample_from_datasets(vec![Dataset::range(3)], Some(vec![f64::NAN]), None, false),
            "Every weight must be finite and not negative",
        ),
        (
            Dataset::sample_from_datasets(Vec::new(), None, None, false),
            "Invalid `datasets`. `datasets` should not be empty.",
        ),
        (Dataset::zip(Vec::new()), "Invalid `datasets`. `datasets` should not be empty."),
        (
            Dataset::choose_from_datasets(
                vec![Dataset::range(3)],
                Dataset::from_def(def("from_slices([1], dtype=int32)")),
                true,
            ),
            "Invalid `choice_dataset`. Elements of `choice_dataset` must be scalar of type `tf.int64`.",
        ),
        (
            Dataset::zip(vec![Dataset::range(3).map("no_such_function")]),
            "no_such_function",
        ),
    ];
    for (ds, want) in cases {
        let err = validate(ds.def(), &registry).unwrap_err().to_string();
        assert!(err.contains(want), "{ds}: {err}");
    }
}

fn files(pattern: &str, n: usize) -> Dataset {
    let mut d = Dataset::files(pattern).lines().into_def();
    if let Some(sluice_element::pb::source::Kind::Files(fs)) =
        d.source.as_mut().and_then(|s| s.kind.as_mut())
    {
        fs.files = (0..n).map(|i| format!("{pattern}{i}")).collect();
    }
    Dataset::from_def(d)
}

fn file_lists(d: &sluice_element::pb::DatasetDef) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    crate::nested::walk(d, |d, _| {
        if let Some(sluice_element::pb::source::Kind::Files(fs)) =
            d.source.as_ref().and_then(|s| s.kind.as_ref())
        {
            out.push(fs.files.clone());
        }
    });
    out
}

#[test]
fn auto_shard_walks_into_nested_datasets() {
    use AutoShardPolicy::*;
    let zipped = Dataset::zip(vec![files("a", 4), files("b", 2)]).into_def();
    // FILE: every files source keeps its own files index, index + n, ...
    let out = auto_shard(&zipped, File, 2, 1).unwrap();
    assert_eq!(
        file_lists(&out),
        vec![vec!["a1".to_string(), "a3".into()], vec!["b1".into()]]
    );
    // ... and each must have enough.
    let err = auto_shard(&zipped, File, 3, 0).unwrap_err().to_string();
    assert!(err.contains("only has 2 file(s)"), "{err}");
    // A source that is not files anywhere in the tree: unshardable, AUTO falls back to DATA.
    let mixed = files("a", 4)
        .concatenate(Dataset::range(3).into_def())
        .into_def();
    let err = auto_shard(&mixed, File, 2, 0).unwrap_err();
    assert!(
        matches!(err, sluice_element::DatasetError::UnshardableSource(ref s) if s == "range(3)"),
        "{err}"
    );
    let out = auto_shard(&mixed, Auto, 2, 0).unwrap();
    assert_eq!(
        render_def(&out),
        "files(\"a\").lines().concatenate(range(3)).shard(2, 0)"
    );
    // DATA shards the output; HINT resolves placeholders in nested datasets too.
    let hinted =
        def("zip(range(4).shard(SHARD_HINT, SHARD_HINT), range(4)).shard(SHARD_HINT, SHARD_HINT)");
    assert_eq!(
        render_def(&auto_shard(&hinted, Hint, 3, 2).unwrap()),
        "zip(range(4).shard(3, 2), range(4)).shard(3, 2)"
    );
    assert_eq!(
        render_def(&auto_shard(&def("zip(range(4), range(4))"), Data, 3, 2).unwrap()),
        "zip(range(4), range(4)).shard(3, 2)"
    );
}
