//! `interleave` and `take_while`, run: tf.data's element order for cycle and block lengths
//! (tables computed by hand from tf.data's documented algorithm, and a grid against a model of
//! it), the same order when reading in parallel, reads that really are concurrent, files
//! templates under distributed_epoch splits, and the errors.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sluice_element::{pb, DatasetError, Element, Tensor};
use sluice_pipeline::{Dataset, FunctionRegistry, PipelineLimits, Transform};

use crate::executor::{iterate, ExecOptions};
use crate::splits::SplitSupplier;

/// Outer elements: rows of `width` int64s, row `i` holding `2 * values[i]` repeated
/// `counts[i]` times and padded with 1s. The template `element_slices().filter(is_even)` makes
/// row `i` the inner dataset `values[i]` (doubled) repeated `counts[i]` times, as tf.data's
/// tests use `from_tensors(x).repeat(n)`.
fn rows(values: &[i64], counts: &[usize]) -> Dataset {
    let width = counts.iter().copied().max().unwrap_or(0).max(1);
    let mut data = Vec::new();
    for (v, n) in values.iter().zip(counts) {
        data.extend(std::iter::repeat_n(2 * v, *n));
        data.extend(std::iter::repeat_n(1, width - n));
    }
    Dataset::from_slices(Tensor::from_i64s(vec![values.len(), width], &data).unwrap())
}

fn template() -> Dataset {
    Dataset::element_slices().filter("is_even")
}

fn ints(def: &pb::DatasetDef, opts: &ExecOptions) -> Vec<i64> {
    iterate(def, opts)
        .unwrap()
        .map(|e| e.unwrap().as_i64().unwrap() / 2)
        .collect()
}

/// The orders for every way of reading: sequential, and parallel with 1, 2 and AUTOTUNE calls.
fn all_orders(outer: &Dataset, cycle: u64, block: u64) -> Vec<Vec<i64>> {
    let opts = ExecOptions::default();
    let mut got = vec![ints(
        &outer
            .clone()
            .interleave(template(), cycle, block)
            .into_def(),
        &opts,
    )];
    for parallel in [1, 2, 0] {
        let def = outer
            .clone()
            .parallel_interleave(template(), cycle, block, parallel)
            .into_def();
        got.push(ints(&def, &opts));
    }
    got
}

#[test]
fn interleave_orders_follow_tf_data_for_each_cycle_and_block_length() {
    // tf.data's documentation: range(1, 6).interleave(lambda x: from_tensors(x).repeat(6),
    // cycle_length=2, block_length=4).
    let docs = rows(&[1, 2, 3, 4, 5], &[6; 5]);
    let docs_order = vec![
        1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5, 5, 5,
    ];
    // tf.data's tests: [4, 5, 6] each repeated itself times.
    let own = rows(&[4, 5, 6], &[4, 5, 6]);
    let cases: Vec<(&Dataset, u64, u64, Vec<i64>)> = vec![
        (&docs, 2, 4, docs_order),
        (
            &own,
            1,
            1,
            vec![4, 4, 4, 4, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6],
        ),
        (
            &own,
            1,
            3,
            vec![4, 4, 4, 4, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6],
        ),
        (
            &own,
            2,
            1,
            vec![4, 5, 4, 5, 4, 5, 4, 5, 5, 6, 6, 6, 6, 6, 6],
        ),
        (
            &own,
            2,
            3,
            vec![4, 4, 4, 5, 5, 5, 4, 5, 5, 6, 6, 6, 6, 6, 6],
        ),
        (
            &own,
            3,
            1,
            vec![4, 5, 6, 4, 5, 6, 4, 5, 6, 4, 5, 6, 5, 6, 6],
        ),
        (
            &own,
            3,
            2,
            vec![4, 4, 5, 5, 6, 6, 4, 4, 5, 5, 6, 6, 5, 6, 6],
        ),
        // A cycle longer than the input: the extra slots stay empty.
        (
            &own,
            7,
            2,
            vec![4, 4, 5, 5, 6, 6, 4, 4, 5, 5, 6, 6, 5, 6, 6],
        ),
        // A block longer than every inner dataset: each is read whole in turn.
        (
            &own,
            2,
            10,
            vec![4, 4, 4, 4, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6],
        ),
    ];
    for (outer, cycle, block, want) in cases {
        for (way, got) in all_orders(outer, cycle, block).into_iter().enumerate() {
            assert_eq!(got, want, "cycle {cycle} block {block}, way {way}");
        }
    }
}

/// tf.data's interleave, element by element, on inner datasets given as lists.
fn model(inners: &[Vec<i64>], cycle: usize, block: usize) -> Vec<i64> {
    let mut input = inners.iter();
    let mut slots: Vec<Option<std::slice::Iter<'_, i64>>> = vec![None; cycle];
    let (mut index, mut taken, mut open, mut input_done) = (0, 0, 0, false);
    let mut out = Vec::new();
    loop {
        if let Some(inner) = slots[index].as_mut() {
            if let Some(v) = inner.next() {
                out.push(*v);
                taken += 1;
                if taken == block {
                    taken = 0;
                    index = (index + 1) % cycle;
                }
            } else {
                slots[index] = None;
                open -= 1;
                taken = 0;
                index = (index + 1) % cycle;
            }
        } else if !input_done {
            match input.next() {
                Some(inner) => {
                    slots[index] = Some(inner.iter());
                    open += 1;
                }
                None => input_done = true,
            }
        } else if open == 0 {
            return out;
        } else {
            taken = 0;
            index = (index + 1) % cycle;
        }
    }
}

#[test]
fn interleave_matches_the_model_over_a_grid_including_empty_inner_datasets() {
    let values = [1, 2, 3, 4, 5, 6, 7];
    let counts = [3, 0, 5, 1, 0, 4, 2];
    let outer = rows(&values, &counts);
    let inners: Vec<Vec<i64>> = values
        .iter()
        .zip(counts)
        .map(|(v, n)| vec![*v; n])
        .collect();
    for cycle in 1..=8 {
        for block in 1..=5 {
            let want = model(&inners, cycle, block);
            assert_eq!(want.len(), counts.iter().sum::<usize>());
            for (way, got) in all_orders(&outer, cycle as u64, block as u64)
                .into_iter()
                .enumerate()
            {
                assert_eq!(got, want, "cycle {cycle} block {block}, way {way}");
            }
        }
    }
}

/// A map that lets each element through only once `expected` calls are inside it at the same
/// time (or fails at the deadline): it passes only if that many inner datasets are read at once.
fn rendezvous_registry(expected: usize, deadline: Duration) -> Arc<FunctionRegistry> {
    let registry = FunctionRegistry::global();
    let custom = FunctionRegistry::new();
    for name in registry.map_names() {
        let (f, spec) = registry.map_fn(&name).unwrap();
        custom.register_map(&name, spec, f);
    }
    for name in registry.filter_names() {
        custom.register_filter(&name, registry.filter_fn(&name).unwrap());
    }
    let arrived = Arc::new((Mutex::new(0usize), Condvar::new()));
    custom.register_map(
        "meet",
        Arc::new(|s| Ok(s.clone())),
        Arc::new(move |e: Element| {
            let (count, cond) = &*arrived;
            let mut n = count.lock().unwrap();
            *n += 1;
            cond.notify_all();
            let until = Instant::now() + deadline;
            while *n < expected {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(DatasetError::invalid(format!(
                        "only {n} of {expected} inner datasets were read at once"
                    )));
                }
                n = cond.wait_timeout(n, left).unwrap().0;
            }
            Ok(e)
        }),
    );
    Arc::new(custom)
}

#[test]
fn a_parallel_interleave_reads_its_inner_datasets_concurrently() {
    let outer = rows(&[1, 2, 3, 4], &[2; 4]);
    let meet = Dataset::element_slices().filter("is_even").map("meet");
    let opts = ExecOptions {
        registry: rendezvous_registry(4, Duration::from_secs(30)),
        ..Default::default()
    };
    let def = outer
        .clone()
        .parallel_interleave(meet.clone(), 4, 1, 0)
        .into_def();
    assert_eq!(ints(&def, &opts), vec![1, 2, 3, 4, 1, 2, 3, 4]);

    // Read one after another, the first inner dataset waits alone: the rendezvous fails.
    let opts = ExecOptions {
        registry: rendezvous_registry(4, Duration::from_millis(200)),
        ..Default::default()
    };
    let def = outer.interleave(meet, 4, 1).into_def();
    let first = iterate(&def, &opts).unwrap().next().unwrap();
    assert!(
        first
            .unwrap_err()
            .to_string()
            .contains("only 1 of 4 inner datasets were read at once"),
        "sequential reads are not concurrent"
    );
}

fn file_names(dir: &std::path::Path, files: &[(&str, &str)]) -> Dataset {
    let mut names = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        names.push(bytes::Bytes::from(path.to_string_lossy().into_owned()));
    }
    Dataset::from_slices(Tensor::from_strings(vec![names.len()], names).unwrap())
}

fn strings(def: &pb::DatasetDef, opts: &ExecOptions) -> Vec<String> {
    iterate(def, opts)
        .unwrap()
        .map(|e| e.unwrap().to_json().as_str().unwrap().to_string())
        .collect()
}

/// Hands out the given splits of repetition 0, in order.
struct Splits(Mutex<Vec<u64>>);

impl SplitSupplier for Splits {
    fn next_split(&self, _provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
        let mut left = self.0.lock().unwrap();
        Ok((repetition == 0 && !left.is_empty()).then(|| left.remove(0)))
    }
}

#[test]
fn files_named_by_the_elements_are_interleaved_whole_or_split_by_split() {
    let dir = tempfile::tempdir().unwrap();
    let names = file_names(
        dir.path(),
        &[
            ("a.txt", "a0\na1\na2\n"),
            ("b.txt", "b0\n"),
            ("c.txt", "c0\nc1\n"),
        ],
    );
    // b ends at its second turn: the cursor moves on to a, then c takes b's slot.
    let want = ["a0", "b0", "a1", "a2", "c0", "c1"];
    for parallel in [None, Some(0)] {
        let def = match parallel {
            None => names.clone().interleave(Dataset::element_lines(), 2, 1),
            Some(n) => names
                .clone()
                .parallel_interleave(Dataset::element_lines(), 2, 1, n),
        }
        .into_def();
        assert_eq!(strings(&def, &ExecOptions::default()), want);

        // distributed_epoch: the splits are the outer source's, one file each; the inner
        // datasets are read whole.
        let opts = ExecOptions {
            splits: Some(Arc::new(Splits(Mutex::new(vec![2, 0])))),
            ..Default::default()
        };
        assert_eq!(strings(&def, &opts), ["c0", "a0", "c1", "a1", "a2"]);
    }
}

#[test]
fn a_missing_file_fails_its_slot_and_the_interleave_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut names: Vec<bytes::Bytes> = Vec::new();
    std::fs::write(dir.path().join("a.txt"), "a0\na1\n").unwrap();
    names.push(
        dir.path()
            .join("a.txt")
            .to_string_lossy()
            .into_owned()
            .into(),
    );
    names.push(
        dir.path()
            .join("missing.txt")
            .to_string_lossy()
            .into_owned()
            .into(),
    );
    let outer = Dataset::from_slices(Tensor::from_strings(vec![2], names).unwrap());
    for def in [
        outer.clone().interleave(Dataset::element_lines(), 2, 1),
        outer.parallel_interleave(Dataset::element_lines(), 2, 1, 0),
    ] {
        let got: Vec<String> = iterate(&def.into_def(), &ExecOptions::default())
            .unwrap()
            .map(|e| match e {
                Ok(e) => e.to_json().as_str().unwrap().to_string(),
                Err(err) => format!("error: {err}"),
            })
            .collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!((got[0].as_str(), got[2].as_str()), ("a0", "a1"));
        assert!(got[1].contains("missing.txt"), "{got:?}");
    }
}

#[test]
fn interleave_arguments_and_templates_are_checked_with_tf_data_texts() {
    let opts = ExecOptions::default();
    let err = |def: pb::DatasetDef| match iterate(&def, &opts) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    let range = Dataset::range(3);
    assert!(err(range.clone().interleave(template(), 2, 0).into_def())
        .contains("block_length must be greater than zero."));
    assert!(err(range
        .clone()
        .parallel_interleave(template(), 1000, 1, 0)
        .into_def())
    .contains("a parallel interleave reads at most 256 inner datasets at once"));
    // A scalar element cannot be sliced; an int64 element does not name a file.
    assert!(err(range.clone().interleave(template(), 2, 1).into_def())
        .contains("from_slices needs a tensor of rank at least 1"));
    assert!(err(range
        .clone()
        .interleave(Dataset::element_lines(), 2, 1)
        .into_def())
    .contains("interleave reads files named by scalar string elements"));
    // An element source outside a template.
    assert!(err(Dataset::element_lines().into_def()).contains(
        "an element source is only valid as the source of a template (interleave, group_by_window)"
    ));
    // A template whose function does not exist.
    assert!(err(rows(&[1], &[1])
        .interleave(Dataset::element_slices().map("nope"), 2, 1)
        .into_def())
    .contains("nope"));
}

#[test]
fn an_ordinary_template_source_makes_the_same_inner_dataset_for_every_element() {
    let def = Dataset::range(2)
        .interleave(Dataset::range_with(10, 13, 1), 2, 2)
        .into_def();
    let got: Vec<i64> = iterate(&def, &ExecOptions::default())
        .unwrap()
        .map(|e| e.unwrap().as_i64().unwrap())
        .collect();
    assert_eq!(got, vec![10, 11, 10, 11, 12, 12]);
}

/// `depth` templates, each inside the one before, the innermost a range.
fn nested(depth: usize) -> pb::DatasetDef {
    let mut inner = Dataset::range(2);
    for _ in 0..depth {
        inner = Dataset::range(1).interleave(inner, 1, 1);
    }
    inner.into_def()
}

#[test]
fn nested_templates_count_against_the_pipeline_limits_and_hostile_nesting_is_refused() {
    let got: Vec<i64> = iterate(&nested(3), &ExecOptions::default())
        .unwrap()
        .map(|e| e.unwrap().as_i64().unwrap())
        .collect();
    assert_eq!(got, vec![0, 1]);
    let limits = PipelineLimits {
        max_ops: 10,
        max_depth: 4,
    };
    let opts = ExecOptions {
        limits,
        ..Default::default()
    };
    assert!(iterate(&nested(4), &opts).is_ok());
    let deep = iterate(&nested(5), &opts).err().unwrap().to_string();
    assert!(deep.contains("templates 5 levels deep"), "{deep}");
    // Many ops inside one template count as the definition's own.
    let wide = Dataset::range(1)
        .interleave(
            (0..11).fold(Dataset::range(1), |d, _| d.map("identity")),
            1,
            1,
        )
        .into_def();
    let many = iterate(&wide, &opts).err().unwrap().to_string();
    assert!(
        many.contains("has 12 ops, more than the limit of 10"),
        "{many}"
    );
    // Far past any limit: measured without recursion, refused, no crash.
    let hostile = iterate(&nested(1_000), &ExecOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(hostile.contains("more than the limit"), "{hostile}");
}

#[test]
fn take_while_stops_at_the_first_element_the_predicate_drops() {
    let ints_of = |def: pb::DatasetDef| -> Vec<i64> {
        iterate(&def, &ExecOptions::default())
            .unwrap()
            .map(|e| e.unwrap().as_i64().unwrap())
            .collect()
    };
    let slices = |v: &[i64]| Dataset::from_slices(Tensor::from_i64s(vec![v.len()], v).unwrap());
    assert_eq!(
        ints_of(slices(&[2, 4, 5, 6]).take_while("is_even").into_def()),
        [2, 4]
    );
    assert_eq!(
        ints_of(slices(&[1, 2]).take_while("is_even").into_def()),
        [] as [i64; 0]
    );
    assert_eq!(
        ints_of(slices(&[2, 4]).take_while("is_even").into_def()),
        [2, 4]
    );
    // An infinite input ends too.
    assert_eq!(
        ints_of(
            slices(&[0, 2, 3])
                .repeat_forever()
                .take_while("is_even")
                .into_def()
        ),
        [0, 2]
    );
    let unknown = iterate(
        &Dataset::range(3).take_while("nope").into_def(),
        &ExecOptions::default(),
    )
    .err()
    .unwrap();
    assert!(unknown.to_string().contains("nope"));
}

fn json_rows(def: &pb::DatasetDef) -> Vec<String> {
    iterate(def, &ExecOptions::default())
        .unwrap()
        .map(|e| match e {
            Ok(e) => e.to_json().to_string(),
            Err(err) => format!("error: {err}"),
        })
        .collect()
}

fn int_slices(v: &[i64]) -> Dataset {
    Dataset::from_slices(Tensor::from_i64s(vec![v.len()], v).unwrap())
}

#[test]
fn group_by_window_reduces_full_windows_as_they_fill_and_the_rest_in_key_order() {
    let batch = |n| Dataset::element_window().batch(n);
    let cases: Vec<(Dataset, Vec<&str>)> = vec![
        (
            int_slices(&[1, 2, 1, 3, 2, 1, 1, 3]).group_by_window("identity", 2, batch(2)),
            vec!["[1,1]", "[2,2]", "[1,1]", "[3,3]"],
        ),
        // Groups left at the end: smallest key first, as tf.data's ordered map of groups.
        (
            int_slices(&[5, 1, 5, 2, 1]).group_by_window("identity", 3, batch(3)),
            vec!["[1,1]", "[2]", "[5,5]"],
        ),
        // The reduce template takes any ops; its dataset may have several elements.
        (
            int_slices(&[2, 3, 2, 3]).group_by_window(
                "identity",
                2,
                Dataset::element_window().map("square").take(1),
            ),
            vec!["4", "9"],
        ),
        (
            int_slices(&[4, 4, 4, 7]).group_by_window("identity", 1, batch(5)),
            vec!["[4]", "[4]", "[4]", "[7]"],
        ),
    ];
    for (ds, want) in cases {
        assert_eq!(json_rows(&ds.clone().into_def()), want, "{ds}");
    }
}

#[test]
fn group_by_window_checks_its_key_and_window_size_with_tf_data_texts() {
    let floats = Dataset::from_slices(Tensor::from_f64s(vec![1], &[1.5]).unwrap()).group_by_window(
        "identity",
        2,
        Dataset::element_window(),
    );
    assert_eq!(
        json_rows(&floats.into_def()),
        ["error: `key_func` must return a single tf.int64 scalar tensor."]
    );
    let err = iterate(
        &int_slices(&[1])
            .group_by_window("identity", 0, Dataset::element_window())
            .into_def(),
        &ExecOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("Either the `window_size` argument or the `window_size_func` argument must be specified."),
        "{err}"
    );
    let err = iterate(
        &int_slices(&[1])
            .group_by_window("identity", 2, Dataset::element_lines())
            .into_def(),
        &ExecOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("reduce template must start from its window"),
        "{err}"
    );
    // A window source anywhere else is refused.
    let err = iterate(
        &int_slices(&[1])
            .interleave(Dataset::element_window(), 1, 1)
            .into_def(),
        &ExecOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("only valid in group_by_window's reduce template"),
        "{err}"
    );
}

#[test]
fn a_reduce_template_counts_against_the_pipeline_limits() {
    let opts = ExecOptions {
        limits: PipelineLimits {
            max_ops: 5,
            max_depth: 4,
        },
        ..Default::default()
    };
    let reduce = (0..5).fold(Dataset::element_window(), |d, _| d.map("identity"));
    let err = iterate(
        &int_slices(&[1])
            .group_by_window("identity", 1, reduce)
            .into_def(),
        &opts,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("has 6 ops, more than the limit of 5"), "{err}");
}

#[test]
fn a_parallel_interleave_holds_its_queued_elements_against_the_memory_budget() {
    // Two inner datasets of 20 elements of 100 int64s (800 bytes) each.
    let outer = Dataset::from_slices(Tensor::from_i64s(vec![2, 20, 100], &[7; 4000]).unwrap());
    let budget = crate::memory_budget::MemoryBudget::new(4_000, "--memory-budget");
    let opts = ExecOptions {
        memory: Some(budget.share("the test's pipeline")),
        ..Default::default()
    };
    // Read one after another nothing is held: every element comes through.
    let sequential = outer
        .clone()
        .interleave(Dataset::element_slices(), 2, 1)
        .into_def();
    assert_eq!(iterate(&sequential, &opts).unwrap().count(), 40);
    // Read ahead, the queues pass the budget: an error, not unbounded memory.
    let parallel = outer
        .parallel_interleave(Dataset::element_slices(), 2, 1, 0)
        .into_def();
    let errors: Vec<String> = iterate(&parallel, &opts)
        .unwrap()
        .filter_map(|e| e.err().map(|e| e.to_string()))
        .collect();
    assert!(
        errors.iter().any(|e| e.starts_with("interleave needs")),
        "{errors:?}"
    );
    assert_eq!(budget.used(), 0, "every queued byte is given back");
}

#[test]
fn nested_parallel_interleaves_start_a_bounded_number_of_threads() {
    use crate::ops::interleave::{reader_threads, MAX_READER_THREADS};
    // Unbounded, 128 readers at each level would start 128 * 128 threads.
    let inner = Dataset::range(64).parallel_interleave(Dataset::range(2), 64, 1, 0);
    let def = Dataset::range(64)
        .parallel_interleave(inner, 64, 1, 0)
        .into_def();
    let mut count = 0usize;
    let mut most = 0;
    for e in iterate(&def, &ExecOptions::default()).unwrap() {
        e.unwrap();
        count += 1;
        most = most.max(reader_threads());
    }
    assert_eq!(count, 64 * 64 * 2);
    assert!(most <= MAX_READER_THREADS, "{most} reading threads");
    assert!(
        most > 64,
        "the interleaves read in parallel ({most} threads)"
    );
}
