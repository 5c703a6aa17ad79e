//! `CrossTrainerCache`: one task's elements shared by several trainers (tf.data's
//! `CrossTrainerCache` behind its `CachingTaskRunner`).
//!
//! Trainers reading the same named job with the cache enabled do not split the task's elements
//! between them: each trainer (by trainer id) reads the task's sequence on its own, from a
//! sliding window of recent elements kept in memory. The window holds at most `max_bytes` of
//! encoded elements; each trainer has a cursor (an absolute element index) and reads from
//! `max(cursor, window start)`, so a trainer that fell behind the window silently skips the
//! evicted elements. A trainer at the window's end pulls the next element from the task's
//! buffer and appends it, evicting from the front while the budget would be exceeded; one
//! trainer extends the window at a time, the others wait for it and then read what it added.
//! Readers sharing a trainer id share one cursor, so between them no element is read twice.
//!
//! The task's input must be infinite: its end (or its failure) is an error for every later read.
//! A task stopped on purpose (deleted, or its worker shutting down) also closes the input, which
//! is then not an end of sequence: readers are told the task stopped, and retry elsewhere.
//! Nothing here is replicated: a restarted worker starts the task, and its window, from scratch.
//!
//! The window's bytes are also held against the worker's memory budget (`held`), shared with
//! every other task's buffering ops: an element the budget has no room for is an error for the
//! trainer that pulled it (a `ResourceExhausted` naming the cache and the budget), as an
//! element larger than the window is.

use crate::task_buffer::{contiguous, Taken, TaskBuffer};
use crate::task_failure::TaskFailure;
use bytes::Bytes;
use sluice_executor::Reservation;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// tf.data's default budget per task (`kDefaultCrossTrainerCacheSizeBytes`).
pub const DEFAULT_CACHE_SIZE_BYTES: u64 = 10 << 30;

pub const EMPTY_TRAINER_ID: &str =
    "tf.data service cross-trainer cache requires a non-empty trainer ID.";

const END_OF_SEQUENCE: &str = "Cross-trainer caching requires the input dataset to be infinite. \
                               However, it reached the end of sequence.";

/// Why a trainer gets no element.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// The read failed, with tf.data's message (the reader's epoch fails).
    #[error("{0}")]
    Failed(TaskFailure),
    /// The task was stopped (deleted, or the worker is shutting down): not the input's end.
    #[error("the task was stopped")]
    Stopped,
}

pub type CacheResult = Result<Bytes, CacheError>;

/// What the window takes from one `Taken` of at most one element: the element in one piece,
/// or why there is none.
fn next_of(taken: Taken) -> Result<Bytes, CacheError> {
    match taken {
        Taken::Elements(elements, _) => Ok(contiguous(
            elements
                .encoded()
                .next()
                .expect("a take of one returns one element"),
        )),
        Taken::End => Err(CacheError::Failed(END_OF_SEQUENCE.into())),
        Taken::Error(error) => Err(CacheError::Failed(error)),
        Taken::Stopped => Err(CacheError::Stopped),
    }
}

pub struct CrossTrainerCache {
    max_bytes: u64,
    /// The window's bytes, against the worker's memory budget.
    held: Reservation,
    /// The task's buffer, filled by its pipeline thread.
    input: Arc<TaskBuffer>,
    /// A std mutex, never held across an `.await`: waiting for the input happens outside it.
    window: Mutex<Window>,
    /// Held by the one reader extending the window (a tokio mutex: held while it waits for the
    /// input), so concurrent trainers at the end do not each consume an element.
    extending: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Window {
    elements: VecDeque<Bytes>,
    /// Absolute index (in the task's sequence) of `elements[0]`.
    start: u64,
    bytes: u64,
    /// Next absolute index per trainer id.
    cursors: HashMap<String, u64>,
    /// The input ended, failed or was stopped: every later read past the window gets this.
    error: Option<CacheError>,
}

impl CrossTrainerCache {
    pub fn new(max_bytes: u64, input: Arc<TaskBuffer>, held: Reservation) -> CrossTrainerCache {
        CrossTrainerCache {
            max_bytes,
            held,
            input,
            window: Mutex::new(Window::default()),
            extending: tokio::sync::Mutex::new(()),
        }
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().expect("cache window lock poisoned")
    }

    /// The next element for `trainer`, waiting for the task when the trainer is at the end of
    /// the window. Cancel-safe: a dropped call consumes nothing.
    pub async fn get(&self, trainer: &str) -> CacheResult {
        if trainer.is_empty() {
            return Err(CacheError::Failed(EMPTY_TRAINER_ID.into()));
        }
        loop {
            if let Some(ready) = self.take_ready(trainer) {
                return ready;
            }
            let _extending = self.extending.lock().await;
            // Another trainer may have extended the window while this one waited for the lock.
            if let Some(ready) = self.take_ready(trainer) {
                return ready;
            }
            let next = next_of(self.input.take(1).await);
            self.append(next)?;
        }
    }

    /// Like [`CrossTrainerCache::get`] without waiting: `None` when the trainer is at the end of
    /// the window and the task has no element ready (or another trainer is extending).
    pub fn try_get(&self, trainer: &str) -> Option<CacheResult> {
        if trainer.is_empty() {
            return Some(Err(CacheError::Failed(EMPTY_TRAINER_ID.into())));
        }
        if let Some(ready) = self.take_ready(trainer) {
            return Some(ready);
        }
        let _extending = self.extending.try_lock().ok()?;
        if let Some(ready) = self.take_ready(trainer) {
            return Some(ready);
        }
        let next = next_of(self.input.try_take(1)?);
        if let Err(e) = self.append(next) {
            return Some(Err(e));
        }
        self.take_ready(trainer)
    }

    /// The trainer's next element if the window holds it; past the window's end, the input's
    /// recorded end or failure.
    fn take_ready(&self, trainer: &str) -> Option<CacheResult> {
        let mut window = self.window();
        let start = window.start;
        let index = window
            .cursors
            .get(trainer)
            .map_or(start, |c| (*c).max(start));
        let Some(element) = window.elements.get((index - start) as usize).cloned() else {
            return window.error.clone().map(Err);
        };
        match window.cursors.get_mut(trainer) {
            Some(cursor) => *cursor = index + 1,
            None => {
                window.cursors.insert(trainer.to_string(), index + 1);
            }
        }
        Some(Ok(element))
    }

    /// Appends what the task produced (`None`: its end). An element larger than the whole
    /// budget is an error for this caller only, as in tf.data; the input's end or failure is
    /// recorded for everyone.
    fn append(&self, next: Result<Bytes, CacheError>) -> Result<(), CacheError> {
        let mut window = self.window();
        match next {
            Ok(element) => {
                let size = element.len() as u64;
                if size > self.max_bytes {
                    return Err(CacheError::Failed(
                        format!(
                            "tf.data service element size is larger than cache size in bytes. \
                             Got element size: {size} and cache size: {}",
                            self.max_bytes
                        )
                        .into(),
                    ));
                }
                while window.bytes + size > self.max_bytes {
                    let Some(evicted) = window.elements.pop_front() else {
                        break;
                    };
                    window.bytes -= evicted.len() as u64;
                    window.start += 1;
                    self.held.shrink(evicted.len() as u64);
                }
                self.held
                    .grow(size)
                    .map_err(|e| CacheError::Failed(e.into()))?;
                window.bytes += size;
                window.elements.push_back(element);
            }
            Err(error) => window.error = Some(error),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task_buffer::Producer;
    use sluice_executor::MemoryBudget;

    fn new_cache(max_bytes: u64, input: Arc<TaskBuffer>) -> CrossTrainerCache {
        CrossTrainerCache::new(
            max_bytes,
            input,
            Reservation::new(None, "cross-trainer cache"),
        )
    }

    fn failed(message: &str) -> CacheResult {
        Err(CacheError::Failed(message.into()))
    }

    /// An infinite-looking input holding `0..n`, each element `size` bytes long: never
    /// finished, it never ends while its producer lives.
    fn input(n: u8, size: usize) -> (Producer, Arc<TaskBuffer>) {
        let (mut tx, buffer) = buffer();
        for v in 0..n {
            assert!(tx.push(&vec![v; size], Bytes::new()));
        }
        (tx, buffer)
    }

    fn buffer() -> (Producer, Arc<TaskBuffer>) {
        TaskBuffer::channel(1024, usize::MAX)
    }

    async fn read(cache: &CrossTrainerCache, trainer: &str, k: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..k {
            out.push(cache.get(trainer).await.expect("an element")[0]);
        }
        out
    }

    #[tokio::test]
    async fn trainers_read_the_same_sequence_and_one_trainer_id_shares_a_cursor() {
        let (_tx, rx) = input(20, 1);
        let cache = new_cache(1 << 20, rx);
        assert_eq!(read(&cache, "a", 5).await, vec![0, 1, 2, 3, 4]);
        assert_eq!(read(&cache, "b", 7).await, vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(read(&cache, "a", 3).await, vec![5, 6, 7]);
        // A second reader of trainer "b" continues where the first stopped.
        assert_eq!(read(&cache, "b", 2).await, vec![7, 8]);
    }

    #[tokio::test]
    async fn a_trainer_behind_the_window_skips_evicted_elements() {
        // Room for three 10-byte elements.
        let (_tx, rx) = input(20, 10);
        let cache = new_cache(35, rx);
        assert_eq!(read(&cache, "fast", 10).await, (0..10).collect::<Vec<_>>());
        assert_eq!(read(&cache, "slow", 4).await, vec![7, 8, 9, 10]);
        assert_eq!(read(&cache, "fast", 1).await, vec![10]);
    }

    #[tokio::test]
    async fn concurrent_trainers_at_the_end_consume_one_element() {
        let (mut tx, rx) = buffer();
        let cache = Arc::new(new_cache(1 << 20, rx));
        let readers: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|t| {
                let cache = cache.clone();
                tokio::spawn(async move { cache.get(t).await })
            })
            .collect();
        // On this current-thread runtime, yielding runs every reader until it waits at the end
        // of the input.
        tokio::task::yield_now().await;
        assert!(
            readers.iter().all(|r| !r.is_finished()),
            "the trainers wait at the end"
        );
        assert!(tx.push(b"x", Bytes::new()));
        for reader in readers {
            assert_eq!(reader.await.unwrap(), Ok(Bytes::from_static(b"x")));
        }
        assert!(cache.try_get("a").is_none(), "nothing more was produced");
        tx.finish(Ok(()));
    }

    #[tokio::test]
    async fn try_get_never_waits() {
        let (mut tx, rx) = buffer();
        let cache = new_cache(1 << 20, rx);
        assert!(cache.try_get("a").is_none());
        assert!(tx.push(b"1", Bytes::new()));
        assert_eq!(cache.try_get("a"), Some(Ok(Bytes::from_static(b"1"))));
        assert_eq!(cache.try_get("b"), Some(Ok(Bytes::from_static(b"1"))));
        assert!(cache.try_get("b").is_none());
    }

    #[tokio::test]
    async fn errors_have_tf_data_texts() {
        let (_tx, rx) = input(3, 5);
        let cache = new_cache(4, rx);
        assert_eq!(cache.get("").await, failed(EMPTY_TRAINER_ID));
        assert_eq!(
            cache.get("a").await,
            failed(
                "tf.data service element size is larger than cache size in bytes. Got element \
                 size: 5 and cache size: 4"
            )
        );

        let (mut tx, rx) = buffer();
        assert!(tx.push(b"last", Bytes::new()));
        tx.finish(Ok(()));
        let cache = new_cache(100, rx);
        assert_eq!(read(&cache, "a", 1).await, vec![b'l']);
        assert!(cache.get("a").await.is_err());
        // The window still serves what it holds before the end.
        assert_eq!(read(&cache, "b", 1).await, vec![b'l']);
        for trainer in ["a", "b"] {
            assert_eq!(
                cache.get(trainer).await,
                failed(
                    "Cross-trainer caching requires the input dataset to be infinite. However, \
                     it reached the end of sequence."
                )
            );
        }
    }

    #[tokio::test]
    async fn a_stopped_task_is_not_an_end_of_sequence() {
        let (tx, rx) = buffer();
        let cache = new_cache(100, rx.clone());
        rx.close();
        tx.finish(Ok(()));
        assert_eq!(cache.get("a").await, Err(CacheError::Stopped));
    }

    #[tokio::test]
    async fn a_window_past_the_memory_budget_fails_its_trainer_and_gives_its_bytes_back() {
        // The window would hold three 10-byte elements; the budget has room for two.
        let (_tx, rx) = input(20, 10);
        let budget = MemoryBudget::new(25, "--memory-budget");
        let cache = CrossTrainerCache::new(
            35,
            rx,
            Reservation::new(Some(budget.share("task 1")), "cross-trainer cache"),
        );
        assert_eq!(read(&cache, "a", 2).await, vec![0, 1]);
        assert_eq!(
            cache.get("a").await,
            Err(CacheError::Failed(TaskFailure::with_code(
                tonic::Code::ResourceExhausted,
                "cross-trainer cache needs 10 more bytes (it holds 20), more than the memory \
                 budget of 25 bytes has left (20 in use); raise --memory-budget or make the \
                 cross-trainer cache smaller"
                    .into()
            )))
        );
        assert_eq!(budget.used(), 20);
        drop(cache);
        assert_eq!(budget.used(), 0);
    }
}
