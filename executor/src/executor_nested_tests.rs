//! Definitions holding other definitions (zip, concatenate, sample_from_datasets,
//! choose_from_datasets, from_tensors) through the executor, locally and in distributed_epoch
//! mode.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::{json, Value};
use sluice_pipeline::{parse, Dataset, Transform};

use super::*;

fn run(expr: &str, opts: &ExecOptions) -> Result<Vec<Value>, DatasetError> {
    let def = parse(expr)
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
        .into_def();
    iterate(&def, opts)?
        .map(|r| r.map(|e| e.to_json()))
        .collect()
}

fn local(expr: &str) -> Result<Vec<Value>, DatasetError> {
    run(expr, &ExecOptions::default())
}

#[test]
fn nested_definitions_table() {
    let cases: Vec<(&str, Value)> = vec![
        ("from_tensors(7)", json!([7])),
        ("from_tensors([1, 2])", json!([[1, 2]])),
        ("from_tensors(7).repeat(3)", json!([7, 7, 7])),
        ("zip(range(3), range(10, 20))", json!([[0, 10], [1, 11], [2, 12]])),
        // Ends with the shortest input, whichever it is.
        ("zip(range(10, 20), range(2))", json!([[10, 0], [11, 1]])),
        ("zip(range(2), from_tensors(5).repeat())", json!([[0, 5], [1, 5]])),
        (
            "zip(range(2), zip(range(5, 9), from_tensors(1).repeat()))",
            json!([[0, [5, 1]], [1, [6, 1]]]),
        ),
        (
            "zip(b=range(2), a=range(3).map(square))",
            json!([{"a": 0, "b": 0}, {"a": 1, "b": 1}]),
        ),
        ("zip(range(5), range(3)).repeat(2).take(4)", json!([[0, 0], [1, 1], [2, 2], [0, 0]])),
        ("zip(range(0), range(3))", json!([])),
        ("range(3).concatenate(range(10, 12))", json!([0, 1, 2, 10, 11])),
        ("range(0).concatenate(range(2))", json!([0, 1])),
        ("range(2).concatenate(range(5).filter(is_even)).repeat(2)", json!([0, 1, 0, 2, 4, 0, 1, 0, 2, 4])),
        (
            "range(2).concatenate(range(5, 6).concatenate(from_tensors(9))).map(square)",
            json!([0, 1, 25, 81]),
        ),
        (
            "choose_from_datasets([range(3), range(10, 13)], from_slices([1, 0, 1, 1, 0]))",
            json!([10, 0, 11, 12, 1]),
        ),
        // An ended input is skipped by default ...
        (
            "choose_from_datasets([range(1), range(10, 13)], from_slices([0, 0, 1, 0, 1]), stop_on_empty_dataset=false)",
            json!([0, 10, 11]),
        ),
        // ... and ends everything with stop_on_empty_dataset (choose's default).
        (
            "choose_from_datasets([range(1), range(10, 13)], from_slices([0, 0, 1]))",
            json!([0]),
        ),
        (
            "sample_from_datasets([range(3), range(10, 13)], weights=[1.0, 0.0], seed=5)",
            json!([0, 1, 2]),
        ),
        (
            "sample_from_datasets([range(3), range(10, 13)], weights=[0.0, 1.0], seed=5, stop_on_empty_dataset=true)",
            json!([10, 11, 12]),
        ),
    ];
    for (expr, want) in cases {
        let got = local(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        assert_eq!(Value::Array(got), want, "{expr}");
    }
}

#[test]
fn sampling_draws_every_element_once_and_a_seed_fixes_the_order() {
    let expr = "sample_from_datasets([range(50), range(100, 150)], seed=11)";
    let first = local(expr).unwrap();
    assert_eq!(first, local(expr).unwrap());
    let mut sorted: Vec<i64> = first.iter().map(|v| v.as_i64().unwrap()).collect();
    sorted.sort();
    let want: Vec<i64> = (0..50).chain(100..150).collect();
    assert_eq!(sorted, want);
    // Both inputs are drawn from early on: the first 20 elements are not one input's.
    let early: Vec<bool> = first[..20]
        .iter()
        .map(|v| v.as_i64().unwrap() >= 100)
        .collect();
    assert!(early.contains(&true) && early.contains(&false), "{first:?}");
    // Each pass of a repeat draws anew.
    let twice =
        local("sample_from_datasets([range(50), range(100, 150)], seed=11).repeat(2)").unwrap();
    assert_eq!(twice[..100], first[..]);
    assert_ne!(twice[100..], first[..]);
    // With stop_on_empty_dataset, the dataset ends with the first input that ends.
    let stopped = local(
        "sample_from_datasets([range(5), range(100, 1000)], seed=3, stop_on_empty_dataset=true)",
    )
    .unwrap();
    let small = stopped.iter().filter(|v| v.as_i64().unwrap() < 5).count();
    assert!(small == 5 || stopped.len() == 900, "{stopped:?}");
}

#[test]
fn choice_errors_and_refusals() {
    let err = local("choose_from_datasets([range(3)], from_slices([0, 4]))").unwrap_err();
    assert_eq!(
        err.to_string(),
        "choose_from_datasets: the choice dataset selected input 4, out of range for 1 datasets"
    );
    let err = local("choose_from_datasets([range(3)], from_slices([0], dtype=int32))").unwrap_err();
    assert!(
        err.to_string()
            .contains("Elements of `choice_dataset` must be scalar of type `tf.int64`"),
        "{err}"
    );
    let err = local("range(3).concatenate(from_slices([0.5]))").unwrap_err();
    assert!(
        err.to_string().starts_with("Incompatible dataset elements"),
        "{err}"
    );
}

/// Hands out the given splits of each provider and repetition (none for the others), and
/// records what was asked, in order.
struct Splits {
    splits: Mutex<HashMap<(u32, u64), VecDeque<u64>>>,
    asked: Mutex<Vec<(u32, u64)>>,
}

impl Splits {
    fn new(splits: &[(u32, u64, &[u64])]) -> Arc<Splits> {
        Arc::new(Splits {
            splits: Mutex::new(
                splits
                    .iter()
                    .map(|(p, r, s)| ((*p, *r), s.iter().copied().collect()))
                    .collect(),
            ),
            asked: Mutex::new(Vec::new()),
        })
    }

    fn opts(splits: &Arc<Splits>) -> ExecOptions {
        ExecOptions {
            splits: Some(splits.clone()),
            ..ExecOptions::default()
        }
    }
}

impl SplitSupplier for Splits {
    fn next_split(&self, provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
        self.asked.lock().unwrap().push((provider, repetition));
        Ok(self
            .splits
            .lock()
            .unwrap()
            .get_mut(&(provider, repetition))
            .and_then(|q| q.pop_front()))
    }
}

#[test]
fn distributed_epoch_gives_every_source_its_own_provider() {
    // (expression, splits handed to this worker as (provider, repetition, splits), expected
    // elements or a piece of the error)
    type Case = (
        &'static str,
        Vec<(u32, u64, &'static [u64])>,
        Result<Value, &'static str>,
    );
    let cases: Vec<Case> = vec![
        // A from_tensors input repeated without end, beside a source to split, is read whole:
        // the range is the only provider.
        (
            "zip(range(6), from_tensors(9).repeat())",
            vec![(0, 0, &[1, 4])],
            Ok(json!([[1, 9], [4, 9]])),
        ),
        // Repeated a known number of times it is a provider; its repetition 0 went to another
        // worker: its repeat goes on to the next one.
        (
            "zip(range(6), from_tensors(9).repeat(3))",
            vec![(0, 0, &[1, 4]), (1, 1, &[0]), (1, 2, &[0])],
            Ok(json!([[1, 9], [4, 9]])),
        ),
        (
            "zip(from_tensors(9).repeat(3), range(6).map(square))",
            vec![(0, 0, &[0]), (0, 1, &[0]), (1, 0, &[2, 3])],
            Ok(json!([[9, 4], [9, 9]])),
        ),
        (
            "zip(range(3), range(10, 13))",
            vec![(0, 0, &[0, 2]), (1, 0, &[1])],
            Ok(json!([[0, 11]])),
        ),
        (
            "range(3).concatenate(range(10, 12))",
            vec![(0, 0, &[1]), (1, 0, &[0])],
            Ok(json!([1, 10])),
        ),
        ("from_tensors(9).concatenate(range(6))", vec![(1, 0, &[5])], Ok(json!([5]))),
        ("from_tensors(9)", vec![(0, 0, &[0])], Ok(json!([9]))),
        ("from_tensors(9)", vec![], Ok(json!([]))),
        // Depth first: the nested zip's inputs are providers 1 and 2, the last input 3.
        (
            "zip(range(5), zip(range(10, 15), range(20, 25)), range(30, 35))",
            vec![(0, 0, &[0]), (1, 0, &[1]), (2, 0, &[2]), (3, 0, &[3])],
            Ok(json!([[0, [11, 22], 33]])),
        ),
        (
            "sample_from_datasets([from_tensors(1), from_tensors(2)], seed=3)",
            vec![(0, 0, &[0])],
            Ok(json!([1])),
        ),
        (
            "choose_from_datasets([from_tensors(1).repeat(), from_tensors(2).repeat()], from_slices([0, 1, 1, 0]))",
            vec![(0, 0, &[1, 2])],
            Ok(json!([2, 2])),
        ),
        // A pass whose second input got no split of its repetition (the other workers took
        // them) is starved, though the first got one: the repeat goes on.
        (
            "zip(range(3), range(3)).repeat(2)",
            vec![(0, 0, &[0]), (0, 1, &[1]), (1, 1, &[2])],
            Ok(json!([[1, 2]])),
        ),
        // A pass that received splits and yielded nothing ends the repeat; the second input,
        // never asked, does not make it starved.
        (
            "zip(range(5).filter(is_odd), range(5)).repeat()",
            vec![(0, 0, &[0, 2]), (0, 1, &[1]), (1, 1, &[3])],
            Ok(json!([])),
        ),
        (
            "zip(range(3), from_tensors(1).repeat()).enumerate()",
            vec![(0, 0, &[0])],
            Err("enumerate in distributed_epoch mode needs a range or from_slices source"),
        ),
        (
            "zip(range(3), random(seed=1))",
            vec![(0, 0, &[0])],
            Err("RandomDataset"),
        ),
    ];
    for (expr, splits, want) in cases {
        let supplier = Splits::new(&splits);
        let got = run(expr, &Splits::opts(&supplier));
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(Value::Array(got), want, "{expr}"),
            (Err(e), Err(want)) => assert!(e.to_string().contains(want), "{expr}: {e}"),
            (got, want) => panic!("{expr}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn each_source_asks_its_own_provider_in_pipeline_order() {
    let supplier = Splits::new(&[(0, 0, &[0, 1]), (1, 0, &[2]), (1, 1, &[0])]);
    let got = run(
        "zip(range(3), range(3).repeat(2))",
        &Splits::opts(&supplier),
    )
    .unwrap();
    assert_eq!(got, vec![json!([0, 2]), json!([1, 0])]);
    assert_eq!(
        *supplier.asked.lock().unwrap(),
        vec![(0, 0), (1, 0), (0, 0), (1, 0), (1, 1), (0, 0)]
    );
}

#[test]
fn nested_limits_are_checked_before_anything_is_built() {
    let mut ds = Dataset::range(1);
    for _ in 0..70 {
        ds = Dataset::zip(vec![ds]);
    }
    let err = iterate(ds.def(), &ExecOptions::default()).err().unwrap();
    assert!(
        err.to_string().contains("nests datasets 70 levels deep"),
        "{err}"
    );
    let wide = Dataset::zip(
        (0..6000)
            .map(|_| Dataset::range(1).map("identity"))
            .collect(),
    );
    let err = iterate(wide.def(), &ExecOptions::default()).err().unwrap();
    assert!(err.to_string().contains("12000 ops"), "{err}");
    // At the limit, the deepest nesting runs.
    let mut ds = Dataset::range(2);
    for _ in 0..64 {
        ds = Dataset::zip(vec![ds]).map("identity");
    }
    let out: Vec<_> = iterate(ds.def(), &ExecOptions::default())
        .unwrap()
        .collect();
    assert_eq!(out.len(), 2);
    let concatenated = Dataset::range(1).concatenate(Dataset::range(2).into_def());
    assert_eq!(
        iterate(concatenated.def(), &ExecOptions::default())
            .unwrap()
            .count(),
        3
    );
}
