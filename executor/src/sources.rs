//! `Source`: a definition's source resolved for execution (range, slices, files), iterated either
//! whole or split by split.
//!
//! Splits: split `i` of a range or slices source is element `i`; of a files source, file `i`
//! (all its lines or records). In distributed_epoch mode `SplitIter` asks the `SplitSupplier` for
//! split indices and yields only their content: the dispatcher hands each index out at most once,
//! and the worker recomputes the content from the definition and the index.
//!
//! A files source reads its next files ahead of use (`FILES_AHEAD`): in distributed_epoch mode
//! it asks the supplier for the next splits before the current one ends, and starts their
//! objects' streams (`file_elements_started`), so that an object's first bytes are there when
//! its turn comes instead of one round trip to the store per file. Splits are still asked for,
//! and yielded, in the same order as one at a time, and anything that fails a file surfaces at
//! its turn.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sluice_element::{pb, Cancellation, DatasetError, Element, OriginCell, Tensor};
use sluice_formats::{file_elements_started, FileAccess};
use sluice_pipeline::source_rules::{not_expanded, range_len, Reading};
use sluice_pipeline::Slices;

use crate::splits::SplitSupplier;
use sluice_element::ElementIter;

/// Files a files source keeps started ahead of the one it reads (their splits asked for, their
/// objects' streams requested). Enough to cover a store's first-byte latency (tens of
/// milliseconds) with the reading of the files before, while memory stays bounded: each started
/// object holds at most its stream's read-ahead (`objstore`'s 64 chunks, a few MiB), and a task
/// that stops early leaves at most this many splits asked for and unread. Sources whose split
/// opens nothing (names, ranges, slices) read no split ahead.
pub(crate) const FILES_AHEAD: usize = 4;

/// A source ready to produce elements.
#[derive(Debug)]
pub(crate) enum Source {
    Range {
        start: i64,
        step: i64,
        len: u64,
    },
    Slices(Slices),
    Files {
        files: Vec<String>,
        reading: Reading,
        /// Checked again before each file is opened (a worker's own data roots).
        access: FileAccess,
        /// The file and record of the element yielded last (see `OriginCell`).
        origin: OriginCell,
    },
    /// `Dataset.random`: SplitMix64 draws from the seed (a fresh random seed per iteration
    /// when none is given), as int64 scalars without end. No splits.
    Random {
        seed: Option<u64>,
    },
    /// `from_tensors`: one element, one split.
    Tensors(Element),
}

impl Source {
    /// Resolves the source of `def`. A files source must already be expanded; its files are
    /// opened as `access` allows.
    pub(crate) fn from_def(
        def: &pb::DatasetDef,
        access: &FileAccess,
    ) -> Result<Source, DatasetError> {
        match def.source.as_ref().and_then(|s| s.kind.as_ref()) {
            None => Err(DatasetError::invalid("dataset definition has no source")),
            Some(pb::source::Kind::Range(r)) => {
                if r.step == 0 {
                    return Err(DatasetError::invalid("range step must not be zero"));
                }
                Ok(Source::Range {
                    start: r.start,
                    step: r.step,
                    len: range_len(r.start, r.stop, r.step),
                })
            }
            Some(pb::source::Kind::Slices(s)) => Ok(Source::Slices(Slices::from_proto(s)?)),
            Some(pb::source::Kind::Files(fs)) => {
                if fs.files.is_empty() {
                    return Err(not_expanded(fs));
                }
                Ok(Source::Files {
                    files: fs.files.clone(),
                    reading: Reading::from_proto(fs)?,
                    access: access.clone(),
                    origin: OriginCell::default(),
                })
            }
            Some(pb::source::Kind::Element(_)) => Err(DatasetError::invalid(
                "an element source is only valid as the source of a template (interleave, group_by_window)",
            )),
            Some(pb::source::Kind::Random(r)) => Ok(Source::Random { seed: r.seed }),
            Some(pb::source::Kind::Tensors(t)) => {
                Ok(Source::Tensors(sluice_pipeline::tensors_value(t)?))
            }
            Some(_) => Err(DatasetError::invalid(
                "internal: a zip, sample or choose source is not a leaf source",
            )),
        }
    }

    /// The cell a files source writes each element's origin to; `None` for other sources.
    pub(crate) fn origin(&self) -> Option<&OriginCell> {
        match self {
            Source::Files { origin, .. } => Some(origin),
            Source::Range { .. }
            | Source::Slices(_)
            | Source::Random { .. }
            | Source::Tensors(_) => None,
        }
    }

    /// Whether split `i` is exactly element `i` (range, slices), so that a split index is the
    /// element's position in the source.
    pub(crate) fn split_is_one_element(&self) -> bool {
        match self {
            Source::Range { .. } | Source::Slices(_) | Source::Tensors(_) => true,
            Source::Files { .. } | Source::Random { .. } => false,
        }
    }

    /// How many splits after the current one to keep started (see `FILES_AHEAD`).
    fn splits_ahead(&self) -> usize {
        match self {
            Source::Files { reading, .. } if *reading != Reading::Names => FILES_AHEAD,
            Source::Files { .. }
            | Source::Range { .. }
            | Source::Slices(_)
            | Source::Random { .. }
            | Source::Tensors(_) => 0,
        }
    }

    pub(crate) fn num_splits(&self) -> u64 {
        match self {
            Source::Range { len, .. } => *len,
            Source::Slices(s) => s.len() as u64,
            Source::Files { files, .. } => files.len() as u64,
            Source::Random { .. } => 0,
            Source::Tensors(_) => 1,
        }
    }

    /// Every element, in order.
    pub(crate) fn iter_all(&self) -> ElementIter {
        match self {
            Source::Range { start, step, len } => {
                let (start, step) = (*start, *step);
                Box::new((0..*len).map(move |i| Ok(range_element(start, step, i))))
            }
            Source::Slices(s) => {
                let s = s.clone();
                Box::new((0..s.len()).map(move |i| s.row(i)))
            }
            Source::Files {
                files,
                reading,
                access,
                origin,
            } => {
                let (reading, access, origin) = (*reading, access.clone(), origin.clone());
                let started = files
                    .clone()
                    .into_iter()
                    .map(move |f| file_elements_started(f, reading, &access, &origin));
                Box::new(Ahead::new(started, self.splits_ahead()).flatten())
            }
            Source::Random { seed } => {
                let mut state = seed.unwrap_or_else(rand::random);
                Box::new(std::iter::from_fn(move || {
                    Some(Ok(Element::Tensor(Tensor::scalar_i64(
                        splitmix64(&mut state) as i64,
                    ))))
                }))
            }
            Source::Tensors(e) => Box::new(std::iter::once(Ok(e.clone()))),
        }
    }

    /// The content of split `index` (a file's object stream started now: see
    /// `file_elements_started`).
    pub(crate) fn split(&self, index: u64) -> Result<ElementIter, DatasetError> {
        let n = self.num_splits();
        if index >= n {
            return Err(DatasetError::invalid(format!(
                "split index {index} is out of range for {n} splits"
            )));
        }
        Ok(match self {
            Source::Range { start, step, .. } => {
                Box::new(std::iter::once(Ok(range_element(*start, *step, index))))
            }
            Source::Slices(s) => Box::new(std::iter::once(s.row(index as usize))),
            Source::Files {
                files,
                reading,
                access,
                origin,
            } => file_elements_started(files[index as usize].clone(), *reading, access, origin),
            Source::Random { .. } => return Err(sluice_pipeline::no_random_splits()),
            Source::Tensors(e) => Box::new(std::iter::once(Ok(e.clone()))),
        })
    }
}

/// Inlined into the range source's closure: called out of line, its element is returned through
/// the stack in 8-byte stores and read back in 16-byte loads, which stalls each element (measured:
/// the local executor's `range` ran at half its rate).
#[inline(always)]
fn range_element(start: i64, step: i64, i: u64) -> Element {
    // Within range by construction: i < len, so the value lies between start and stop.
    let v = start as i128 + i as i128 * step as i128;
    Element::Tensor(Tensor::scalar_i64(v as i64))
}

/// What a pipeline's source asked its provider for in distributed_epoch mode, and the splits it
/// received, over all its repetitions: `repeat` reads them to tell a pass that got no split
/// (the repetition's splits all went to other workers) from one whose splits yielded nothing.
#[derive(Clone, Debug, Default)]
pub(crate) struct SplitCount(Arc<[AtomicU64; 2]>);

impl SplitCount {
    /// Splits received.
    pub(crate) fn get(&self) -> u64 {
        self.0[0].load(Ordering::Relaxed)
    }

    /// Splits asked for (each answered with a split or the end of a repetition's splits).
    pub(crate) fn asked(&self) -> u64 {
        self.0[1].load(Ordering::Relaxed)
    }

    fn add_one(&self) {
        self.0[0].fetch_add(1, Ordering::Relaxed);
    }

    fn ask(&self) {
        self.0[1].fetch_add(1, Ordering::Relaxed);
    }
}

/// Yields the content of the splits a `SplitSupplier` hands out for one repetition of one
/// provider, keeping the source's next splits started ahead (`Source::splits_ahead`): at each
/// split's end it asks for splits until that many wait after the next one, in order, and each is
/// yielded in its turn. An error (the supplier's, or a split's) ends the iterator at its turn,
/// after the splits before it.
pub(crate) struct SplitIter {
    source: Arc<Source>,
    supplier: Arc<dyn SplitSupplier>,
    /// The source's split provider (its place in `sluice_pipeline::split_providers`).
    provider: u32,
    repetition: u64,
    /// Counts each split received.
    received: SplitCount,
    /// Wrap each element as `(split index, element)`, for `enumerate` in distributed_epoch
    /// mode (see `executor.rs`). Only for sources whose split is one element.
    with_index: bool,
    current: Option<ElementIter>,
    /// Splits received and started, not yet read, in the order received; an error takes the
    /// place of the split it stopped.
    ahead: VecDeque<Result<ElementIter, DatasetError>>,
    /// The supplier answered with the end of the splits or an error: nothing more is asked.
    asked_all: bool,
    done: bool,
    /// Checked before each split is read: many empty splits in a row yield nothing.
    cancel: Cancellation,
}

impl SplitIter {
    pub(crate) fn new(
        source: Arc<Source>,
        supplier: Arc<dyn SplitSupplier>,
        provider: u32,
        repetition: u64,
        received: SplitCount,
        with_index: bool,
        cancel: Cancellation,
    ) -> Self {
        SplitIter {
            source,
            supplier,
            provider,
            repetition,
            received,
            with_index,
            current: None,
            ahead: VecDeque::new(),
            asked_all: false,
            done: false,
            cancel,
        }
    }

    /// Asks the supplier for one split and starts it; `None` at the end of the splits. After
    /// the end or an error, nothing more is asked.
    fn ask(&mut self) -> Option<Result<ElementIter, DatasetError>> {
        if self.asked_all {
            return None;
        }
        self.received.ask();
        let split = match self.supplier.next_split(self.provider, self.repetition) {
            Ok(Some(index)) => {
                self.received.add_one();
                self.content(index)
            }
            Ok(None) => {
                self.asked_all = true;
                return None;
            }
            Err(e) => Err(e),
        };
        if split.is_err() {
            self.asked_all = true;
        }
        Some(split)
    }

    /// The content of split `index`, started.
    fn content(&self, index: u64) -> Result<ElementIter, DatasetError> {
        let it = self.source.split(index)?;
        if !self.with_index {
            return Ok(it);
        }
        let index = Element::Tensor(Tensor::scalar_i64(index as i64));
        Ok(Box::new(it.map(move |r| {
            r.map(|e| Element::Tuple(vec![index.clone(), e]))
        })))
    }

    /// Ends the iterator: the splits started ahead are dropped (their streams stop).
    fn finish(&mut self) {
        self.done = true;
        self.current = None;
        self.ahead.clear();
    }
}

impl Iterator for SplitIter {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(cur) = self.current.as_mut() {
                match cur.next() {
                    Some(item) => return Some(item),
                    None => self.current = None,
                }
            }
            if self.done {
                return None;
            }
            if let Err(e) = self.cancel.check() {
                self.finish();
                return Some(Err(e));
            }
            // The next split, and the source's splits ahead after it. A source that reads none
            // ahead (a range's or slices' split is one element) asks for each at its turn,
            // without the queue.
            let ahead = self.source.splits_ahead();
            let next = if ahead == 0 && self.ahead.is_empty() {
                self.ask()
            } else {
                while !self.asked_all && self.ahead.len() <= ahead {
                    if let Some(split) = self.ask() {
                        self.ahead.push_back(split);
                    }
                }
                self.ahead.pop_front()
            };
            match next {
                Some(Ok(it)) => self.current = Some(it),
                Some(Err(e)) => {
                    self.finish();
                    return Some(Err(e));
                }
                None => {
                    self.finish();
                    return None;
                }
            }
        }
    }
}

/// `inner`'s items, each taken from `inner` `ahead` items before it is yielded: a files source's
/// next files (`file_elements_started`), started while the one before is read.
struct Ahead<I: Iterator> {
    inner: I,
    ahead: usize,
    taken: VecDeque<I::Item>,
}

impl<I: Iterator> Ahead<I> {
    fn new(inner: I, ahead: usize) -> Self {
        Ahead {
            inner,
            ahead,
            taken: VecDeque::new(),
        }
    }
}

impl<I: Iterator> Iterator for Ahead<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        while self.taken.len() <= self.ahead {
            match self.inner.next() {
                Some(item) => self.taken.push_back(item),
                None => break,
            }
        }
        self.taken.pop_front()
    }
}

/// One step of SplitMix64 (Steele, Lea and Flood): a fixed, well-mixed stream per seed,
/// independent of any crate's version.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
#[path = "sources_tests.rs"]
mod tests;
