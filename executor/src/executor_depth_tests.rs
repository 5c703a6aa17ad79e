//! Long op chains: a definition at the op limit is built, run to its end and dropped on a
//! thread with a small stack, and one op more is refused before anything is built.

use sluice_pipeline::{Dataset, Transform, DEFAULT_MAX_PIPELINE_OPS};

use super::*;

/// A thread stack far smaller than a chain at the limit would need without the guards.
const SMALL_STACK: usize = 512 * 1024;

/// `range(10)` then `n` ops cycling through map, filter, enumerate-free per-element ops and a
/// repeat, so every kind of link (stage, repeat factory) is in the chain.
fn chain(n: usize) -> pb::DatasetDef {
    let mut ds = Dataset::range(10);
    for i in 0..n {
        ds = match i % 4 {
            0 | 1 => ds.map("identity"),
            2 => ds.filter("is_even_or_odd"),
            _ => ds.repeat(1),
        };
    }
    ds.into_def()
}

/// `n` identity maps, as ops to apply to a stream.
fn maps(n: usize) -> Vec<pb::Op> {
    (0..n)
        .fold(Dataset::range(1), |ds, _| ds.map("identity"))
        .into_def()
        .ops
}

fn options() -> ExecOptions {
    let registry = FunctionRegistry::with_builtins();
    registry.register_filter("is_even_or_odd", Arc::new(|_: &Element| Ok(true)));
    ExecOptions {
        registry: Arc::new(registry),
        ..ExecOptions::default()
    }
}

/// Runs `f` on a thread with `SMALL_STACK` bytes of stack.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(SMALL_STACK)
        .spawn(f)
        .expect("spawning a test thread")
        .join()
        .expect("the test thread panicked")
}

#[test]
fn a_chain_at_the_op_limit_runs_to_its_end_on_a_small_stack() {
    let elements = on_small_stack(|| {
        let it = iterate(&chain(DEFAULT_MAX_PIPELINE_OPS), &options()).unwrap();
        let elements: Vec<String> = it.map(|e| e.unwrap().to_json().to_string()).collect();
        elements
    });
    let want: Vec<String> = (0..10).map(|i| i.to_string()).collect();
    assert_eq!(elements, want);
}

#[test]
fn a_chain_dropped_mid_stream_and_client_side_ops_fit_a_small_stack() {
    on_small_stack(|| {
        let mut it = iterate(&chain(DEFAULT_MAX_PIPELINE_OPS), &options()).unwrap();
        assert_eq!(
            it.next().map(|e| e.unwrap().to_json()),
            Some(serde_json::json!(0))
        );
        drop(it);
        let ops = maps(DEFAULT_MAX_PIPELINE_OPS);
        let input = iterate(&Dataset::range(3).into_def(), &ExecOptions::default()).unwrap();
        let it = apply_ops(input, &ops, &ExecOptions::default()).unwrap();
        assert_eq!(it.count(), 3);
    });
}

#[test]
fn one_op_over_the_limit_is_refused_naming_the_count_and_the_limit() {
    let over = DEFAULT_MAX_PIPELINE_OPS + 1;
    let err = iterate(&chain(over), &options()).err().unwrap();
    assert_eq!(
        err,
        DatasetError::InvalidArgument(format!(
            "the dataset definition has {over} ops, more than the limit of \
             {DEFAULT_MAX_PIPELINE_OPS} (--max-pipeline-ops)"
        ))
    );
    let ops = maps(over);
    let input = iterate(&Dataset::range(3).into_def(), &ExecOptions::default()).unwrap();
    assert!(apply_ops(input, &ops, &ExecOptions::default()).is_err());
    let lower = ExecOptions {
        limits: PipelineLimits {
            max_ops: 3,
            ..PipelineLimits::default()
        },
        ..options()
    };
    assert!(iterate(&chain(3), &lower).is_ok());
    assert!(iterate(&chain(4), &lower).is_err());
}
