//! `TaskBuffer`: the bounded buffer between a task's pipeline thread and its readers, handed
//! over in chunks of many elements.
//!
//! Why chunks: with one element per hand-over, every element cost a cross-thread wake-up (the
//! reader woke for each element, the pipeline thread woke for each freed slot), which on this
//! class of machine costs microseconds and capped tiny elements near 0.2 M/s with the CPUs
//! mostly idle. Here the pipeline appends to an open chunk under a mutex and only a sealed chunk
//! wakes a reader, so wake-ups are per chunk.
//!
//! When a chunk is sealed decides latency: when it is full (`CHUNK_ELEMENTS` or `CHUNK_BYTES`),
//! at once when the pipeline is slow (the gap since its previous element is at least `LINGER`:
//! waiting for the next element would cost more than the hand-over), and once it is `LINGER`
//! old. Because the open chunk is shared, a reader that has waited `LINGER` takes it as it is,
//! so an element waits at most about `LINGER` even when the pipeline blocks right after it (a
//! rule on the pipeline side alone cannot see that: an earlier attempt sealed whenever the
//! buffer was empty, which the fast reader made always, and chunks stayed at one element).
//!
//! Bounds: at most `max_elements` elements and about `max_bytes` bytes are buffered (a single
//! larger element still goes in alone); the pipeline thread blocks while the buffer is full.
//! The end of the pipeline (or its error) is seen by readers after every buffered element.

use bytes::{Bytes, BytesMut};
use sluice_dataset::{encode_element_append, Compression, Element, Packed, PackedBuilder};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Elements per chunk at most.
pub const CHUNK_ELEMENTS: usize = 4096;
/// Bytes per chunk at most (a larger element goes alone).
pub const CHUNK_BYTES: usize = 1 << 20;
/// How long an element may wait in an open chunk for more to join it.
pub const LINGER: Duration = Duration::from_micros(500);
/// Elements with less data than this are encoded under the buffer's lock (see `push_element`).
const ENCODE_IN_PLACE_BELOW: usize = 4096;
/// Elements pushed between two reads of the clock.
const CLOCK_EVERY: usize = 32;

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
    /// One or more elements, in pipeline order, packed in one buffer.
    Elements(Packed),
    /// The pipeline reached its end and every element was taken.
    End,
    /// The task was stopped (deleted, or its worker shutting down) and every element was taken:
    /// not an end of sequence, so readers retry and find out what became of the task.
    Stopped,
    /// The pipeline failed after every element before the failure was taken.
    Error(String),
}

#[derive(Default)]
struct Inner {
    sealed: VecDeque<Packed>,
    /// The open chunk: elements are encoded straight into its buffer.
    open: PackedBuilder,
    open_bytes: usize,
    /// When the open chunk got its first element.
    open_since: Option<Instant>,
    /// When the pipeline last read the clock while pushing (see `CLOCK_EVERY`).
    last_push: Option<Instant>,
    elements: usize,
    bytes: usize,
    /// `Some` once the pipeline ended: `Ok` at its end, `Err` with its error.
    end: Option<Result<(), String>>,
    /// Readers are gone for good (the task was deleted): the pipeline stops.
    closed: bool,
}

impl Inner {
    fn seal(&mut self) {
        if !self.open.is_empty() {
            let chunk = self.open.finish();
            self.sealed.push_back(chunk);
            self.open_bytes = 0;
            self.open_since = None;
        }
    }

    /// Takes up to `max` elements of the oldest sealed chunk (the rest stays in front).
    fn take_sealed(&mut self, max: usize) -> Option<Packed> {
        let chunk = self.sealed.front_mut()?;
        let taken = if chunk.len() <= max {
            self.sealed.pop_front().expect("a front chunk")
        } else {
            chunk.split_to(max)
        };
        self.elements -= taken.len();
        self.bytes -= taken.byte_len();
        Some(taken)
    }
}

pub struct TaskBuffer {
    /// A std mutex: held for a few instructions, never across `.await`.
    inner: Mutex<Inner>,
    /// The pipeline thread waits here for room.
    room: Condvar,
    /// Readers wait here for a sealed chunk or the end.
    readable: Notify,
    max_elements: usize,
    max_bytes: usize,
}

impl TaskBuffer {
    pub fn new(max_elements: usize, max_bytes: usize) -> TaskBuffer {
        TaskBuffer {
            inner: Mutex::new(Inner::default()),
            room: Condvar::new(),
            readable: Notify::new(),
            max_elements: max_elements.max(1),
            max_bytes: max_bytes.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("task buffer lock poisoned")
    }

    /// The pipeline thread: appends one element, given as its encoding (`head`, then `payload`,
    /// empty unless a large tensor's data travels apart), blocking while the buffer is full.
    /// `false` when the buffer was closed (every reader is gone): the pipeline should stop.
    pub fn push(&self, head: &[u8], payload: Bytes) -> bool {
        self.push_with(|open| open.push_encoded(head, payload))
    }

    /// The pipeline thread: appends one element, blocking while the buffer is full; `false` when
    /// the buffer was closed. A small element is encoded straight into the open chunk, under the
    /// lock (a few bytes written, no copy); a larger one is encoded into `scratch` first, so the
    /// lock is not held while a large element is encoded or compressed.
    pub fn push_element(
        &self,
        element: &Element,
        compression: Compression,
        scratch: &mut BytesMut,
    ) -> bool {
        if element.byte_size() < ENCODE_IN_PLACE_BELOW {
            return self.push_with(|open| open.push(element, compression));
        }
        scratch.clear();
        let payload = encode_element_append(element, compression, scratch);
        self.push(scratch, payload.unwrap_or_default())
    }

    /// Appends the element `add` puts into the open chunk (returning its encoded size).
    fn push_with(&self, add: impl FnOnce(&mut PackedBuilder) -> usize) -> bool {
        let mut inner = self.lock();
        while !inner.closed
            && inner.elements > 0
            && (inner.elements >= self.max_elements || inner.bytes >= self.max_bytes)
        {
            // Full: whatever is open becomes takeable, then wait for a reader to make room.
            if !inner.open.is_empty() {
                inner.seal();
                self.readable.notify_waiters();
            }
            inner = self.room.wait(inner).expect("task buffer lock poisoned");
        }
        if inner.closed {
            return false;
        }
        // The clock is read for a chunk's first two elements and every `CLOCK_EVERY` elements
        // after (a clock read per element was a measurable share of a tiny element's cost):
        // enough to see a slow pipeline (whose chunks hold one or two elements) and a chunk past
        // its linger.
        let (mut slow, mut old) = (false, false);
        if inner.open.len() < 2 || inner.open.len().is_multiple_of(CLOCK_EVERY) {
            let now = Instant::now();
            slow = inner
                .last_push
                .is_some_and(|last| now.duration_since(last) >= LINGER);
            inner.last_push = Some(now);
            let since = *inner.open_since.get_or_insert(now);
            old = now.duration_since(since) >= LINGER;
        }
        let len = add(&mut inner.open);
        inner.elements += 1;
        inner.bytes += len;
        inner.open_bytes += len;
        if slow || old || inner.open.len() >= CHUNK_ELEMENTS || inner.open_bytes >= CHUNK_BYTES {
            inner.seal();
            drop(inner);
            self.readable.notify_waiters();
        }
        true
    }

    /// The pipeline thread: the pipeline ended (`Ok`) or failed. Later calls change nothing.
    pub fn finish(&self, end: Result<(), String>) {
        let mut inner = self.lock();
        if inner.end.is_none() {
            inner.end = Some(end);
        }
        inner.seal();
        drop(inner);
        self.readable.notify_waiters();
    }

    /// Every reader is gone for good: the pipeline thread stops at its next element.
    pub fn close(&self) {
        self.lock().closed = true;
        self.room.notify_all();
    }

    /// Up to `max` (at least 1) elements without waiting: a sealed chunk, or the open one when
    /// `open_too`; `None` when there is nothing to take yet.
    fn try_take_locked(&self, inner: &mut Inner, max: usize, open_too: bool) -> Option<Taken> {
        if let Some(elements) = inner.take_sealed(max) {
            self.room.notify_one();
            return Some(Taken::Elements(elements));
        }
        let ended = inner.end.is_some();
        if !inner.open.is_empty() && (open_too || ended) {
            inner.seal();
            let elements = inner.take_sealed(max).expect("just sealed");
            self.room.notify_one();
            return Some(Taken::Elements(elements));
        }
        match &inner.end {
            Some(Ok(())) if inner.closed => Some(Taken::Stopped),
            Some(Ok(())) => Some(Taken::End),
            Some(Err(error)) => Some(Taken::Error(error.clone())),
            None => None,
        }
    }

    /// Up to `max` elements that are ready now (sealed, or open ones), or the end; `None` when
    /// nothing is buffered. For topping up a message that already has elements.
    pub fn try_take(&self, max: usize) -> Option<Taken> {
        let mut inner = self.lock();
        self.try_take_locked(&mut inner, max.max(1), true)
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
                    .map(|since| LINGER.saturating_sub(since.elapsed()))
            };
            match open_waiting {
                // Elements wait in the open chunk: give the pipeline until they are `LINGER`
                // old to fill it, then take it as it is.
                Some(left) => {
                    if tokio::time::timeout(left, notified).await.is_err() {
                        waited_for_open = true;
                    }
                }
                None => notified.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Pushes a one-byte element.
    fn push(buffer: &TaskBuffer, v: u8) -> bool {
        buffer.push(&[v], Bytes::new())
    }

    fn values(taken: Taken) -> Vec<u8> {
        match taken {
            Taken::Elements(e) => e.encoded().map(|(head, _)| head[0]).collect(),
            other => panic!("expected elements, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn chunks_hold_at_most_chunk_elements_in_pipeline_order() {
        let buffer = TaskBuffer::new(4 * CHUNK_ELEMENTS, usize::MAX);
        let n = CHUNK_ELEMENTS + 3;
        for i in 0..n {
            assert!(buffer.push(&(i as u32).to_le_bytes(), Bytes::new()));
        }
        buffer.finish(Ok(()));
        // A fast pipeline fills whole chunks; a slow machine may seal some early (500 us), so
        // only the bound and the order are certain.
        let mut next = 0u32;
        let mut chunks = 0;
        loop {
            match buffer.take(usize::MAX).await {
                Taken::Elements(elements) => {
                    assert!(elements.len() <= CHUNK_ELEMENTS);
                    for (head, _) in elements.encoded() {
                        assert_eq!(u32::from_le_bytes(head[..].try_into().unwrap()), next);
                        next += 1;
                    }
                    chunks += 1;
                }
                Taken::End => break,
                Taken::Error(e) => panic!("{e}"),
                Taken::Stopped => panic!("never closed"),
            }
        }
        assert_eq!(next as usize, n);
        assert!(chunks >= 2);
        assert_eq!(buffer.take(1).await, Taken::End, "the end stays");
    }

    #[tokio::test]
    async fn a_reader_takes_no_more_than_it_asks_and_order_is_kept() {
        let buffer = TaskBuffer::new(100, usize::MAX);
        for i in 0..5 {
            push(&buffer, i);
        }
        buffer.finish(Err("boom".into()));
        assert_eq!(values(buffer.take(2).await), vec![0, 1]);
        assert_eq!(values(buffer.take(2).await), vec![2, 3]);
        assert_eq!(values(buffer.take(2).await), vec![4]);
        assert_eq!(buffer.take(2).await, Taken::Error("boom".into()));
    }

    #[tokio::test]
    async fn an_element_left_open_is_taken_after_the_linger() {
        let buffer = TaskBuffer::new(100, usize::MAX);
        push(&buffer, 7);
        // The pipeline has not ended and pushes nothing more: the reader still gets the element.
        let started = Instant::now();
        let taken = tokio::time::timeout(Duration::from_secs(5), buffer.take(10))
            .await
            .expect("the open element within the linger");
        assert_eq!(values(taken), vec![7]);
        assert!(started.elapsed() >= LINGER / 2);
        assert_eq!(buffer.try_take(10), None);
    }

    #[tokio::test]
    async fn a_slow_pipeline_seals_each_element_at_once() {
        let buffer = TaskBuffer::new(100, usize::MAX);
        push(&buffer, 1);
        std::thread::sleep(LINGER * 2);
        // The gap since the previous element marks the pipeline slow: this one is sealed at
        // once, together with the one that was waiting.
        push(&buffer, 2);
        assert_eq!(values(buffer.try_take_now()), vec![1, 2]);
    }

    impl TaskBuffer {
        /// A sealed chunk only (what a reader gets without any linger).
        fn try_take_now(&self) -> Taken {
            let mut inner = self.lock();
            self.try_take_locked(&mut inner, usize::MAX, false)
                .expect("a sealed chunk")
        }
    }

    #[tokio::test]
    async fn elements_small_and_large_come_out_as_they_went_in() {
        use sluice_dataset::Tensor;
        let floats = vec![0.5f32; 1 << 16];
        let elements: Vec<Element> = vec![
            Tensor::scalar_i64(3).into(),
            Tensor::from_f32s(vec![floats.len()], &floats)
                .unwrap()
                .into(),
            Tensor::scalar_string("s").into(),
        ];
        for compression in [Compression::None, Compression::Auto] {
            let buffer = TaskBuffer::new(100, usize::MAX);
            let mut scratch = BytesMut::new();
            for e in &elements {
                assert!(buffer.push_element(e, compression, &mut scratch));
            }
            buffer.finish(Ok(()));
            // A slow push (compressing the large one) may seal a chunk early.
            let mut decoded = Vec::new();
            while let Taken::Elements(packed) = buffer.take(100).await {
                decoded.extend(packed.into_decoder().map(Result::unwrap));
            }
            assert_eq!(decoded.len(), elements.len());
            for (i, (d, e)) in decoded.iter().zip(&elements).enumerate() {
                assert!(
                    d == e,
                    "{compression}: element {i}: {:?} {:?}",
                    d.spec(),
                    e.spec()
                );
            }
        }
    }

    #[tokio::test]
    async fn a_closed_buffer_reports_stopped_after_its_elements_not_end() {
        let buffer = TaskBuffer::new(16, usize::MAX);
        assert!(push(&buffer, b'x'));
        buffer.close();
        buffer.finish(Ok(()));
        assert!(matches!(buffer.take(16).await, Taken::Elements(e) if e.len() == 1));
        assert_eq!(buffer.take(16).await, Taken::Stopped);
    }

    #[test]
    fn the_pipeline_blocks_while_full_and_stops_when_closed() {
        let buffer = Arc::new(TaskBuffer::new(3, usize::MAX));
        for i in 0..3 {
            assert!(push(&buffer, i));
        }
        let pusher = {
            let buffer = buffer.clone();
            std::thread::spawn(move || push(&buffer, 3))
        };
        // Full: the pusher waits until a reader makes room.
        std::thread::sleep(Duration::from_millis(20));
        assert!(!pusher.is_finished());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        assert_eq!(values(rt.block_on(buffer.take(1))), vec![0]);
        assert!(pusher.join().unwrap());
        // Full again (1, 2, 3). Closed: a blocked (or later) push says stop.
        let blocked = {
            let buffer = buffer.clone();
            std::thread::spawn(move || push(&buffer, 99))
        };
        std::thread::sleep(Duration::from_millis(20));
        buffer.close();
        assert!(!blocked.join().unwrap());
        assert!(!push(&buffer, 100));
    }

    #[test]
    fn the_byte_bound_holds_but_a_large_element_still_goes_alone() {
        let buffer = TaskBuffer::new(100, 10);
        assert!(buffer.push(&[0u8; 64], Bytes::new()));
        let pusher = {
            let buffer = Arc::new(buffer);
            let b2 = buffer.clone();
            (
                std::thread::spawn(move || b2.push(&[1u8; 4], Bytes::new())),
                buffer,
            )
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !pusher.0.is_finished(),
            "over the byte bound: the pipeline waits"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        match rt.block_on(pusher.1.take(10)) {
            Taken::Elements(e) => assert_eq!(e.byte_len(), 64),
            other => panic!("{other:?}"),
        }
        assert!(pusher.0.join().unwrap());
    }
}
