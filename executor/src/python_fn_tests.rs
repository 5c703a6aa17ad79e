//! The Python op's stage, spec and checks, with a runner whose "functions" are Rust closures
//! named by their pickle bytes (the real runners are the worker's executor processes and the
//! Python package's in-process runner, tested through pytest).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;

use sluice_element::{CallResult, DType, ElementSpec, PythonException, Tensor};
use sluice_pipeline::python_op::check;
use sluice_pipeline::{cardinality, element_spec, Dataset, FunctionRegistry, Transform, UNKNOWN};

use super::*;
use crate::executor::{iterate, ExecOptions};

/// Runs each call on its own thread, later calls finishing sooner, and records how many were
/// in flight at most. With `batch` above 1 its functions ask for batches of that size and
/// record the size of each batch they get.
#[derive(Debug, Default)]
struct ThreadRunner {
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
    prepared: Mutex<Vec<String>>,
    batch: usize,
    batches: Arc<Mutex<Vec<usize>>>,
}

impl ThreadRunner {
    fn batching(batch: usize) -> Arc<ThreadRunner> {
        Arc::new(ThreadRunner {
            batch,
            ..ThreadRunner::default()
        })
    }
}

struct ThreadFunction {
    body: fn(i64) -> CallResult,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
    batch: usize,
    batches: Arc<Mutex<Vec<usize>>>,
}

fn int(v: i64) -> Element {
    Element::Tensor(Tensor::scalar_i64(v))
}

fn body_of(pickled: &[u8]) -> fn(i64) -> CallResult {
    match pickled {
        b"double" => |v| Ok(vec![int(2 * v)]),
        b"keep_even" => |v| Ok(if v % 2 == 0 { vec![int(v)] } else { vec![] }),
        b"repeat_self" => |v| Ok((0..v).map(|_| int(v)).collect()),
        b"fails_at_5" => |v| match v {
            5 => Err(DatasetError::Python(Box::new(PythonException {
                type_module: "builtins".into(),
                type_name: "ValueError".into(),
                message: "five".into(),
                traceback: "Traceback ...".into(),
                function: "fails_at_5".into(),
            }))),
            v => Ok(vec![int(v)]),
        },
        _ => |_| Err(DatasetError::PythonRuntime("no such test function".into())),
    }
}

impl PythonRunner for ThreadRunner {
    fn prepare(&self, op: &pb::PyFunctionOp) -> Result<Arc<dyn PythonFunction>, DatasetError> {
        self.prepared.lock().unwrap().push(op.name.clone());
        Ok(Arc::new(ThreadFunction {
            body: body_of(&op.pickled),
            in_flight: self.in_flight.clone(),
            most_in_flight: self.most_in_flight.clone(),
            batch: self.batch,
            batches: self.batches.clone(),
        }))
    }
}

impl PythonFunction for ThreadFunction {
    fn call(&self, input: Element) -> mpsc::Receiver<CallResult> {
        let (tx, rx) = mpsc::channel();
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let (body, in_flight) = (self.body, self.in_flight.clone());
        let v = input.as_i64().expect("int input");
        std::thread::spawn(move || {
            // Later elements finish first, so the stage has results to put back in order.
            std::thread::sleep(std::time::Duration::from_micros(
                (50 - v.min(50)) as u64 * 20,
            ));
            in_flight.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send(body(v));
        });
        rx
    }

    fn parallelism(&self) -> usize {
        2
    }

    fn call_batch(&self, inputs: Vec<Element>) -> Vec<mpsc::Receiver<CallResult>> {
        self.batches.lock().unwrap().push(inputs.len());
        inputs.into_iter().map(|input| self.call(input)).collect()
    }

    fn batch_size(&self) -> usize {
        self.batch.max(1)
    }
}

fn op(kind: pb::PyFunctionKind, pickled: &str) -> pb::PyFunctionOp {
    pb::PyFunctionOp {
        kind: kind as i32,
        pickled: pickled.as_bytes().to_vec(),
        name: pickled.to_string(),
        python_version: "3.11".into(),
        cloudpickle_version: "3.1.1".into(),
        num_parallel_calls: 0,
        output_spec: None,
    }
}

fn with_op(ds: Dataset, op: pb::PyFunctionOp) -> pb::DatasetDef {
    let mut def = ds.into_def();
    def.ops.push(pb::Op {
        kind: Some(pb::op::Kind::PyFunction(op)),
    });
    def
}

fn run(def: &pb::DatasetDef, runner: &Arc<ThreadRunner>) -> Vec<Result<i64, DatasetError>> {
    let opts = ExecOptions {
        python: Some(runner.clone()),
        ..ExecOptions::default()
    };
    iterate(def, &opts)
        .expect("the pipeline builds")
        .map(|r| r.map(|e| e.as_i64().expect("int output")))
        .collect()
}

#[test]
fn each_kind_yields_its_outputs_in_input_order() {
    use pb::PyFunctionKind::{Filter, FlatMap, Map};
    let cases: Vec<(pb::PyFunctionOp, Vec<i64>)> = vec![
        (op(Map, "double"), (0..40).map(|v| 2 * v).collect()),
        (
            op(Filter, "keep_even"),
            (0..40).filter(|v| v % 2 == 0).collect(),
        ),
        (
            op(FlatMap, "repeat_self"),
            (0..6)
                .flat_map(|v| std::iter::repeat_n(v, v as usize))
                .collect(),
        ),
    ];
    for (op, want) in cases {
        let name = op.name.clone();
        let n = if name == "repeat_self" { 6 } else { 40 };
        let runner = Arc::new(ThreadRunner::default());
        let got: Vec<i64> = run(&with_op(Dataset::range(n), op), &runner)
            .into_iter()
            .map(|r| r.expect("no error"))
            .collect();
        assert_eq!(got, want, "{name}");
        // Runner parallelism 2, and no `num_parallel_calls`: four calls in flight at most.
        assert!(runner.most_in_flight.load(Ordering::SeqCst) <= 4, "{name}");
        assert_eq!(
            *runner.prepared.lock().unwrap(),
            vec![name],
            "prepared once"
        );
    }
}

#[test]
fn num_parallel_calls_bounds_the_calls_in_flight() {
    let runner = Arc::new(ThreadRunner::default());
    let mut map = op(pb::PyFunctionKind::Map, "double");
    map.num_parallel_calls = 7;
    let got = run(&with_op(Dataset::range(50), map), &runner);
    assert_eq!(got.len(), 50);
    let most = runner.most_in_flight.load(Ordering::SeqCst);
    assert!((1..=7).contains(&most), "at most 7 in flight, saw {most}");
}

#[test]
fn a_failed_call_is_yielded_in_its_place() {
    let runner = Arc::new(ThreadRunner::default());
    let def = with_op(Dataset::range(8), op(pb::PyFunctionKind::Map, "fails_at_5"));
    let got = run(&def, &runner);
    let oks: Vec<i64> = got.iter().take(5).map(|r| *r.as_ref().unwrap()).collect();
    assert_eq!(oks, vec![0, 1, 2, 3, 4]);
    match &got[5] {
        Err(DatasetError::Python(e)) => {
            assert_eq!(
                e.to_string(),
                "python function 'fails_at_5' raised ValueError: five"
            );
            assert_eq!(e.traceback, "Traceback ...");
        }
        other => panic!("expected the function's exception, got {other:?}"),
    }
}

#[test]
fn without_a_runner_the_pipeline_is_refused_naming_the_flag() {
    let def = with_op(Dataset::range(3), op(pb::PyFunctionKind::Map, "double"));
    match iterate(&def, &ExecOptions::default()) {
        Err(DatasetError::PythonRuntime(m)) => {
            assert!(
                m.contains("python function 'double' cannot run here"),
                "{m}"
            );
            assert!(m.contains("--python"), "{m}");
        }
        Err(other) => panic!("expected PythonRuntime, got {other:?}"),
        Ok(_) => panic!("a Python op ran without a runner"),
    }
}

#[test]
fn malformed_ops_are_refused_naming_what_is_missing() {
    let mut no_kind = op(pb::PyFunctionKind::Map, "double");
    no_kind.kind = 0;
    let mut no_pickle = op(pb::PyFunctionKind::Map, "double");
    no_pickle.pickled.clear();
    let mut no_version = op(pb::PyFunctionKind::Map, "double");
    no_version.cloudpickle_version.clear();
    let cases = [
        (no_kind, "has no kind"),
        (no_pickle, "has no pickled code"),
        (
            no_version,
            "does not record the Python and cloudpickle versions",
        ),
    ];
    for (op, want) in cases {
        let err = check(&op).expect_err(want);
        assert!(err.to_string().contains(want), "{err}");
    }
}

#[test]
fn specs_and_cardinality() {
    use pb::PyFunctionKind::{Filter, FlatMap, Map};
    let registry = FunctionRegistry::global();
    let int64 = ElementSpec::scalar(DType::Int64);
    let mut given = op(Map, "double");
    given.output_spec = Some(ElementSpec::scalar(DType::Float32).to_proto());
    let cases = [
        (op(Map, "double"), ElementSpec::Unknown, 10),
        (given, ElementSpec::scalar(DType::Float32), 10),
        (op(Filter, "keep_even"), int64.clone(), UNKNOWN),
        (op(FlatMap, "repeat_self"), ElementSpec::Unknown, UNKNOWN),
    ];
    for (op, spec, n) in cases {
        let name = op.name.clone();
        let def = with_op(Dataset::range(10), op);
        assert_eq!(element_spec(&def, &registry).unwrap(), spec, "{name}");
        assert_eq!(cardinality(&def), n, "{name}");
    }
    // An unknown spec stays unknown through batching, and round-trips as an empty proto.
    let def = with_op(Dataset::range(10), op(Map, "double"));
    let batched = Dataset::from_def(def).batch(2);
    let spec = element_spec(&batched.into_def(), &registry).unwrap();
    assert_eq!(spec, ElementSpec::Unknown);
    assert_eq!(ElementSpec::from_proto(&spec.to_proto()).unwrap(), spec);
}

#[test]
fn a_python_take_while_ends_at_the_first_dropped_element_and_an_interleave_function_makes_inner_datasets(
) {
    use pb::PyFunctionKind::{Interleave, TakeWhile};
    let runner = Arc::new(ThreadRunner::default());
    let slices = Dataset::from_slices(Tensor::from_i64s(vec![6], &[0, 2, 4, 5, 6, 8]).unwrap());
    let got: Vec<i64> = run(&with_op(slices, op(TakeWhile, "keep_even")), &runner)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(got, [0, 2, 4]);
    // The inner datasets [1], [2, 2], [3, 3, 3], interleaved two at a time, read sequentially
    // and in parallel.
    for parallel in [None, Some(0)] {
        let def = Dataset::range_with(1, 4, 1)
            .interleave_op(pb::InterleaveOp {
                template: None,
                function: Some(op(Interleave, "repeat_self")),
                cycle_length: 2,
                block_length: 1,
                num_parallel_calls: parallel,
            })
            .into_def();
        let got: Vec<i64> = run(&def, &runner).into_iter().map(Result::unwrap).collect();
        assert_eq!(got, [1, 2, 2, 3, 3, 3], "{parallel:?}");
    }
}

#[test]
fn batches_keep_the_order_of_every_kind_and_their_size() {
    use pb::PyFunctionKind::{Filter, FlatMap, Map};
    let cases: Vec<(pb::PyFunctionOp, i64, Vec<i64>)> = vec![
        (op(Map, "double"), 103, (0..103).map(|v| 2 * v).collect()),
        (
            op(Filter, "keep_even"),
            103,
            (0..103).filter(|v| v % 2 == 0).collect(),
        ),
        (
            op(FlatMap, "repeat_self"),
            11,
            (0..11)
                .flat_map(|v| std::iter::repeat_n(v, v as usize))
                .collect(),
        ),
    ];
    for (op, n, want) in cases {
        let name = op.name.clone();
        let runner = ThreadRunner::batching(4);
        let got: Vec<i64> = run(&with_op(Dataset::range(n), op), &runner)
            .into_iter()
            .map(|r| r.expect("no error"))
            .collect();
        assert_eq!(got, want, "{name}");
        let batches = runner.batches.lock().unwrap().clone();
        assert_eq!(
            batches.iter().sum::<usize>(),
            n as usize,
            "{name}: every input once"
        );
        // Whole batches while the input lasts; only the last may be short.
        let (last, whole) = batches.split_last().unwrap();
        assert!(whole.iter().all(|&b| b == 4), "{name}: {batches:?}");
        assert_eq!(*last, (n as usize - 1) % 4 + 1, "{name}: {batches:?}");
        // Four batches of four in flight at most (parallelism 2, twice).
        let most = runner.most_in_flight.load(Ordering::SeqCst);
        assert!(most <= 16, "{name}: {most} in flight");
    }
}

#[test]
fn num_parallel_calls_counts_batches() {
    let runner = ThreadRunner::batching(3);
    let mut map = op(pb::PyFunctionKind::Map, "double");
    map.num_parallel_calls = 2;
    let got = run(&with_op(Dataset::range(60), map), &runner);
    assert_eq!(got.len(), 60);
    let most = runner.most_in_flight.load(Ordering::SeqCst);
    assert!(
        (1..=6).contains(&most),
        "two batches of 3 in flight at most, saw {most}"
    );
}

#[test]
fn an_error_mid_batch_is_yielded_in_its_place_and_the_batch_goes_on() {
    let runner = ThreadRunner::batching(4);
    // Element 5 is the second of the second batch.
    let def = with_op(
        Dataset::range(11),
        op(pb::PyFunctionKind::Map, "fails_at_5"),
    );
    let got = run(&def, &runner);
    assert_eq!(got.len(), 11);
    for (i, r) in got.iter().enumerate() {
        match (i, r) {
            (5, Err(DatasetError::Python(e))) => {
                assert_eq!(
                    e.to_string(),
                    "python function 'fails_at_5' raised ValueError: five"
                )
            }
            (i, Ok(v)) if i != 5 => assert_eq!(*v, i as i64),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn an_upstream_error_ends_the_batch_being_gathered_and_is_yielded_in_its_place() {
    let runner = ThreadRunner::batching(4);
    // The first Python map fails at 5; the second one, batched, reads that error from
    // upstream while it gathers a batch.
    let mut def = with_op(Dataset::range(9), op(pb::PyFunctionKind::Map, "fails_at_5"));
    def.ops.push(pb::Op {
        kind: Some(pb::op::Kind::PyFunction(op(
            pb::PyFunctionKind::Map,
            "double",
        ))),
    });
    let got = run(&def, &runner);
    assert_eq!(got.len(), 9);
    for (i, r) in got.iter().enumerate() {
        match (i, r) {
            (5, Err(DatasetError::Python(_))) => {}
            (i, Ok(v)) if i != 5 => assert_eq!(*v, 2 * i as i64),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn the_inputs_in_flight_are_held_on_the_memory_budget() {
    // Each int64 input is charged 8 bytes and the element overhead; the budget has room for
    // three of them, so batches of 4 wait for the calls in flight.
    let one = 8 + crate::memory_budget::ELEMENT_OVERHEAD_BYTES;
    let budget = crate::memory_budget::MemoryBudget::new(3 * one, "--memory-budget");
    let runner = ThreadRunner::batching(4);
    let opts = ExecOptions {
        python: Some(runner.clone()),
        memory: Some(budget.share("the test's pipeline")),
        ..ExecOptions::default()
    };
    let def = with_op(Dataset::range(40), op(pb::PyFunctionKind::Map, "double"));
    let got: Vec<i64> = iterate(&def, &opts)
        .unwrap()
        .map(|r| r.expect("no error").as_i64().unwrap())
        .collect();
    assert_eq!(got, (0..40).map(|v| 2 * v).collect::<Vec<_>>());
    let most = runner.most_in_flight.load(Ordering::SeqCst);
    assert!(
        most <= 3,
        "the budget holds three inputs, {most} were in flight"
    );
    assert_eq!(budget.used(), 0, "every input's bytes are given back");

    // A budget without room for one input fails the stage, naming it.
    let tiny = crate::memory_budget::MemoryBudget::new(one - 1, "--memory-budget");
    let opts = ExecOptions {
        python: Some(runner),
        memory: Some(tiny.share("the test's pipeline")),
        ..ExecOptions::default()
    };
    let first = iterate(&def, &opts).unwrap().next().unwrap().unwrap_err();
    assert!(first.to_string().contains("python function"), "{first}");
}
