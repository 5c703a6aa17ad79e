//! `TaskBuffer`: the bounded buffer between a task's pipeline thread and its readers, handed
//! over in chunks of many elements.
//!
//! Why chunks: with one element per hand-over, every element cost a cross-thread wake-up (the
//! reader woke for each element, the pipeline thread woke for each freed slot), which on this
//! class of machine costs microseconds and capped tiny elements near 0.2 M/s with the CPUs
//! mostly idle. Here the pipeline appends to an open chunk and only a sealed chunk wakes a
//! reader, so wake-ups are per chunk.
//!
//! When a chunk is sealed decides latency: when it is full (`CHUNK_ELEMENTS` or `CHUNK_BYTES`),
//! at once when the pipeline is slow (the gap since its previous element is at least `LINGER`:
//! waiting for the next element would cost more than the hand-over), and once it is `LINGER`
//! old. Because the open chunk is shared, a reader that has waited `LINGER` takes it as it is,
//! so an element waits at most about `LINGER` even when the pipeline blocks right after it (a
//! rule on the pipeline side alone cannot see that: an earlier attempt sealed whenever the
//! buffer was empty, which the fast reader made always, and chunks stayed at one element). The
//! first element of a chunk wakes readers waiting on an empty buffer, so they start that wait.
//!
//! Bounds: at most `max_elements` elements and about `max_bytes` bytes are buffered (a single
//! larger element still goes in alone); the pipeline thread blocks while the buffer is full.
//! The end of the pipeline (or its error) is seen by readers after every buffered element.
//!
//! ## The open chunk without a lock per element
//!
//! At tens of millions of tiny elements a second, a lock and an unlock per element (two atomic
//! read-modify-writes, each waiting for the store buffer to drain) were half of the pipeline
//! thread's time. Readers seldom need the open chunk (once it is `LINGER` old, or to top up a
//! message), so it belongs to the pipeline until a reader takes it back: a biased lock, with
//! the asymmetric Dekker handshake of user-space RCU and Folly's `asymmetricHeavyBarrier`.
//! - The pipeline sets `appending`, then reads `revoked`; only if it is clear does it touch the
//!   open chunk, and then clears `appending`. Between the two there is only a compiler fence.
//! - A reader that wants the open chunk holds the lock, sets `revoked`, issues a process-wide
//!   barrier (`membarrier(2)`: a full fence on every running thread of the process),
//!   then waits while `appending` is set. After the barrier either the reader sees the
//!   pipeline's `appending`, or the pipeline's next read sees `revoked`: the store-then-load
//!   order the fast path leaves out is forced on it by the barrier.
//! - A revoked pipeline appends under the lock, and clears `revoked` there. Only readers set it
//!   and only the pipeline clears it, both under the lock.
//!
//! So the open chunk is touched by the pipeline while it owns it, by the pipeline under the
//! lock, or by a reader under the lock after revoking: never by two threads at once. The one
//! pipeline is a `Producer`, which is not `Clone` and pushes through `&mut self`. Where
//! `membarrier(2)` is missing, both sides fence (see `membarrier`).

use crate::task_failure::TaskFailure;
use bytes::{Bytes, BytesMut};
use sluice_element::{
    encode_element_append, is_compressed, AutoCompression, Compression, Element, Packed,
    PackedBuilder,
};
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Elements per chunk at most.
pub const CHUNK_ELEMENTS: usize = 4096;
/// Bytes per chunk at most (a larger element goes alone).
pub const CHUNK_BYTES: usize = 1 << 20;
/// How long an element may wait in an open chunk for more to join it.
pub const LINGER: Duration = Duration::from_micros(500);
/// Elements with less data than this are encoded straight into the open chunk (see
/// `push_element`).
const ENCODE_IN_PLACE_BELOW: usize = 4096;
/// Elements pushed between two reads of the clock.
const CLOCK_EVERY: usize = 32;

/// The clock lingers are measured on: `Instant::now()`, except in this crate's unit tests, where
/// a test may hold its thread's clock still and move it by hand (`test_clock`), so no test of a
/// linger depends on how fast the machine runs it.
#[cfg(not(test))]
#[inline(always)]
fn now() -> Instant {
    Instant::now()
}

#[cfg(test)]
fn now() -> Instant {
    test_clock::now()
}

/// A clock per test thread, held still once `freeze` is called (until the thread ends).
#[cfg(test)]
pub(crate) mod test_clock {
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    thread_local! {
        static FROZEN: Cell<Option<Instant>> = const { Cell::new(None) };
    }

    /// Holds this thread's clock at the present instant.
    pub fn freeze() {
        FROZEN.set(Some(Instant::now()));
    }

    /// Moves this thread's frozen clock forward.
    pub fn advance(by: Duration) {
        let frozen = FROZEN.get().expect("advance a frozen clock");
        FROZEN.set(Some(frozen + by));
    }

    pub fn now() -> Instant {
        FROZEN.get().unwrap_or_else(Instant::now)
    }
}

/// An element's encoding in one buffer, from its (head, payload) parts (a copy when a large
/// tensor's data travels apart).
pub fn contiguous((head, payload): (Bytes, Bytes)) -> Bytes {
    if payload.is_empty() {
        head
    } else {
        [&head[..], &payload[..]].concat().into()
    }
}

/// What a reader gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// One or more elements, in pipeline order, packed in one buffer, and the number of
    /// elements taken from the buffer before them (by any reader): the first one's position in
    /// the task's output.
    Elements(Packed, u64),
    /// The pipeline reached its end and every element was taken.
    End,
    /// The task was stopped (deleted, or its worker shutting down) and every element was taken:
    /// not an end of sequence, so readers retry and find out what became of the task.
    Stopped,
    /// The pipeline failed after every element before the failure was taken.
    Error(TaskFailure),
}

/// The open chunk: elements are encoded straight into its buffer. Who may touch it when is in
/// the module header.
#[derive(Default)]
struct Open {
    builder: PackedBuilder,
    bytes: usize,
    /// When it got its first element.
    since: Option<Instant>,
}

impl Open {
    fn is_empty(&self) -> bool {
        self.builder.is_empty()
    }

    /// Appends the element `add` puts into the chunk; `true` when the chunk should be sealed.
    fn append(
        &mut self,
        add: impl FnOnce(&mut PackedBuilder) -> usize,
        last_push: &mut Option<Instant>,
    ) -> bool {
        // The clock is read for a chunk's first two elements and every `CLOCK_EVERY` elements
        // after (a clock read per element was a measurable share of a tiny element's cost):
        // enough to see a slow pipeline (whose chunks hold one or two elements) and a chunk past
        // its linger.
        let (mut slow, mut old) = (false, false);
        let len = self.builder.len();
        if len < 2 || len.is_multiple_of(CLOCK_EVERY) {
            let now = now();
            slow = last_push.is_some_and(|last| now.duration_since(last) >= LINGER);
            *last_push = Some(now);
            let since = *self.since.get_or_insert(now);
            old = now.duration_since(since) >= LINGER;
        }
        self.bytes += add(&mut self.builder);
        slow || old || self.builder.len() >= CHUNK_ELEMENTS || self.bytes >= CHUNK_BYTES
    }
}

/// What the lock guards.
#[derive(Default)]
struct Inner {
    sealed: VecDeque<Packed>,
    /// When the open chunk got its first element, `None` while it is empty: readers decide
    /// from this whether to wait for the open chunk, without touching it.
    open_since: Option<Instant>,
    /// `Some` once the pipeline ended: `Ok` at its end, `Err` with its error.
    end: Option<Result<(), TaskFailure>>,
    /// Elements taken so far, by every reader.
    taken: u64,
    /// Pipelines waiting for room, so tests see a push block without guessing how long to wait.
    #[cfg(test)]
    waiting_pushers: usize,
}

pub struct TaskBuffer {
    /// A std mutex: held for a few instructions, never across `.await`.
    inner: Mutex<Inner>,
    /// The open chunk, outside the lock (see the module header).
    open: UnsafeCell<Open>,
    /// The pipeline is touching the open chunk without the lock.
    appending: AtomicBool,
    /// A reader took the open chunk back: the pipeline's next element goes under the lock.
    revoked: AtomicBool,
    /// Readers are gone for good (the task was deleted): the pipeline stops. Set under the lock,
    /// so a pipeline waiting for room cannot miss it.
    closed: AtomicBool,
    /// Elements and bytes in sealed chunks: changed under the lock, read without it by the
    /// pipeline to see whether the buffer is full.
    sealed_elements: AtomicUsize,
    sealed_bytes: AtomicUsize,
    /// The pipeline thread waits here for room.
    room: Condvar,
    /// Readers wait here for a sealed chunk, a first open element, or the end.
    readable: Notify,
    /// A reader on another machine has read from this task: `Auto` compression applies from
    /// then on. Until then elements go uncompressed, since compression only saves a network
    /// that a reader on this machine does not cross (see `reader_elsewhere`).
    reader_elsewhere: AtomicBool,
    max_elements: usize,
    max_bytes: usize,
}

// SAFETY: every field but `open` is `Sync`. `open` is touched by one thread at a time: by the
// one `Producer` while it owns the chunk or holds the lock, by a reader only under the lock
// after `revoke` (module header).
unsafe impl Sync for TaskBuffer {}

impl TaskBuffer {
    /// A buffer and the one producer that fills it.
    pub fn channel(max_elements: usize, max_bytes: usize) -> (Producer, Arc<TaskBuffer>) {
        let buffer = Arc::new(TaskBuffer {
            inner: Mutex::new(Inner::default()),
            open: UnsafeCell::new(Open::default()),
            appending: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            sealed_elements: AtomicUsize::new(0),
            sealed_bytes: AtomicUsize::new(0),
            room: Condvar::new(),
            readable: Notify::new(),
            reader_elsewhere: AtomicBool::new(false),
            max_elements: max_elements.max(1),
            max_bytes: max_bytes.max(1),
        });
        let producer = Producer {
            buffer: buffer.clone(),
            last_push: None,
            auto: AutoCompression::default(),
            finished: false,
        };
        (producer, buffer)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("task buffer lock poisoned")
    }

    /// Elements and bytes in sealed chunks (what readers can take now), read without the lock:
    /// for metrics, not for decisions.
    pub fn sealed_fill(&self) -> (usize, usize) {
        (
            self.sealed_elements.load(Ordering::Relaxed),
            self.sealed_bytes.load(Ordering::Relaxed),
        )
    }

    /// Whether the buffer (its sealed chunks and `open`) has no room for another element.
    fn full(&self, open: &Open) -> bool {
        let elements = self.sealed_elements.load(Ordering::Relaxed) + open.builder.len();
        let bytes = self.sealed_bytes.load(Ordering::Relaxed) + open.bytes;
        elements > 0 && (elements >= self.max_elements || bytes >= self.max_bytes)
    }

    /// Moves the open chunk, if it has elements, to the back of the sealed ones.
    fn seal(&self, inner: &mut Inner, open: &mut Open) {
        if open.is_empty() {
            return;
        }
        let chunk = open.builder.finish();
        self.sealed_elements
            .fetch_add(chunk.len(), Ordering::Relaxed);
        self.sealed_bytes.fetch_add(open.bytes, Ordering::Relaxed);
        inner.sealed.push_back(chunk);
        open.bytes = 0;
        open.since = None;
        inner.open_since = None;
    }

    /// Takes up to `max` elements of the oldest sealed chunk (the rest stays in front), with
    /// the number of elements taken before them.
    fn take_sealed(&self, inner: &mut Inner, max: usize) -> Option<(Packed, u64)> {
        let chunk = inner.sealed.front_mut()?;
        let taken = if chunk.len() <= max {
            inner.sealed.pop_front().expect("a front chunk")
        } else {
            chunk.split_to(max)
        };
        self.sealed_elements
            .fetch_sub(taken.len(), Ordering::Relaxed);
        self.sealed_bytes
            .fetch_sub(taken.byte_len(), Ordering::Relaxed);
        let first = inner.taken;
        inner.taken += taken.len() as u64;
        Some((taken, first))
    }

    /// A reader takes the open chunk back from the pipeline (the handshake in the module
    /// header). The lock, held through `guard`, keeps out the pipeline's locked path and other
    /// readers.
    fn revoke<'a>(&'a self, guard: &'a mut MutexGuard<'_, Inner>) -> (&'a mut Inner, &'a mut Open) {
        // Already set: a reader issued the barrier after setting it, and only the pipeline
        // clears it, under the lock this reader holds.
        if !self.revoked.load(Ordering::Relaxed) {
            self.revoked.store(true, Ordering::Relaxed);
            crate::membarrier::heavy();
        }
        // The pipeline is mid-append (a few instructions), or saw `revoked` and is leaving.
        let mut spins = 0u32;
        while self.appending.load(Ordering::Acquire) {
            if spins < 100 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: the pipeline's fast path sees `revoked` before it touches the chunk, or its
        // append is complete (the `Acquire` load above read its `Release` store); its locked
        // path and every other reader wait for the lock held through `guard`.
        let open = unsafe { &mut *self.open.get() };
        (&mut **guard, open)
    }

    /// Pipelines blocked waiting for room.
    #[cfg(test)]
    fn waiting_pushers(&self) -> usize {
        self.lock().waiting_pushers
    }

    /// Every reader is gone for good: the pipeline thread stops at its next element.
    pub fn close(&self) {
        let _inner = self.lock();
        self.closed.store(true, Ordering::Relaxed);
        self.room.notify_all();
    }

    /// Up to `max` (at least 1) elements without waiting: a sealed chunk, or the open one when
    /// `open_too`; `None` when there is nothing to take yet.
    fn try_take_locked(
        &self,
        guard: &mut MutexGuard<'_, Inner>,
        max: usize,
        open_too: bool,
    ) -> Option<Taken> {
        if let Some((elements, first)) = self.take_sealed(guard, max) {
            self.room.notify_one();
            return Some(Taken::Elements(elements, first));
        }
        // The pipeline seals what is open before it records its end, so an open chunk means
        // the pipeline is still going.
        if open_too && guard.open_since.is_some() {
            let (inner, open) = self.revoke(guard);
            self.seal(inner, open);
            let (elements, first) = self.take_sealed(inner, max).expect("just sealed");
            self.room.notify_one();
            return Some(Taken::Elements(elements, first));
        }
        match &guard.end {
            Some(Ok(())) if self.closed.load(Ordering::Relaxed) => Some(Taken::Stopped),
            Some(Ok(())) => Some(Taken::End),
            Some(Err(error)) => Some(Taken::Error(error.clone())),
            None => None,
        }
    }

    /// A reader on another machine reads this task: the pipeline compresses what it pushes from
    /// now on, if the dataset asks for `Auto` compression. Elements a reader on the same machine
    /// reads are not compressed: snappy and its undoing cost the worker and the reader more CPU
    /// than the element's copy over loopback (a 48 KiB `float32` image: about 140 µs on the worker
    /// and 45 µs on the reader, against about 30 and 25 for the whole of its way uncompressed).
    /// Elements already buffered stay as they are.
    pub fn reader_elsewhere(&self) {
        self.reader_elsewhere.store(true, Ordering::Relaxed);
    }

    /// Up to `max` elements that are ready now (sealed, or open ones), or the end; `None` when
    /// nothing is buffered.
    pub fn try_take(&self, max: usize) -> Option<Taken> {
        let mut inner = self.lock();
        self.try_take_locked(&mut inner, max.max(1), true)
    }

    /// Up to `max` elements of sealed chunks, or the end; `None` when no chunk is sealed. For
    /// topping up a message that already has elements: what is still open stays with the
    /// pipeline to fill (a reader waiting in `take` gets it at its linger), so a fast pipeline
    /// is not made to start a new chunk for every message.
    pub fn try_take_sealed(&self, max: usize) -> Option<Taken> {
        let mut inner = self.lock();
        self.try_take_locked(&mut inner, max.max(1), false)
    }

    /// Up to `max` elements, waiting for at least one, or the end. Cancel-safe: nothing is
    /// taken until the call returns.
    pub async fn take(&self, max: usize) -> Taken {
        let max = max.max(1);
        let mut waited_for_open = false;
        loop {
            let notified = self.readable.notified();
            tokio::pin!(notified);
            // Registered before looking, so a seal between the look and the wait is not missed.
            notified.as_mut().enable();
            let open_waiting = {
                let mut inner = self.lock();
                if let Some(taken) = self.try_take_locked(&mut inner, max, waited_for_open) {
                    return taken;
                }
                inner
                    .open_since
                    .map(|since| LINGER.saturating_sub(now().saturating_duration_since(since)))
            };
            match open_waiting {
                // Elements wait in the open chunk: give the pipeline until they are `LINGER`
                // old to fill it, then take it as it is.
                Some(left) => {
                    if tokio::time::timeout(left, notified).await.is_err() {
                        waited_for_open = true;
                    }
                }
                // Nothing is open: the pipeline's next element wakes this reader.
                None => notified.await,
            }
        }
    }
}

/// The pipeline's side of a `TaskBuffer`. There is one per buffer and it pushes through
/// `&mut self`, so the open chunk has one writer. Dropped without `finish` (the pipeline thread
/// panicked), it ends the buffer with an error, so readers do not wait forever.
pub struct Producer {
    buffer: Arc<TaskBuffer>,
    /// When the pipeline last read the clock while pushing (see `CLOCK_EVERY`).
    last_push: Option<Instant>,
    /// Whether `Auto` compression pays for this task's large elements.
    auto: AutoCompression,
    finished: bool,
}

impl Producer {
    /// Appends one element, given as its encoding (`head`, then `payload`, empty unless a large
    /// tensor's data travels apart), blocking while the buffer is full. `false` when the buffer
    /// was closed (every reader is gone): the pipeline should stop.
    pub fn push(&mut self, head: &[u8], payload: Bytes) -> bool {
        self.push_with(|open| open.push_encoded(head, payload))
    }

    /// Appends one element, blocking while the buffer is full; `false` when the buffer was
    /// closed. A small element is encoded straight into the open chunk (a few bytes written, no
    /// copy); a larger one is encoded into `scratch` first, so a reader revoking the open chunk
    /// never waits while a large element is encoded or compressed. `Auto` compression applies
    /// once a reader on another machine reads the task (`reader_elsewhere`); then a task whose
    /// large elements do not compress stops trying (`AutoCompression`), and they go
    /// uncompressed, their data as parts of their own.
    pub fn push_element(
        &mut self,
        element: &Element,
        compression: Compression,
        scratch: &mut BytesMut,
    ) -> bool {
        let compression = match compression {
            Compression::Auto if !self.buffer.reader_elsewhere.load(Ordering::Relaxed) => {
                Compression::None
            }
            requested => requested,
        };
        if element.byte_size() < ENCODE_IN_PLACE_BELOW {
            return self.push_with(|open| open.push(element, compression));
        }
        // Large elements only: a small one is encoded in place, where trying costs little.
        let compression = self.auto.next(compression);
        scratch.clear();
        let payload = encode_element_append(element, compression, scratch);
        if compression == Compression::Auto {
            self.auto.tried(is_compressed(scratch));
        }
        self.push(scratch, payload.unwrap_or_default())
    }

    /// Appends the element `add` puts into the open chunk (returning its encoded size): without
    /// the lock while the pipeline owns a chunk that has room, under it otherwise.
    fn push_with(&mut self, add: impl FnOnce(&mut PackedBuilder) -> usize) -> bool {
        let buffer = &*self.buffer;
        if buffer.closed.load(Ordering::Relaxed) {
            return false;
        }
        buffer.appending.store(true, Ordering::Relaxed);
        crate::membarrier::light();
        if !buffer.revoked.load(Ordering::Acquire) {
            // SAFETY: owned: `appending` is set and no reader has revoked the chunk; a reader
            // revoking now waits until `appending` is clear (module header).
            let open = unsafe { &mut *buffer.open.get() };
            // A chunk's first element goes under the lock, to tell readers it is there.
            if !open.is_empty() && !buffer.full(open) {
                let seal = open.append(add, &mut self.last_push);
                buffer.appending.store(false, Ordering::Release);
                if seal {
                    self.seal();
                }
                return true;
            }
        }
        buffer.appending.store(false, Ordering::Release);
        self.push_locked(add)
    }

    /// `push_with` under the lock: waits for room, owns the open chunk again, and wakes
    /// readers for a chunk's first element or a sealed chunk.
    fn push_locked(&mut self, add: impl FnOnce(&mut PackedBuilder) -> usize) -> bool {
        let buffer = &*self.buffer;
        let mut guard = buffer.lock();
        loop {
            if buffer.closed.load(Ordering::Relaxed) {
                return false;
            }
            let (inner, open) = self.locked(&mut guard);
            if !buffer.full(open) {
                break;
            }
            // Full: whatever is open becomes takeable, then wait for a reader to make room.
            if !open.is_empty() {
                buffer.seal(inner, open);
                buffer.readable.notify_waiters();
            }
            #[cfg(test)]
            {
                guard.waiting_pushers += 1;
            }
            guard = buffer.room.wait(guard).expect("task buffer lock poisoned");
            #[cfg(test)]
            {
                guard.waiting_pushers -= 1;
            }
        }
        // No reader touches the open chunk while the lock is held: the pipeline owns it again.
        buffer.revoked.store(false, Ordering::Relaxed);
        let (inner, open) = self.locked(&mut guard);
        let first = open.is_empty();
        let seal = open.append(add, &mut self.last_push);
        if seal {
            buffer.seal(inner, open);
        } else if first {
            inner.open_since = open.since;
        }
        drop(guard);
        if first || seal {
            buffer.readable.notify_waiters();
        }
        true
    }

    /// Seals the open chunk (full, old, or the pipeline is slow) and wakes readers.
    fn seal(&self) {
        let buffer = &*self.buffer;
        let mut guard = buffer.lock();
        let (inner, open) = self.locked(&mut guard);
        buffer.seal(inner, open);
        drop(guard);
        buffer.readable.notify_waiters();
    }

    /// The lock's data and the open chunk, for the producer holding the lock.
    fn locked<'a>(&self, guard: &'a mut MutexGuard<'_, Inner>) -> (&'a mut Inner, &'a mut Open) {
        // SAFETY: the one producer (this), with the lock held through `guard`; readers touch
        // the chunk only under the lock.
        let open = unsafe { &mut *self.buffer.open.get() };
        (&mut **guard, open)
    }

    /// The pipeline ended (`Ok`) or failed: readers see it after every element pushed.
    pub fn finish(mut self, end: Result<(), TaskFailure>) {
        self.end(end);
    }

    fn end(&mut self, end: Result<(), TaskFailure>) {
        self.finished = true;
        let buffer = &*self.buffer;
        // Poisoned: a panic under the lock, which readers see as a panic of their own.
        let Ok(mut guard) = buffer.inner.lock() else {
            return;
        };
        let (inner, open) = self.locked(&mut guard);
        buffer.seal(inner, open);
        inner.end.get_or_insert(end);
        drop(guard);
        buffer.readable.notify_waiters();
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if !self.finished {
            let why = if std::thread::panicking() {
                "the task's pipeline thread panicked"
            } else {
                "the task's pipeline stopped without an end"
            };
            self.end(Err(why.into()));
        }
    }
}

#[cfg(test)]
#[path = "task_buffer_tests.rs"]
mod tests;
