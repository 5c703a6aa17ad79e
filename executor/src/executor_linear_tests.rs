//! padded_batch, unbatch, ignore_errors, random and cache run end to end: tables of input,
//! op and expected output or error.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use sluice_element::{ElementSpec, Tensor};
use sluice_formats::{DataRoots, FileAccess};
use sluice_pipeline::{parse, Dataset, Transform};

use super::*;
use crate::memory_budget::MemoryBudget;

/// Builtins plus `iota` (n → [0..n)), `words` (n → n strings "w"), `nest` (n → (iota(n),
/// {"w": words(n)})), `fail_odd` (fails on odd numbers) and `count` (identity, counting calls
/// in `calls`).
fn opts_with(calls: Arc<AtomicUsize>) -> ExecOptions {
    let r = FunctionRegistry::with_builtins();
    let unknown = Arc::new(|_: &ElementSpec| Ok(ElementSpec::Unknown));
    let iota = |e: &Element| -> Result<Element, DatasetError> {
        let n = e.as_i64().unwrap_or(0);
        Ok(Tensor::from_i64s(vec![n as usize], &(0..n).collect::<Vec<_>>())?.into())
    };
    let words = |e: &Element| -> Result<Element, DatasetError> {
        let n = e.as_i64().unwrap_or(0) as usize;
        Ok(Tensor::from_strings(vec![n], vec!["w".into(); n])?.into())
    };
    r.register_map("iota", unknown.clone(), Arc::new(move |e| iota(&e)));
    r.register_map("words", unknown.clone(), Arc::new(move |e| words(&e)));
    r.register_map(
        "nest",
        unknown.clone(),
        Arc::new(move |e| {
            let d = Element::Dict([("w".to_string(), words(&e)?)].into());
            Ok(Element::Tuple(vec![iota(&e)?, d]))
        }),
    );
    r.register_map(
        "fail_odd",
        Arc::new(|s: &ElementSpec| Ok(s.clone())),
        Arc::new(|e: Element| match e.as_i64() {
            Some(v) if v % 2 == 1 => Err(DatasetError::Function {
                name: "fail_odd".into(),
                message: format!("{v} is odd"),
            }),
            _ => Ok(e),
        }),
    );
    r.register_map(
        "count",
        Arc::new(|s: &ElementSpec| Ok(s.clone())),
        Arc::new(move |e: Element| {
            calls.fetch_add(1, Ordering::Relaxed);
            Ok(e)
        }),
    );
    ExecOptions {
        registry: Arc::new(r),
        ..ExecOptions::default()
    }
}

fn opts() -> ExecOptions {
    opts_with(Arc::default())
}

fn run(expr: &str, opts: &ExecOptions) -> Result<Vec<Value>, String> {
    let def = parse(expr).map_err(|e| e.to_string())?.into_def();
    iterate(&def, opts)
        .map_err(|e| e.to_string())?
        .map(|r| r.map(|e| e.to_json()).map_err(|e| e.to_string()))
        .collect()
}

#[test]
fn padded_batch_table() {
    let cases: &[(&str, Value)] = &[
        (
            "range(1, 4).map(iota).padded_batch(2)",
            json!([[[0, 0], [0, 1]], [[0, 1, 2]]]),
        ),
        (
            "range(1, 4).map(iota).padded_batch(2, drop_remainder=true)",
            json!([[[0, 0], [0, 1]]]),
        ),
        (
            "range(1, 4).map(iota).padded_batch(2, padded_shapes=[[4]], padding_values=[-1])",
            json!([[[0, -1, -1, -1], [0, 1, -1, -1]], [[0, 1, 2, -1]]]),
        ),
        (
            "range(0, 3).map(iota).padded_batch(3, padded_shapes=[[-1]])",
            json!([[[0, 0], [0, 0], [0, 1]]]),
        ),
        (
            "range(1, 3).map(words).padded_batch(2)",
            json!([[["w", ""], ["w", "w"]]]),
        ),
        (
            "range(1, 3).map(words).padded_batch(2, padding_values=[\"-\"])",
            json!([[["w", "-"], ["w", "w"]]]),
        ),
        (
            "range(1, 3).map(nest).padded_batch(2, padded_shapes=[[3], [-1]], padding_values=[9, \"p\"])",
            json!([[[[0, 9, 9], [0, 1, 9]], {"w": [["w", "p"], ["w", "w"]]}]]),
        ),
        // Scalars pad to nothing: a plain batch.
        ("range(5).padded_batch(2)", json!([[0, 1], [2, 3], [4]])),
        (
            "from_slices([[[1, 2]], [[3, 4]]]).padded_batch(2, padded_shapes=[[2, 3]])",
            json!([[[[1, 2, 0], [0, 0, 0]], [[3, 4, 0], [0, 0, 0]]]]),
        ),
    ];
    for (expr, want) in cases {
        assert_eq!(
            Value::Array(run(expr, &opts()).unwrap_or_else(|e| panic!("{expr}: {e}"))),
            *want,
            "{expr}"
        );
    }
}

#[test]
fn padded_batch_errors_name_both_shapes() {
    let cases: &[(&str, &str)] = &[
        (
            "range(1, 4).map(iota).padded_batch(3, padded_shapes=[[2]])",
            "Attempted to pad to a smaller size than the input element: padded shape [2] of \
             component 0 is smaller than the element's shape [3]",
        ),
        (
            "range(1, 4).map(iota).padded_batch(3, padded_shapes=[[2, 2]])",
            "padded shape [2, 2] of component 0 has rank 2",
        ),
        (
            "range(1, 4).map(iota).padded_batch(3, padding_values=[\"x\"])",
            "Mismatched type between padding value string and input elements int64",
        ),
        (
            "range(1, 4).map(iota).padded_batch(3, padded_shapes=[[-1], [-1]])",
            "padded_shapes has 2 components but the element has 1",
        ),
    ];
    for (expr, want) in cases {
        let err = run(expr, &opts()).unwrap_err();
        assert!(err.contains(want), "{expr}: {err}");
    }
}

#[test]
fn padded_batch_of_absurd_sizes_is_refused_before_allocating() {
    // Given sizes: refused when the pipeline is built.
    let err = run(
        "range(3).map(iota).padded_batch(1000000, padded_shapes=[[1000000000000]])",
        &opts(),
    )
    .unwrap_err();
    assert!(err.contains("more than the limit of"), "{err}");
    // Sizes known only from the elements: refused before the batch's buffer exists, here by
    // the memory budget.
    let budget = MemoryBudget::new(1 << 16, "--memory-budget");
    let limited = ExecOptions {
        memory: Some(budget.share("task")),
        ..opts()
    };
    let err = run(
        "range(3).map(iota).padded_batch(2, padded_shapes=[[100000]])",
        &limited,
    )
    .unwrap_err();
    assert!(err.contains("padded_batch needs"), "{err}");
    assert_eq!(budget.used(), 0);
}

#[test]
fn unbatch_table() {
    let cases: &[(&str, Result<Value, &str>)] = &[
        ("range(5).batch(2).unbatch()", Ok(json!([0, 1, 2, 3, 4]))),
        (
            "range(0, 4).map(iota).unbatch()",
            Ok(json!([0, 0, 1, 0, 1, 2])),
        ),
        (
            "range(1, 3).map(nest).unbatch()",
            Ok(json!([[0, {"w": "w"}], [0, {"w": "w"}], [1, {"w": "w"}]])),
        ),
        (
            "range(2).unbatch()",
            Err("Cannot unbatch an input with scalar components."),
        ),
    ];
    for (expr, want) in cases {
        match (run(expr, &opts()), want) {
            (Ok(got), Ok(want)) => assert_eq!(Value::Array(got), *want, "{expr}"),
            (Err(got), Err(want)) => assert!(got.contains(want), "{expr}: {got}"),
            (got, want) => panic!("{expr}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn unbatch_checks_each_element_when_the_spec_is_unknown() {
    let r = FunctionRegistry::with_builtins();
    r.register_map(
        "ragged",
        Arc::new(|_: &ElementSpec| Ok(ElementSpec::Unknown)),
        Arc::new(|e: Element| {
            let n = e.as_i64().unwrap_or(0) as usize;
            Ok(Element::Tuple(vec![
                Tensor::from_i64s(vec![2], &[1, 2])?.into(),
                Tensor::from_i64s(vec![n], &vec![0; n])?.into(),
            ]))
        }),
    );
    let o = ExecOptions {
        registry: Arc::new(r),
        ..ExecOptions::default()
    };
    let got = run("range(2, 4).map(ragged).unbatch()", &o).unwrap_err();
    assert_eq!(
        got,
        "Input element must have the same batch size in each component. Component 0 has batch \
         size: 2 but component 1 has batch size: 3."
    );
    let got = run("range(0, 1).map(ragged).unbatch()", &o).unwrap_err();
    assert!(got.contains("Component 0 has batch size: 2 but component 1 has batch size: 0"));
}

#[test]
fn ignore_errors_drops_failed_elements_only() {
    assert_eq!(
        run("range(7).map(fail_odd).ignore_errors()", &opts()).unwrap(),
        vec![json!(0), json!(2), json!(4), json!(6)]
    );
    assert_eq!(
        run(
            "range(7).map(fail_odd).ignore_errors(log_warning=true).batch(2)",
            &opts()
        )
        .unwrap(),
        vec![json!([0, 2]), json!([4, 6])]
    );
    // Errors that say the pipeline cannot go on pass through.
    let input: Vec<Result<Element, DatasetError>> = vec![
        Ok(Tensor::scalar_i64(1).into()),
        Err(DatasetError::invalid("bad record")),
        Err(DatasetError::Cancelled),
        Err(DatasetError::Splits {
            message: "dispatcher gone".into(),
            retryable: true,
        }),
        Ok(Tensor::scalar_i64(2).into()),
    ];
    let out: Vec<_> = apply_ops(
        Box::new(input.into_iter()),
        &[parse("range(1).ignore_errors()").unwrap().into_def().ops[0].clone()],
        &ExecOptions::default(),
    )
    .unwrap()
    .map(|r| r.map(|e| e.to_json()).map_err(|e| e.to_string()))
    .collect();
    assert_eq!(
        out,
        vec![
            Ok(json!(1)),
            Err("cancelled".to_string()),
            Err("cannot get next split: dispatcher gone".to_string()),
            Ok(json!(2)),
        ]
    );
}

#[test]
fn ignore_errors_stops_when_cancelled() {
    let cancel = Cancellation::new();
    let o = ExecOptions {
        cancel: cancel.clone(),
        ..opts()
    };
    // Every element fails: ignore_errors would drop them without end.
    let def = parse("range(5).repeat().map(fail_odd).map(add_one).map(fail_odd).ignore_errors()")
        .unwrap()
        .into_def();
    let mut it = iterate(&def, &o).unwrap();
    cancel.cancel();
    assert!(matches!(it.next(), Some(Err(DatasetError::Cancelled))));
}

#[test]
fn random_is_deterministic_with_a_seed() {
    let a = run("random(seed=42).take(5)", &opts()).unwrap();
    assert_eq!(a.len(), 5);
    assert_eq!(a, run("random(seed=42).take(5)", &opts()).unwrap());
    assert_ne!(a, run("random(seed=43).take(5)", &opts()).unwrap());
    let distinct: std::collections::HashSet<String> = a.iter().map(Value::to_string).collect();
    assert_eq!(distinct.len(), 5);
    // Each pass of a seeded stream is the same stream, as tf.data's default.
    let twice = run("random(seed=42).take(3).repeat(2)", &opts()).unwrap();
    assert_eq!(twice[..3], twice[3..]);
    assert_eq!(twice[..3], a[..3]);
    let unseeded = run("random().take(4)", &opts()).unwrap();
    assert_eq!(unseeded.len(), 4);
}

struct NoSplits;

impl SplitSupplier for NoSplits {
    fn next_split(&self, _: u32, _: u64) -> Result<Option<u64>, DatasetError> {
        Ok(None)
    }
}

#[test]
fn distributed_epoch_refuses_random_and_cache() {
    let o = ExecOptions {
        splits: Some(Arc::new(NoSplits)),
        ..opts()
    };
    let err = run("random(seed=1).take(3)", &o).unwrap_err();
    assert!(err.contains("Dataset.random has no splits"), "{err}");
    assert!(err.contains("RandomDataset"), "{err}");
    let err = run("range(3).cache().repeat(2)", &o).unwrap_err();
    assert!(
        err.contains("cache cannot run in distributed_epoch mode"),
        "{err}"
    );
}

#[test]
fn memory_cache_replays_later_passes() {
    let calls = Arc::new(AtomicUsize::new(0));
    let o = opts_with(calls.clone());
    let got = run("range(3).map(count).cache().repeat(3)", &o).unwrap();
    assert_eq!(got, [0, 1, 2, 0, 1, 2, 0, 1, 2].map(|v| json!(v)).to_vec());
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    // A pass that stops early completes nothing: the next one runs the upstream again.
    calls.store(0, Ordering::Relaxed);
    let got = run("range(3).map(count).cache().take(2).repeat(2)", &o).unwrap();
    assert_eq!(got, [0, 1, 0, 1].map(|v| json!(v)).to_vec());
    assert_eq!(calls.load(Ordering::Relaxed), 4);
    // A pass with an error is not kept either.
    calls.store(0, Ordering::Relaxed);
    let got = run(
        "range(3).map(count).map(fail_odd).cache().ignore_errors().repeat(2)",
        &o,
    )
    .unwrap();
    assert_eq!(got, [0, 2, 0, 2].map(|v| json!(v)).to_vec());
    assert_eq!(calls.load(Ordering::Relaxed), 6);
}

#[test]
fn memory_cache_is_held_on_the_budget() {
    let budget = MemoryBudget::new(1 << 12, "--memory-budget");
    let o = ExecOptions {
        memory: Some(budget.share("task")),
        ..opts()
    };
    let err = run("range(100000).cache().repeat(2)", &o).unwrap_err();
    assert!(err.contains("cache needs"), "{err}");
    let def = parse("range(10).cache().repeat(2)").unwrap().into_def();
    let mut it = iterate(&def, &o).unwrap();
    for _ in 0..10 {
        it.next().unwrap().unwrap();
    }
    it.next().unwrap().unwrap(); // the replay began: the cache is complete and held
    assert!(budget.used() > 0);
    drop(it);
    assert_eq!(budget.used(), 0);
}

#[test]
fn file_cache_is_written_whole_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.cache");
    let calls = Arc::new(AtomicUsize::new(0));
    let o = opts_with(calls.clone());
    let expr = |tail: &str| {
        format!(
            "range(4).map(count).cache({:?}){tail}",
            path.to_str().unwrap()
        )
    };
    // An interrupted pass leaves nothing behind.
    assert_eq!(run(&expr(".take(2)"), &o).unwrap().len(), 2);
    assert!(!path.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    calls.store(0, Ordering::Relaxed);
    let got = run(&expr(".repeat(2)"), &o).unwrap();
    assert_eq!(got, [0, 1, 2, 3, 0, 1, 2, 3].map(|v| json!(v)).to_vec());
    assert_eq!(calls.load(Ordering::Relaxed), 4);
    assert!(path.exists());
    // Another run reads the file without running the upstream.
    let got = run(&expr(""), &o).unwrap();
    assert_eq!(got, [0, 1, 2, 3].map(|v| json!(v)).to_vec());
    assert_eq!(calls.load(Ordering::Relaxed), 4);
    // A truncated file is an error naming it, not a short dataset.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    let err = run(&expr(""), &o).unwrap_err();
    assert!(err.contains("cannot be read: it ends early"), "{err}");
    std::fs::write(&path, b"not a cache").unwrap();
    let err = run(&expr(""), &o).unwrap_err();
    assert!(err.contains("is not a Sluice cache file"), "{err}");
}

#[test]
fn a_snapshot_is_kept_per_pipeline_in_its_directory_and_read_by_later_runs() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let o = opts_with(calls.clone());
    let expr = |upstream: &str| {
        format!(
            "{upstream}.map(count).snapshot({:?})",
            dir.path().to_str().unwrap()
        )
    };
    let got = run(&expr("range(3)"), &o).unwrap();
    assert_eq!(got, [0, 1, 2].map(|v| json!(v)).to_vec());
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    let files = || std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(files(), 1);
    // A later run of the same pipeline reads the snapshot, not the upstream.
    assert_eq!(run(&expr("range(3)"), &o).unwrap(), got);
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    // Another pipeline in the same directory gets its own snapshot.
    let other = run(&expr("range(5)"), &o).unwrap();
    assert_eq!(other.len(), 5);
    assert_eq!(calls.load(Ordering::Relaxed), 8);
    assert_eq!(files(), 2);
}

#[test]
fn file_cache_on_a_server_stays_inside_the_data_roots() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let o = ExecOptions {
        file_access: FileAccess::Roots(DataRoots::new(vec![root.path().to_path_buf()]).unwrap()),
        ..opts()
    };
    let inside = root.path().join("c.cache");
    let got = run(
        &format!("range(3).cache({:?}).repeat(2)", inside.to_str().unwrap()),
        &o,
    )
    .unwrap();
    assert_eq!(got.len(), 6);
    assert!(inside.exists());
    let refused = outside.path().join("c.cache");
    let err = run(
        &format!("range(3).cache({:?})", refused.to_str().unwrap()),
        &o,
    )
    .unwrap_err();
    assert!(err.contains("refused to read"), "{err}");
    assert!(!refused.exists());
}

#[test]
fn builder_ops_match_expressions() {
    let d = Dataset::range(3).map("iota").padded_batch(
        2,
        false,
        vec![vec![3]],
        vec![Tensor::scalar_i64(7)],
    );
    let got: Vec<Value> = iterate(d.def(), &opts())
        .unwrap()
        .map(|r| r.unwrap().to_json())
        .collect();
    assert_eq!(got, vec![json!([[7, 7, 7], [0, 7, 7]]), json!([[0, 1, 7]])]);
}

/// A lines source over `files` (already expanded), then `ignore_errors`.
fn lines_ignoring_errors(files: Vec<String>) -> pb::DatasetDef {
    let mut def = Dataset::files("listed")
        .lines()
        .ignore_errors(false)
        .into_def();
    if let Some(pb::source::Kind::Files(fs)) = def.source.as_mut().and_then(|s| s.kind.as_mut()) {
        fs.files = files;
    }
    def
}

#[test]
fn ignore_errors_skips_unreadable_files_but_not_refused_ones() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let good = root.path().join("good.txt");
    std::fs::write(&good, "a\nb\n").unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "s\n").unwrap();
    let name = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let missing = name(&root.path().join("missing.txt"));
    let run_def = |def: &pb::DatasetDef, o: &ExecOptions| -> Vec<Result<Value, String>> {
        iterate(def, o)
            .unwrap()
            .map(|r| r.map(|e| e.to_json()).map_err(|e| e.to_string()))
            .collect()
    };
    // A file that cannot be read is an error of its own elements: dropped.
    let def = lines_ignoring_errors(vec![missing.clone(), name(&good)]);
    assert_eq!(run_def(&def, &opts()), vec![Ok(json!("a")), Ok(json!("b"))]);
    // A file outside a server's data roots is refused, and the refusal is not dropped.
    let server = ExecOptions {
        file_access: FileAccess::Roots(DataRoots::new(vec![root.path().to_path_buf()]).unwrap()),
        ..opts()
    };
    let def = lines_ignoring_errors(vec![name(&secret), name(&good)]);
    let got = run_def(&def, &server);
    assert!(
        matches!(&got[0], Err(e) if e.contains("refused to read")),
        "{got:?}"
    );
    assert_eq!(got[1..], [Ok(json!("a")), Ok(json!("b"))]);
}
