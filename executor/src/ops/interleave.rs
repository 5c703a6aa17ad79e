//! `interleave`: each input element becomes an inner dataset, and `cycle_length` of them are read
//! in turn, `block_length` elements from each, in tf.data's order:
//!
//! A cursor walks the cycle's slots. At a slot holding an inner dataset it takes that dataset's
//! next element, and moves to the next slot after `block_length` of them; an exhausted inner
//! dataset empties its slot and the cursor moves on. At an empty slot it opens the next input
//! element's inner dataset there; once the input is exhausted it passes empty slots by, and the
//! interleave ends when no slot holds a dataset.
//!
//! With `num_parallel_calls` the order is the same; what changes is who reads. Each open inner
//! dataset (and a few opened ahead for the slots that empty next) is read by its own thread into
//! a small bounded queue, at most `num_parallel_calls` of them inside the inner dataset's `next`
//! at once, so many files are read concurrently while the cursor takes their elements in the
//! deterministic order. The order depends only on the input's order: the same input gives the
//! same output, which the exactly-once delivery of distributed_epoch relies on. The queued
//! elements are held against the memory budget, as prefetch's are.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Condvar, Mutex};

use sluice_element::{Cancellation, DatasetError, Element, ElementIter};

use crate::memory_budget::{element_bytes, MemoryShare, Reservation};
use crate::ops::prefetch::Prefetched;

/// Makes the inner dataset of one input element.
pub(crate) type MakeInner = Arc<dyn Fn(Element) -> Result<ElementIter, DatasetError> + Send + Sync>;

/// How many elements each reading thread queues ahead of the cursor.
const QUEUE_PER_READER: usize = 16;

/// The most reading threads of all interleaves in the process together. Past it, an inner
/// dataset is read in the interleave's own thread, as without `num_parallel_calls`: nested
/// parallel interleaves (a template holding one) multiply their threads, and a definition must
/// not be able to make a worker start threads without bound.
pub(crate) const MAX_READER_THREADS: usize = 1024;

static READER_THREADS: AtomicUsize = AtomicUsize::new(0);

/// An interleave's settings, resolved.
#[derive(Clone)]
pub(crate) struct InterleaveSpec {
    pub(crate) make: MakeInner,
    pub(crate) cycle_length: usize,
    pub(crate) block_length: usize,
    /// `Some(n)`: read by threads, at most `n` in an inner dataset's `next` at once.
    pub(crate) parallel: Option<usize>,
}

impl InterleaveSpec {
    pub(crate) fn apply(
        &self,
        input: ElementIter,
        memory: &Option<Arc<MemoryShare>>,
        cancel: &Cancellation,
    ) -> ElementIter {
        let cycle_length = self.cycle_length.max(1);
        let readers = self.parallel.map(|n| Readers {
            permits: Arc::new(Permits::new(n.max(1))),
            memory: memory.clone(),
            cancel: cancel.clone(),
            // The open slots, plus as many opened ahead as may be read at once.
            target: cycle_length + n.clamp(1, cycle_length),
        });
        Box::new(Interleave {
            input: Some(input),
            make: self.make.clone(),
            cycle: (0..cycle_length).map(|_| None).collect(),
            block_length: self.block_length.max(1),
            cycle_index: 0,
            block_index: 0,
            num_open: 0,
            ahead: VecDeque::new(),
            readers,
            cancel: cancel.clone(),
        })
    }
}

struct Interleave {
    /// `None` once the input is exhausted.
    input: Option<ElementIter>,
    make: MakeInner,
    cycle: Vec<Option<ElementIter>>,
    block_length: usize,
    cycle_index: usize,
    /// Elements taken from the slot at `cycle_index` in its current block.
    block_index: usize,
    num_open: usize,
    /// Parallel only: the inner datasets of the next input elements, already being read, in
    /// input order (an input error keeps its place).
    ahead: VecDeque<Result<ElementIter, DatasetError>>,
    readers: Option<Readers>,
    cancel: Cancellation,
}

impl Interleave {
    fn advance(&mut self) {
        self.block_index = 0;
        self.cycle_index = (self.cycle_index + 1) % self.cycle.len();
    }

    /// The inner dataset for the next input element: `None` when the input is exhausted, an
    /// error when the input or the inner dataset's creation failed.
    fn next_inner(&mut self) -> Option<Result<ElementIter, DatasetError>> {
        if self.readers.is_some() {
            self.read_ahead();
            return self.ahead.pop_front();
        }
        let input = self.input.as_mut()?;
        match input.next() {
            None => {
                self.input = None;
                None
            }
            Some(Ok(e)) => Some((self.make)(e)),
            Some(Err(err)) => Some(Err(err)),
        }
    }

    /// Parallel: opens the next input elements' inner datasets, each on its reading thread,
    /// until the open slots and those opened ahead reach the target.
    fn read_ahead(&mut self) {
        let Some(readers) = &self.readers else { return };
        while self.num_open + self.ahead.len() < readers.target {
            let Some(input) = self.input.as_mut() else {
                return;
            };
            match input.next() {
                None => {
                    self.input = None;
                    return;
                }
                Some(Ok(e)) => self.ahead.push_back(Ok(readers.open(self.make.clone(), e))),
                Some(Err(err)) => self.ahead.push_back(Err(err)),
            }
        }
    }
}

impl Iterator for Interleave {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Err(e) = self.cancel.check() {
                return Some(Err(e));
            }
            let i = self.cycle_index;
            if let Some(inner) = self.cycle[i].as_mut() {
                match inner.next() {
                    Some(item) => {
                        self.block_index += 1;
                        if self.block_index >= self.block_length {
                            self.advance();
                        }
                        return Some(item);
                    }
                    None => {
                        self.cycle[i] = None;
                        self.num_open -= 1;
                        self.advance();
                    }
                }
            } else if let Some(inner) = self.next_inner() {
                match inner {
                    Ok(inner) => {
                        self.cycle[i] = Some(inner);
                        self.num_open += 1;
                    }
                    // The slot stays empty: going on opens the next element there.
                    Err(err) => return Some(Err(err)),
                }
            } else if self.num_open == 0 {
                return None;
            } else {
                self.advance();
            }
        }
    }
}

/// What the reading threads of one parallel interleave share.
struct Readers {
    permits: Arc<Permits>,
    memory: Option<Arc<MemoryShare>>,
    cancel: Cancellation,
    /// How many inner datasets are kept open or opened ahead.
    target: usize,
}

impl Readers {
    /// Starts reading `element`'s inner dataset on a thread of its own. The thread ends when
    /// the dataset does, or when the returned iterator is dropped (its next send fails).
    fn open(&self, make: MakeInner, element: Element) -> ElementIter {
        if READER_THREADS.fetch_add(1, Ordering::SeqCst) >= MAX_READER_THREADS {
            READER_THREADS.fetch_sub(1, Ordering::SeqCst);
            return match make(element) {
                Ok(inner) => inner,
                Err(err) => Box::new(std::iter::once(Err(err))),
            };
        }
        let (tx, rx) = sync_channel(QUEUE_PER_READER);
        let held = Arc::new(Reservation::new(self.memory.clone(), "interleave"));
        let (permits, cancel, producer_held) =
            (self.permits.clone(), self.cancel.clone(), held.clone());
        // Kept to read inline if no thread can be started (an element's tensors are shared).
        let (inline_make, inline_element) = (make.clone(), element.clone());
        // Counted out when the thread ends, however it ends, or when it cannot start (the
        // closure is dropped then).
        let counted = CountedThread;
        let read = move || {
            let _counted = counted;
            let mut inner = match permits.run(|| make(element)) {
                Ok(inner) => inner,
                Err(err) => {
                    let _ = tx.send(Err(err));
                    return;
                }
            };
            loop {
                if let Err(e) = cancel.check() {
                    let _ = tx.send(Err(e));
                    return;
                }
                let Some(item) = permits.run(|| inner.next()) else {
                    return;
                };
                // Over the budget: that error is the queue's last item.
                let (item, over_budget) = match item {
                    Ok(e) => match producer_held.grow(element_bytes(&e)) {
                        Ok(()) => (Ok(e), false),
                        Err(over) => (Err(over), true),
                    },
                    Err(e) => (Err(e), false),
                };
                if tx.send(item).is_err() || over_budget {
                    return;
                }
            }
        };
        match std::thread::Builder::new()
            .name("sluice-interleave".to_string())
            .spawn(read)
        {
            Ok(_) => Box::new(Prefetched { rx, held }),
            Err(_) => match inline_make(inline_element) {
                Ok(inner) => inner,
                Err(err) => Box::new(std::iter::once(Err(err))),
            },
        }
    }
}

/// How many reading threads run now, in the whole process.
#[cfg(test)]
pub(crate) fn reader_threads() -> usize {
    READER_THREADS.load(Ordering::SeqCst)
}

/// One reading thread in `READER_THREADS`, counted out when dropped.
struct CountedThread;

impl Drop for CountedThread {
    fn drop(&mut self) {
        READER_THREADS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A counting semaphore: how many reading threads may be inside an inner dataset at once.
struct Permits {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Permits {
    fn new(n: usize) -> Permits {
        Permits {
            free: Mutex::new(n),
            freed: Condvar::new(),
        }
    }

    fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            while *free == 0 {
                free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
            }
            *free -= 1;
        }
        // Given back even if `f` panics.
        struct Release<'a>(&'a Permits);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                self.0.freed.notify_one();
            }
        }
        let _release = Release(self);
        f()
    }
}
