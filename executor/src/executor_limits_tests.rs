//! The two limits a pipeline's owner hands in through `ExecOptions`: the cancellation flag,
//! checked inside every op that may loop without yielding, and the memory budget, charged by
//! every op that holds elements.

use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sluice_element::ElementSpec;
use sluice_pipeline::parse;

use super::*;
use crate::memory_budget::{MemoryBudget, ELEMENT_OVERHEAD_BYTES};
use sluice_testwait::{wait_until_blocking, HANG};

/// Far more elements than any test pulls.
const HUGE: u64 = 1 << 50;

/// How long a cancelled op may take to give up: a bound only an op that ignores the flag (and
/// loops on through its `HUGE` input) crosses. How long it takes is `sluice bench --only
/// local`'s `cancel_stop_ms`.
const STOP_WITHIN: Duration = sluice_testwait::HANG;

/// Options whose registry has `tick`, an identity map that counts the elements through it.
fn counting(
    cancel: Cancellation,
    memory: Option<Arc<MemoryBudget>>,
) -> (ExecOptions, Arc<AtomicUsize>) {
    let ticks = Arc::new(AtomicUsize::new(0));
    let registry = FunctionRegistry::with_builtins();
    let counter = ticks.clone();
    registry.register_map(
        "tick",
        Arc::new(|s: &ElementSpec| Ok(s.clone())),
        Arc::new(move |e: Element| {
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(e)
        }),
    );
    let opts = ExecOptions {
        registry: Arc::new(registry),
        memory: memory.map(|budget| budget.share("the test's pipeline")),
        cancel,
        ..ExecOptions::default()
    };
    (opts, ticks)
}

/// Runs `expr`'s first `next` on a thread; once the pipeline has pulled a thousand elements
/// through `tick` without yielding, cancels it and checks the `next` returns `Cancelled`
/// within `STOP_WITHIN`.
fn stops_when_cancelled(expr: &str) {
    let cancel = Cancellation::new();
    let (opts, ticks) = counting(cancel.clone(), None);
    let mut it = iterate(&parse(expr).unwrap().into_def(), &opts).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(it.next().map(|r| r.map(|e| e.to_json())));
    });
    wait_until_blocking("the op to loop", HANG, || {
        ticks.load(Ordering::Relaxed) > 1000
    })
    .unwrap();
    assert!(
        rx.try_recv().is_err(),
        "{expr} yielded before it was cancelled"
    );
    let cancelled_at = Instant::now();
    cancel.cancel();
    let got = rx
        .recv_timeout(STOP_WITHIN)
        .unwrap_or_else(|_| panic!("{expr} still running {STOP_WITHIN:?} after it was cancelled"));
    assert_eq!(got, Some(Err(DatasetError::Cancelled)), "{expr}");
    assert!(cancelled_at.elapsed() < STOP_WITHIN, "{expr}");
}

#[test]
fn a_filter_that_drops_everything_stops_when_cancelled() {
    stops_when_cancelled(&format!("range(0, {HUGE}, 2).map(tick).filter(is_odd)"));
}

#[test]
fn a_long_skip_stops_when_cancelled() {
    stops_when_cancelled(&format!("range({HUGE}).map(tick).skip({HUGE})"));
}

#[test]
fn a_shard_far_from_its_index_stops_when_cancelled() {
    stops_when_cancelled(&format!(
        "range({HUGE}).map(tick).shard({HUGE}, {})",
        HUGE - 1
    ));
}

#[test]
fn a_batch_being_filled_stops_when_cancelled() {
    stops_when_cancelled(&format!("range({HUGE}).map(tick).batch({HUGE})"));
}

#[test]
fn a_shuffle_buffer_being_filled_stops_when_cancelled() {
    stops_when_cancelled(&format!("range({HUGE}).map(tick).shuffle({HUGE}, seed=1)"));
}

#[test]
fn a_prefetched_filter_stops_when_cancelled() {
    stops_when_cancelled(&format!(
        "range(0, {HUGE}, 2).map(tick).filter(is_odd).prefetch(4)"
    ));
}

#[test]
fn a_repeat_checks_the_flag_before_each_pass() {
    let cancel = Cancellation::new();
    let (opts, _) = counting(cancel.clone(), None);
    let mut it = iterate(&parse("range(2).repeat()").unwrap().into_def(), &opts).unwrap();
    assert!(matches!(it.next(), Some(Ok(_))));
    assert!(matches!(it.next(), Some(Ok(_))));
    cancel.cancel();
    assert_eq!(it.next(), Some(Err(DatasetError::Cancelled)));
    assert_eq!(it.next(), None);
}

#[test]
fn without_a_flag_nothing_is_cancelled() {
    let (opts, _) = counting(Cancellation::default(), None);
    let got: Vec<_> = iterate(
        &parse("range(10).filter(is_odd).skip(2)")
            .unwrap()
            .into_def(),
        &opts,
    )
    .unwrap()
    .map(|r| r.unwrap().as_i64().unwrap())
    .collect();
    assert_eq!(got, vec![5, 7, 9]);
}

/// Runs `expr` under a budget of `limit` bytes to its first error.
fn first_error(expr: &str, budget: &Arc<MemoryBudget>) -> DatasetError {
    let (opts, _) = counting(Cancellation::default(), Some(budget.clone()));
    let it = iterate(&parse(expr).unwrap().into_def(), &opts).unwrap();
    for item in it {
        if let Err(e) = item {
            return e;
        }
    }
    panic!("{expr} ended without an error");
}

#[test]
fn buffers_past_the_budget_fail_with_resource_exhausted() {
    let limit = 1 << 20;
    // Every int64 scalar is charged its 8 bytes and the per-element overhead.
    let each = 8 + ELEMENT_OVERHEAD_BYTES;
    let fits = limit / each;
    for (expr, op) in [
        (format!("range({HUGE}).batch(1000000000000)"), "batch"),
        (format!("range({HUGE}).shuffle(1000000000000)"), "shuffle"),
    ] {
        let budget = MemoryBudget::new(limit, "--memory-budget");
        let err = first_error(&expr, &budget);
        assert_eq!(
            err,
            DatasetError::ResourceExhausted {
                op: op.into(),
                held: fits * each,
                needed: each,
                limit,
                in_use: fits * each,
                setting: "--memory-budget".into(),
            },
            "{expr}"
        );
        assert_eq!(
            budget.used(),
            0,
            "{expr}: the failed op gave its bytes back"
        );
    }
}

#[test]
fn a_prefetch_queue_past_the_budget_fails_with_resource_exhausted() {
    let budget = MemoryBudget::new(100 * (8 + ELEMENT_OVERHEAD_BYTES), "--memory-budget");
    let (opts, _) = counting(Cancellation::default(), Some(budget.clone()));
    let def = parse(&format!("range({HUGE}).prefetch(1000000000000)"))
        .unwrap()
        .into_def();
    let it = iterate(&def, &opts).unwrap();
    // Nothing is taken off the queue until the producer has filled the budget.
    wait_until_blocking("the queue to fill the budget", HANG, || {
        budget.used() == budget.limit()
    })
    .unwrap();
    let items: Vec<_> = it.collect();
    assert_eq!(items.len(), 101);
    assert!(items[..100].iter().all(Result::is_ok));
    assert!(
        matches!(&items[100], Err(DatasetError::ResourceExhausted { op, .. }) if op == "prefetch"),
        "{:?}",
        items[100]
    );
    assert_eq!(budget.used(), 0);
}

#[test]
fn batches_and_shuffles_within_the_budget_give_their_bytes_back() {
    let budget = MemoryBudget::new(1 << 20, "--memory-budget");
    let (opts, _) = counting(Cancellation::default(), Some(budget.clone()));
    let def = parse("range(1000).shuffle(100, seed=3).batch(10).prefetch(3)")
        .unwrap()
        .into_def();
    let mut all: Vec<i64> = Vec::new();
    for batch in iterate(&def, &opts).unwrap() {
        let batch = batch.unwrap();
        assert!(budget.used() <= budget.limit());
        let Element::Tensor(t) = batch else {
            panic!("a batch of scalars is a tensor")
        };
        all.extend(t.to_i64s().unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (0..1000).collect::<Vec<_>>());
    assert_eq!(budget.used(), 0);
}

#[test]
fn local_execution_without_a_budget_allocates_nothing_from_the_count() {
    // A batch size and buffer far beyond memory, on a short input: no up-front reservation.
    let got: Vec<_> = iterate(
        &parse(
            "range(5).shuffle(1000000000000, seed=1).batch(1000000000000).prefetch(1000000000000)",
        )
        .unwrap()
        .into_def(),
        &ExecOptions::default(),
    )
    .unwrap()
    .collect();
    assert_eq!(got.len(), 1);
    assert!(got[0].is_ok());
}
