use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_element::{ElementIter, ElementSpec, Tensor};
use sluice_formats::tfrecord::TfRecordWriter;
use sluice_pipeline::{parse, Dataset, Transform};

use super::*;

fn run_def(def: &pb::DatasetDef, opts: &ExecOptions) -> Vec<Result<Element, DatasetError>> {
    iterate(def, opts).unwrap().collect()
}

fn json_of(expr: &str) -> Vec<Value> {
    let def = parse(expr).unwrap().into_def();
    run_def(&def, &ExecOptions::default())
        .into_iter()
        .map(|e| e.unwrap().to_json())
        .collect()
}

fn ints_of(expr: &str) -> Vec<i64> {
    json_of(expr)
        .into_iter()
        .map(|v| v.as_i64().unwrap_or_else(|| panic!("{expr}: {v}")))
        .collect()
}

#[test]
fn ops_table() {
    let cases: &[(&str, Vec<i64>)] = &[
        ("range(10)", (0..10).collect()),
        ("range(0, 100, 3)", (0..100).step_by(3).collect()),
        ("range(10, 0, -3)", vec![10, 7, 4, 1]),
        ("range(5, 0)", vec![]),
        ("range(5).map(square)", vec![0, 1, 4, 9, 16]),
        ("range(5).map(negate).map(add_one)", vec![1, 0, -1, -2, -3]),
        ("range(10).filter(is_even)", vec![0, 2, 4, 6, 8]),
        (
            "range(10).filter(is_odd).map(square)",
            vec![1, 9, 25, 49, 81],
        ),
        ("range(10).take(3)", vec![0, 1, 2]),
        ("range(10).take(0)", vec![]),
        ("range(10).skip(3)", (3..10).collect()),
        ("range(10).skip(30)", vec![]),
        ("range(10).shard(3, 1)", vec![1, 4, 7]),
        ("range(10).shard(3, 0)", vec![0, 3, 6, 9]),
        ("range(3).repeat(2)", vec![0, 1, 2, 0, 1, 2]),
        ("range(3).repeat(0)", vec![]),
        ("range(3).repeat().take(7)", vec![0, 1, 2, 0, 1, 2, 0]),
        ("range(0).repeat()", vec![]),
        (
            "range(10).filter(is_even).repeat(2).shard(2, 1).take(3)",
            vec![2, 6, 0],
        ),
        ("range(10).prefetch(2)", (0..10).collect()),
        ("range(10).prefetch(0)", (0..10).collect()),
        (
            "range(2).repeat(2).prefetch(1).repeat(2)",
            vec![0, 1, 0, 1, 0, 1, 0, 1],
        ),
        ("from_slices([4, 5, 6])", vec![4, 5, 6]),
        ("from_slices([1, 2], dtype=uint16).map(square)", vec![1, 4]),
    ];
    for (expr, want) in cases {
        assert_eq!(&ints_of(expr), want, "{expr}");
    }
}

#[test]
fn batches_and_shapes() {
    assert_eq!(
        json_of("range(10).batch(4)"),
        vec![json!([0, 1, 2, 3]), json!([4, 5, 6, 7]), json!([8, 9])]
    );
    assert_eq!(
        json_of("range(10).batch(4, drop_remainder=true)"),
        vec![json!([0, 1, 2, 3]), json!([4, 5, 6, 7])]
    );
    assert_eq!(
        json_of("range(8).batch(4).batch(2)"),
        vec![json!([[0, 1, 2, 3], [4, 5, 6, 7]])]
    );
    assert_eq!(
        json_of("from_slices([[1, 2], [3, 4]])"),
        vec![json!([1, 2]), json!([3, 4])]
    );
    assert_eq!(
        json_of("from_slices([[1, 2], [3, 4], [5, 6]]).batch(2)"),
        vec![json!([[1, 2], [3, 4]]), json!([[5, 6]])]
    );
    assert_eq!(
        json_of("from_slices([\"a\", \"b\", \"c\"]).batch(2)"),
        vec![json!(["a", "b"]), json!(["c"])]
    );
    assert_eq!(
        json_of("from_slices([1.5, 2.5]).map(square)"),
        vec![json!(2.25), json!(6.25)]
    );
    let def = parse("range(5).batch(2)").unwrap().into_def();
    let shapes: Vec<Vec<usize>> = run_def(&def, &ExecOptions::default())
        .into_iter()
        .map(|e| e.unwrap().as_tensor().unwrap().shape().to_vec())
        .collect();
    assert_eq!(shapes, vec![vec![2], vec![2], vec![1]]);
}

/// A registry with extra maps: `iota` (x → [0..x)), `pair` (x → (x, {"s": "x"})).
fn extended() -> ExecOptions {
    let r = FunctionRegistry::with_builtins();
    r.register_map(
        "iota",
        Arc::new(|_: &ElementSpec| {
            Ok(ElementSpec::Tensor {
                dtype: sluice_element::DType::Int64,
                shape: vec![None],
            })
        }),
        Arc::new(|e: Element| {
            let n = e.as_i64().unwrap_or(0);
            Ok(Tensor::from_i64s(vec![n as usize], &(0..n).collect::<Vec<_>>())?.into())
        }),
    );
    r.register_map(
        "pair",
        Arc::new(|s: &ElementSpec| {
            let d = ElementSpec::Dict(BTreeMap::from([(
                "s".to_string(),
                ElementSpec::scalar(sluice_element::DType::String),
            )]));
            Ok(ElementSpec::Tuple(vec![s.clone(), d]))
        }),
        Arc::new(|e: Element| {
            let s = e.as_i64().unwrap_or(0).to_string();
            let d = Element::Dict(BTreeMap::from([(
                "s".to_string(),
                Tensor::scalar_string(s).into(),
            )]));
            Ok(Element::Tuple(vec![e, d]))
        }),
    );
    ExecOptions {
        registry: Arc::new(r),
        ..ExecOptions::default()
    }
}

#[test]
fn batch_is_component_wise_and_checks_shapes() {
    let opts = extended();
    let got: Vec<Value> = run_def(
        &parse("range(3).map(pair).batch(2)").unwrap().into_def(),
        &opts,
    )
    .into_iter()
    .map(|e| e.unwrap().to_json())
    .collect();
    assert_eq!(
        got,
        vec![
            json!([[0, 1], {"s": ["0", "1"]}]),
            json!([[2], {"s": ["2"]}])
        ]
    );
    let got = run_def(
        &parse("range(3).map(iota).batch(2)").unwrap().into_def(),
        &opts,
    );
    assert_eq!(
        got[0].as_ref().unwrap_err().to_string(),
        "cannot batch elements with different shapes: [0] and [1]"
    );
}

#[test]
fn shuffle_is_a_seeded_permutation() {
    let a = ints_of("range(100).shuffle(10, seed=1)");
    assert_eq!(a, ints_of("range(100).shuffle(10, seed=1)"));
    assert_ne!(a, (0..100).collect::<Vec<_>>());
    assert_ne!(a, ints_of("range(100).shuffle(10, seed=2)"));
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    // A buffer of 10 can move an element at most 9 places earlier.
    for (pos, v) in a.iter().enumerate() {
        assert!(*v as usize <= pos + 9, "{v} at {pos}");
    }

    let mut unseeded = ints_of("range(50).shuffle(100)");
    unseeded.sort();
    assert_eq!(unseeded, (0..50).collect::<Vec<_>>());

    // Each repeat pass reshuffles with a derived seed; both passes are permutations.
    let two = ints_of("range(20).shuffle(20, seed=3).repeat(2)");
    let (first, second) = two.split_at(20);
    assert_ne!(first, second);
    assert_eq!(first, &ints_of("range(20).shuffle(20, seed=3)")[..]);
    let mut s = second.to_vec();
    s.sort();
    assert_eq!(s, (0..20).collect::<Vec<_>>());
}

#[test]
fn file_sources() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.txt"), "b1\nb2\n").unwrap();
    std::fs::write(dir.path().join("a.txt"), "a1\r\na2").unwrap();
    let mut w = TfRecordWriter::create(dir.path().join("r.tfrecord")).unwrap();
    for rec in [&b"x"[..], b"yy", b""] {
        w.write_record(rec).unwrap();
    }
    w.into_inner().unwrap();
    let d = dir.path().display();

    let lines = json_of(&format!("files(\"{d}/*.txt\").lines()"));
    assert_eq!(
        lines,
        vec![json!("a1"), json!("a2"), json!("b1"), json!("b2")]
    );
    let batched = json_of(&format!("files(\"{d}/*.txt\").lines().batch(3)"));
    assert_eq!(batched, vec![json!(["a1", "a2", "b1"]), json!(["b2"])]);
    let records = json_of(&format!("files(\"{d}/*.tfrecord\").tfrecord()"));
    assert_eq!(records, vec![json!("x"), json!("yy"), json!("")]);

    // Corrupt the second record's data: one good element, then an error naming file and offset.
    let path = dir.path().join("r.tfrecord");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[17 + 12] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let def = parse(&format!("files(\"{d}/*.tfrecord\").tfrecord()"))
        .unwrap()
        .into_def();
    let got = run_def(&def, &ExecOptions::default());
    assert_eq!(got.len(), 2);
    let err = got[1].as_ref().unwrap_err();
    assert!(
        matches!(err, DatasetError::CorruptRecord { offset: 17, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("r.tfrecord' at byte offset 17"),
        "{err}"
    );

    // Truncated file.
    std::fs::write(&path, &bytes[..20]).unwrap();
    let got = run_def(&def, &ExecOptions::default());
    assert!(got[1]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("truncated"));

    // An expanded list naming a file that has since disappeared.
    let mut def = parse(&format!("files(\"{d}/*.txt\").lines()"))
        .unwrap()
        .into_def();
    sluice_formats::expand_files(&mut def, &sluice_formats::FileAccess::Unrestricted).unwrap();
    std::fs::remove_file(dir.path().join("b.txt")).unwrap();
    let got = run_def(&def, &ExecOptions::default());
    assert_eq!(got.len(), 3);
    assert!(got[2].as_ref().unwrap_err().to_string().contains("b.txt"));

    let missing = parse(&format!("files(\"{d}/*.none\").lines()"))
        .unwrap()
        .into_def();
    assert!(iterate(&missing, &ExecOptions::default()).is_err());
}

/// Hands out scripted split indices per repetition and records every call.
#[derive(Default)]
struct FakeSupplier {
    splits: Mutex<HashMap<u64, VecDeque<u64>>>,
    calls: Mutex<Vec<(u32, u64)>>,
    fail: bool,
}

impl FakeSupplier {
    fn new(per_repetition: &[&[u64]]) -> Arc<Self> {
        let splits = per_repetition
            .iter()
            .enumerate()
            .map(|(r, s)| (r as u64, s.iter().copied().collect()))
            .collect();
        Arc::new(FakeSupplier {
            splits: Mutex::new(splits),
            ..Default::default()
        })
    }
}

impl SplitSupplier for FakeSupplier {
    fn next_split(&self, provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
        self.calls.lock().unwrap().push((provider, repetition));
        if self.fail {
            return Err(DatasetError::Splits {
                message: "dispatcher unavailable".into(),
                retryable: true,
            });
        }
        Ok(self
            .splits
            .lock()
            .unwrap()
            .get_mut(&repetition)
            .and_then(VecDeque::pop_front))
    }
}

fn split_ints(expr: &str, supplier: Arc<FakeSupplier>) -> Vec<Result<i64, DatasetError>> {
    let opts = ExecOptions {
        splits: Some(supplier),
        ..ExecOptions::default()
    };
    run_def(&parse(expr).unwrap().into_def(), &opts)
        .into_iter()
        .map(|r| r.map(|e| e.as_i64().unwrap()))
        .collect()
}

#[test]
fn dynamic_source_yields_only_supplied_splits() {
    let s = FakeSupplier::new(&[&[3, 7, 1]]);
    assert_eq!(
        split_ints("range(10).map(square)", s.clone()),
        vec![Ok(9), Ok(49), Ok(1)]
    );
    assert_eq!(*s.calls.lock().unwrap(), vec![(0, 0); 4]);

    let s = FakeSupplier::new(&[&[1, 2], &[5]]);
    assert_eq!(
        split_ints("range(0, 100, 10).repeat(2)", s.clone()),
        vec![Ok(10), Ok(20), Ok(50)]
    );
    assert!(s.calls.lock().unwrap().contains(&(0, 1)));

    let s = FakeSupplier::new(&[&[0, 12]]);
    let got = split_ints("range(10)", s);
    assert_eq!(
        got[1].as_ref().unwrap_err().to_string(),
        "split index 12 is out of range for 10 splits"
    );

    let s = Arc::new(FakeSupplier {
        fail: true,
        ..Default::default()
    });
    let got = split_ints("range(10)", s);
    assert_eq!(got.len(), 1);
    assert!(got[0].as_ref().unwrap_err().is_retryable());
}

/// In distributed_epoch mode a pass of `repeat` whose source received no split (other workers
/// took the repetition's splits) goes on to the next repetition; a pass that received splits and
/// yielded nothing ends it, as locally, and so does a source with no splits at all.
#[test]
fn dynamic_repeat_goes_on_past_passes_without_splits() {
    type Row = (&'static str, &'static [&'static [u64]], Vec<i64>, u64);
    let rows: Vec<Row> = vec![
        // (pipeline, splits per repetition, elements, last repetition asked for)
        // Repetitions 1 and 2 went to other workers.
        (
            "range(10).repeat().take(2)",
            &[&[1], &[], &[], &[2]],
            vec![1, 2],
            3,
        ),
        (
            "range(10).repeat(4)",
            &[&[1], &[], &[], &[2]],
            vec![1, 2],
            3,
        ),
        // Repetition 0 went to others, and nothing this worker got yields anything after.
        ("range(10).repeat(3)", &[&[], &[], &[]], vec![], 2),
        // Split 3 is filtered out: a pass that read a split and yielded nothing.
        (
            "range(10).filter(is_even).repeat()",
            &[&[2], &[3], &[4]],
            vec![2],
            1,
        ),
        // No split at all: the input is empty.
        ("range(0).repeat()", &[], vec![], 0),
        // Without a repeat, an empty pass is simply the end.
        ("range(10)", &[&[]], vec![], 0),
    ];
    for (expr, splits, want, last) in rows {
        let s = FakeSupplier::new(splits);
        let got: Vec<i64> = split_ints(expr, s.clone())
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(got, want, "{expr}");
        let asked = s.calls.lock().unwrap().iter().map(|(_, r)| *r).max();
        assert_eq!(asked, Some(last), "{expr}");
    }
}

#[test]
fn dynamic_files_split_is_a_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in [("0.txt", "a\nb\n"), ("1.txt", "c\nd\n"), ("2.txt", "e\n")] {
        std::fs::write(dir.path().join(name), body).unwrap();
    }
    let mut def = parse(&format!(
        "files(\"{}/*.txt\").lines()",
        dir.path().display()
    ))
    .unwrap()
    .into_def();
    sluice_formats::expand_files(&mut def, &sluice_formats::FileAccess::Unrestricted).unwrap();
    assert_eq!(sluice_pipeline::num_splits(&def, 0).unwrap(), 3);
    let opts = ExecOptions {
        splits: Some(FakeSupplier::new(&[&[2, 0]])),
        ..ExecOptions::default()
    };
    let got: Vec<Value> = run_def(&def, &opts)
        .into_iter()
        .map(|e| e.unwrap().to_json())
        .collect();
    assert_eq!(got, vec![json!("e"), json!("a"), json!("b")]);
}

#[test]
fn client_side_ops() {
    let opts = ExecOptions::default();
    let input = iterate(Dataset::range(5).def(), &opts).unwrap();
    let ops = sluice_pipeline::parse_ops(".map(square).batch(2)").unwrap();
    let got: Vec<Value> = apply_ops(input, &ops, &opts)
        .unwrap()
        .map(|e| e.unwrap().to_json())
        .collect();
    assert_eq!(got, vec![json!([0, 1]), json!([4, 9]), json!([16])]);
    let input = iterate(Dataset::range(5).def(), &opts).unwrap();
    let err = apply_ops(
        input,
        &sluice_pipeline::parse_ops("repeat(2)").unwrap(),
        &opts,
    )
    .err()
    .unwrap();
    assert!(matches!(err, DatasetError::InvalidArgument(_)), "{err}");
    let input = iterate(Dataset::range(5).def(), &opts).unwrap();
    let err = apply_ops(
        input,
        &sluice_pipeline::parse_ops("map(nope)").unwrap(),
        &opts,
    )
    .err()
    .unwrap();
    assert!(matches!(err, DatasetError::UnknownFunction { .. }));
}

#[test]
fn errors_surface() {
    let opts = ExecOptions::default();
    let err = iterate(Dataset::range(5).map("nope").def(), &opts)
        .err()
        .unwrap();
    assert!(err
        .to_string()
        .starts_with("unknown function 'nope' in map"));
    let def = parse("from_slices([\"a\"]).map(identity)")
        .unwrap()
        .into_def();
    assert!(iterate(&def, &opts).is_ok());
    // A function failing on one element is an Err item, not a panic.
    let r = FunctionRegistry::with_builtins();
    r.register_map(
        "fail_on_3",
        Arc::new(|s: &ElementSpec| Ok(s.clone())),
        Arc::new(|e: Element| match e.as_i64() {
            Some(3) => Err(DatasetError::Function {
                name: "fail_on_3".into(),
                message: "three".into(),
            }),
            _ => Ok(e),
        }),
    );
    let opts = ExecOptions {
        registry: Arc::new(r),
        ..ExecOptions::default()
    };
    let got = run_def(Dataset::range(5).map("fail_on_3").def(), &opts);
    assert_eq!(
        got[3].as_ref().unwrap_err().to_string(),
        "function 'fail_on_3' failed: three"
    );
}

/// Drops send on the channel, so a test can wait for the prefetch thread to let go of its input.
struct DropSignal(std::sync::mpsc::Sender<()>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

#[test]
fn dropping_a_prefetch_stops_its_thread() {
    let (tx, rx) = std::sync::mpsc::channel();
    let produced = Arc::new(AtomicUsize::new(0));
    let counter = produced.clone();
    let guard = DropSignal(tx);
    let input: ElementIter = Box::new((0..).map(move |i| {
        let _keep = &guard;
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(Tensor::scalar_i64(i).into())
    }));
    let ops = sluice_pipeline::parse_ops("prefetch(2)").unwrap();
    let mut it = apply_ops(input, &ops, &ExecOptions::default()).unwrap();
    assert_eq!(it.next().unwrap().unwrap().as_i64(), Some(0));
    assert_eq!(it.next().unwrap().unwrap().as_i64(), Some(1));
    drop(it);
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the prefetch thread dropped its input");
    assert!(
        produced.load(Ordering::Relaxed) <= 2 + 2 + 1,
        "bounded read-ahead"
    );
}

#[test]
fn enumerate_pairs_each_element_with_its_position() {
    let cases: &[(&str, Value)] = &[
        ("range(3).enumerate()", json!([[0, 0], [1, 1], [2, 2]])),
        (
            "range(10, 13).enumerate(5)",
            json!([[5, 10], [6, 11], [7, 12]]),
        ),
        (
            "range(6).filter(is_even).enumerate()",
            json!([[0, 0], [1, 2], [2, 4]]),
        ),
        // Each pass of a repeat after it counts again from the start.
        (
            "range(2).enumerate().repeat(2)",
            json!([[0, 0], [1, 1], [0, 0], [1, 1]]),
        ),
        (
            "range(2).repeat(2).enumerate()",
            json!([[0, 0], [1, 1], [2, 0], [3, 1]]),
        ),
        (
            "range(5).enumerate().batch(2)",
            json!([[[0, 1], [0, 1]], [[2, 3], [2, 3]], [[4], [4]]]),
        ),
        (
            "from_slices([\"a\", \"b\"]).enumerate().enumerate(-1)",
            json!([[-1, [0, "a"]], [0, [1, "b"]]]),
        ),
    ];
    for (expr, want) in cases {
        assert_eq!(&Value::Array(json_of(expr)), want, "{expr}");
    }
}

#[test]
fn enumerate_in_distributed_epoch_mode_is_the_position_in_the_source() {
    let run = |expr: &str, splits: &[u64]| -> Result<Vec<Value>, DatasetError> {
        let opts = ExecOptions {
            splits: Some(FakeSupplier::new(&[splits])),
            ..ExecOptions::default()
        };
        iterate(&parse(expr).unwrap().into_def(), &opts)?
            .map(|r| r.map(|e| e.to_json()))
            .collect()
    };
    // This worker was handed splits 7, 2 and 4: their indices are their places in the source,
    // so another worker's elements cannot collide with them.
    assert_eq!(
        run(
            "range(10, 20).map(square).prefetch(1).enumerate(100)",
            &[7, 2, 4]
        )
        .unwrap(),
        vec![json!([107, 289]), json!([102, 144]), json!([104, 196])]
    );
    assert_eq!(
        run(
            "range(10).enumerate().enumerate(1).map(negate).batch(2)",
            &[3, 5, 6]
        )
        .unwrap(),
        vec![
            // negate maps every tensor of the element, the outer index too.
            json!([[-4, -6], [[-3, -5], [-3, -5]]]),
            json!([[-7], [[-6], [-6]]]),
        ]
    );
    assert_eq!(
        run("from_slices([[1, 2], [3, 4]]).enumerate()", &[1]).unwrap(),
        vec![json!([1, [3, 4]])]
    );
    // Ops that drop, reorder or multiply elements before it would make the split index lie.
    for expr in [
        "range(10).filter(is_even).enumerate()",
        "range(10).shuffle(4).enumerate()",
        "range(10).repeat(2).enumerate()",
        "range(10).batch(2).enumerate()",
    ] {
        let err = run(expr, &[0]).err().unwrap_or_else(|| panic!("{expr}"));
        assert_eq!(
            err.to_string(),
            "enumerate in distributed_epoch mode needs a range or from_slices source with only \
             map, decode_image, resize, prefetch or enumerate before it: its index is the element's \
             split index, its position in the source",
            "{expr}"
        );
    }
    // Ops after the last enumerate are free.
    assert_eq!(
        run("range(10).enumerate().filter(is_even).take(1)", &[4, 6]).unwrap(),
        vec![json!([4, 4])]
    );
}
