use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::json;
use sluice_element::{Element, Tensor};
use sluice_formats::FileAccess;
use sluice_pipeline::{cardinality, element_spec, validate, Dataset, FunctionRegistry, Transform};

use super::*;
use crate::executor::{iterate, ExecOptions};

fn ints(v: &[i64]) -> Element {
    Element::Tensor(Tensor::from_i64s(vec![v.len()], v).unwrap())
}

fn strings(v: &[&str]) -> Element {
    let v = v
        .iter()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect();
    Element::Tensor(Tensor::from_strings(vec![3], v).unwrap())
}

/// `({"x": [[1, 2], [3, 4], [5, 6]], "y": ["a", "b", "c"]}, [7, 8, 9])`.
fn nested() -> Element {
    let x = Element::Tensor(Tensor::from_i64s(vec![3, 2], &[1, 2, 3, 4, 5, 6]).unwrap());
    let dict = BTreeMap::from([
        ("x".to_string(), x),
        ("y".to_string(), strings(&["a", "b", "c"])),
    ]);
    Element::Tuple(vec![Element::Dict(dict), ints(&[7, 8, 9])])
}

fn rows(d: &Dataset) -> Vec<serde_json::Value> {
    iterate(d.def(), &ExecOptions::default())
        .unwrap()
        .map(|e| e.unwrap().to_json())
        .collect()
}

#[test]
fn a_tuple_and_dict_are_sliced_together_row_by_row() {
    let d = Dataset::from_structured_slices(nested()).unwrap();
    assert_eq!(
        rows(&d),
        vec![
            json!([{"x": [1, 2], "y": "a"}, 7]),
            json!([{"x": [3, 4], "y": "b"}, 8]),
            json!([{"x": [5, 6], "y": "c"}, 9]),
        ]
    );
    assert_eq!(cardinality(d.def()), 3);
    let r = FunctionRegistry::with_builtins();
    validate(d.def(), &r).unwrap();
    assert_eq!(
        element_spec(d.def(), &r).unwrap().to_string(),
        "({'x': TensorSpec(shape=(2,), dtype=int64), 'y': TensorSpec(shape=(), dtype=string)}, \
         TensorSpec(shape=(), dtype=int64))"
    );
}

#[test]
fn ops_apply_to_structured_rows() {
    let d =
        Dataset::from_structured_slices(Element::Tuple(vec![ints(&[1, 2, 3]), ints(&[4, 5, 6])]))
            .unwrap()
            .batch(2);
    assert_eq!(rows(&d), vec![json!([[1, 2], [4, 5]]), json!([[3], [6]])]);
}

#[test]
fn each_split_is_one_structured_row() {
    let d = Dataset::from_structured_slices(nested()).unwrap();
    let source = Source::from_def(d.def(), &FileAccess::Unrestricted).unwrap();
    assert!(source.split_is_one_element());
    assert_eq!(source.num_splits(), 3);
    let split: Vec<_> = source
        .split(1)
        .unwrap()
        .map(|e| e.unwrap().to_json())
        .collect();
    assert_eq!(split, vec![json!([{"x": [3, 4], "y": "b"}, 8])]);
    assert!(source.split(3).is_err());
}

/// Hands out `order` for repetition 0, recording how many elements the reader had taken at each
/// ask; after the splits, `then` (the end, or an error).
struct Recording {
    order: std::sync::Mutex<VecDeque<u64>>,
    then: Option<DatasetError>,
    read: Arc<AtomicU64>,
    asks: std::sync::Mutex<Vec<u64>>,
}

impl Recording {
    fn new(order: &[u64], then: Option<DatasetError>) -> Arc<Recording> {
        Arc::new(Recording {
            order: std::sync::Mutex::new(order.iter().copied().collect()),
            then,
            read: Arc::default(),
            asks: Default::default(),
        })
    }

    fn asks(&self) -> Vec<u64> {
        self.asks.lock().unwrap().clone()
    }
}

impl SplitSupplier for Recording {
    fn next_split(&self, _provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
        assert_eq!(repetition, 0);
        self.asks
            .lock()
            .unwrap()
            .push(self.read.load(Ordering::SeqCst));
        match self.order.lock().unwrap().pop_front() {
            Some(index) => Ok(Some(index)),
            None => self.then.clone().map_or(Ok(None), Err),
        }
    }
}

/// `n` text files of three lines, `file i line j` each, in a temp dir; a name in `missing` is
/// not written.
fn line_files(dir: &std::path::Path, n: usize, missing: &[usize]) -> Vec<String> {
    (0..n)
        .map(|i| {
            let path = dir.join(format!("f{i}.txt"));
            if !missing.contains(&i) {
                std::fs::write(&path, format!("{i}:0\n{i}:1\n{i}:2\n")).unwrap();
            }
            path.to_string_lossy().into_owned()
        })
        .collect()
}

fn lines_source(files: Vec<String>, access: FileAccess) -> Arc<Source> {
    Arc::new(Source::Files {
        files,
        reading: Reading::Lines,
        access,
        origin: OriginCell::default(),
    })
}

/// Reads `source`'s splits from `supplier`, counting the elements taken in `supplier.read`.
fn read_splits(
    source: Arc<Source>,
    supplier: &Arc<Recording>,
    cancel: Cancellation,
    count: &SplitCount,
) -> Vec<Result<String, String>> {
    let it = SplitIter::new(source, supplier.clone(), 0, 0, count.clone(), false, cancel);
    let read = supplier.read.clone();
    it.map(|r| {
        read.fetch_add(1, Ordering::SeqCst);
        r.map(|e| text(&e)).map_err(|e| e.to_string())
    })
    .collect()
}

fn text(e: &Element) -> String {
    e.to_json().as_str().unwrap().to_string()
}

fn lines_of(files: &[u64]) -> Vec<Result<String, String>> {
    files
        .iter()
        .flat_map(|i| (0..3).map(move |j| Ok(format!("{i}:{j}"))))
        .collect()
}

#[test]
fn file_splits_are_asked_for_ahead_and_read_in_the_order_received() {
    let dir = tempfile::tempdir().unwrap();
    let files = line_files(dir.path(), 60, &[]);
    // An order the supplier chose, not the files' own.
    let order: Vec<u64> = (0..60).map(|i| (i * 37) % 60).collect();
    let supplier = Recording::new(&order, None);
    let count = SplitCount::default();
    let got = read_splits(
        lines_source(files, FileAccess::Unrestricted),
        &supplier,
        Cancellation::new(),
        &count,
    );
    assert_eq!(got, lines_of(&order));
    // The first split and the ones ahead of it before any element; then one more at the end of
    // each split (three elements each), and the end asked for while the last ones are read.
    let asks = supplier.asks();
    assert_eq!(asks.len(), 61);
    assert!(
        asks[..=FILES_AHEAD].iter().all(|&read| read == 0),
        "{asks:?}"
    );
    for (k, &read) in asks[FILES_AHEAD + 1..].iter().enumerate() {
        assert_eq!(
            read,
            3 * (k as u64 + 1),
            "ask {} of {asks:?}",
            k + FILES_AHEAD + 1
        );
    }
    assert_eq!((count.get(), count.asked()), (60, 61));
}

#[test]
fn a_plain_files_source_reads_every_file_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let files = line_files(dir.path(), 20, &[]);
    let source = lines_source(files, FileAccess::Unrestricted);
    let got: Vec<_> = source.iter_all().map(|r| Ok(text(&r.unwrap()))).collect();
    assert_eq!(got, lines_of(&(0..20).collect::<Vec<_>>()));
}

#[test]
fn a_file_that_fails_ahead_fails_at_its_turn_with_its_own_error() {
    let dir = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let mut files = line_files(roots.path(), 6, &[2]);
    // Outside the data roots: refused, at its turn.
    files[4] = line_files(dir.path(), 5, &[])[4].clone();
    let access = FileAccess::Roots(sluice_formats::DataRoots::new([roots.path()]).unwrap());
    let error_of = |i: usize| {
        let origin = OriginCell::default();
        let first =
            sluice_formats::file_elements(files[i].clone(), Reading::Lines, &access, &origin)
                .next()
                .unwrap();
        first.unwrap_err().to_string()
    };
    let (missing, refused) = (error_of(2), error_of(4));
    assert!(missing.contains("f2.txt"), "{missing}");
    assert!(refused.contains("f4.txt"), "{refused}");

    // The missing file's turn comes after two files' records, although it was started with them.
    let supplier = Recording::new(&[0, 1, 2, 3], None);
    let got = read_splits(
        lines_source(files.clone(), access.clone()),
        &supplier,
        Cancellation::new(),
        &SplitCount::default(),
    );
    // As one file at a time gives them: the failed file is one error, and the next file follows.
    let mut want = lines_of(&[0, 1]);
    want.push(Err(missing));
    want.extend(lines_of(&[3]));
    assert_eq!(got, want);

    let supplier = Recording::new(&[3, 4, 5], None);
    let got = read_splits(
        lines_source(files.clone(), access.clone()),
        &supplier,
        Cancellation::new(),
        &SplitCount::default(),
    );
    let mut want = lines_of(&[3]);
    want.push(Err(refused.clone()));
    want.extend(lines_of(&[5]));
    assert_eq!(got, want);

    // The plain source too.
    let got: Vec<_> = lines_source(files[3..].to_vec(), access)
        .iter_all()
        .map(|r| r.map(|e| text(&e)).map_err(|e| e.to_string()))
        .collect();
    let mut want = lines_of(&[3]);
    want.push(Err(refused));
    want.extend(lines_of(&[5]));
    assert_eq!(got, want);
}

#[test]
fn a_supplier_error_received_ahead_comes_after_the_splits_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let files = line_files(dir.path(), 4, &[]);
    let failure = DatasetError::Splits {
        retryable: true,
        message: "dispatcher unavailable".into(),
    };
    let supplier = Recording::new(&[1, 0], Some(failure.clone()));
    let count = SplitCount::default();
    let got = read_splits(
        lines_source(files, FileAccess::Unrestricted),
        &supplier,
        Cancellation::new(),
        &count,
    );
    let mut want = lines_of(&[1, 0]);
    want.push(Err(failure.to_string()));
    assert_eq!(got, want);
    // Nothing asked after the error.
    assert_eq!(supplier.asks(), vec![0, 0, 0]);
    assert_eq!((count.get(), count.asked()), (2, 3));
}

#[test]
fn a_cancelled_task_stops_at_the_next_split_and_asks_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let files = line_files(dir.path(), 50, &[]);
    let order: Vec<u64> = (0..50).collect();
    let supplier = Recording::new(&order, None);
    let cancel = Cancellation::new();
    let mut it = SplitIter::new(
        lines_source(files, FileAccess::Unrestricted),
        supplier.clone(),
        0,
        0,
        SplitCount::default(),
        false,
        cancel.clone(),
    );
    for _ in 0..4 {
        it.next().unwrap().unwrap();
    }
    let asked = supplier.asks().len();
    assert_eq!(asked, FILES_AHEAD + 2);
    cancel.cancel();
    // The rest of the split being read, then the cancellation, with the splits ahead dropped.
    let rest: Vec<_> = it.by_ref().collect();
    assert_eq!(rest.len(), 3, "{rest:?}");
    assert!(rest[..2].iter().all(Result::is_ok));
    assert!(matches!(rest[2], Err(DatasetError::Cancelled)), "{rest:?}");
    assert!(it.ahead.is_empty() && it.current.is_none());
    assert!(it.next().is_none());
    assert_eq!(supplier.asks().len(), asked);
}
