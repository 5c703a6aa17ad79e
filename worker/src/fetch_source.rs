//! `FetchSource`: where a fetch stream's elements come from. The credit loop that serves a
//! stream (`service::serve`) is the same for every source: it waits for credits, gathers what
//! is ready into one message (up to the credits and a message's byte bound), and sends it. A
//! source says only how its elements are taken and what its end means.
//!
//! Three sources: a task's shared buffer (`BufferSource`, first come, first served: each element
//! goes to whichever reader takes it first), and a cross-trainer cache task (`CacheSource`: the
//! elements at one trainer's cursor), and a task that has ended (`EndedSource`, for a reader
//! that reconnects to get what it had not received). This is the data plane's hot path: neither allocates per
//! element. The buffer hands over whole chunks of elements, and the cache copies its elements
//! into one growing message buffer.

use crate::cross_trainer_cache::{CacheError, CrossTrainerCache};
use crate::index_list::IndexList;
use crate::task_buffer::{Taken, TaskBuffer};
use crate::task_failure::TaskFailure;
use crate::task_runner::TaskRunner;
use crate::worker_state::WorkerState;
use bytes::Bytes;
use sluice_element::{Packed, PackedBuilder};
use std::future::Future;
use std::sync::Arc;

/// What a take added to the message, or why it added nothing.
pub(crate) enum Took {
    /// This many elements (at least one) went into the message.
    Elements(u64),
    /// The input ended and every element was taken: the stream's end of sequence.
    End,
    /// The task was stopped (deleted, or the worker is shutting down): the stream closes
    /// without an end of sequence, as it would if the worker went away, and the reader retries.
    Stopped,
    /// The input failed: the stream ends with this error.
    Error(TaskFailure),
}

/// The elements of one message, being gathered.
pub(crate) trait Message: Default + Send {
    fn is_empty(&self) -> bool;
    /// Encoded bytes so far, payloads included.
    fn byte_len(&self) -> usize;
    /// The elements, in one buffer, and their task-stream indices (exactly-once tasks).
    fn finish(self) -> (Packed, IndexList);
}

pub(crate) trait FetchSource: Send + Sync + 'static {
    type Message: Message;

    /// A failure recorded before this message (by this stream or another): the stream ends
    /// with it at once.
    fn failed(&self) -> Option<TaskFailure>;

    /// Waits until elements are ready and moves up to `max` (at least one) of them into
    /// `message`. Cancel-safe: a call dropped before it returns took nothing.
    fn take(&self, max: u64, message: &mut Self::Message) -> impl Future<Output = Took> + Send;

    /// Like [`FetchSource::take`] without waiting: `None` when nothing is ready to top up a
    /// message with.
    fn try_take(&self, max: u64, message: &mut Self::Message) -> Option<Took>;

    /// Waits until the end of sequence may go to the reader once the input ended; false when
    /// it may not (the worker is stopping: the stream closes without an end, and the reader
    /// retries). At once, unless a source says otherwise.
    fn before_end(&self) -> impl Future<Output = bool> + Send {
        async { true }
    }

    /// The `n` elements taken into a message are recorded in the reader's ledger.
    fn recorded(&self, _n: u64) {}
}

/// A buffer's message: the chunks taken, joined at the end (one copy each).
#[derive(Default)]
pub(crate) struct Chunks {
    chunks: Vec<Packed>,
    bytes: usize,
    indices: IndexList,
}

impl Message for Chunks {
    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    fn byte_len(&self) -> usize {
        self.bytes
    }

    fn finish(self) -> (Packed, IndexList) {
        (Packed::concat(self.chunks), self.indices)
    }
}

impl Message for PackedBuilder {
    fn is_empty(&self) -> bool {
        PackedBuilder::is_empty(self)
    }

    fn byte_len(&self) -> usize {
        PackedBuilder::byte_len(self)
    }

    fn finish(mut self) -> (Packed, IndexList) {
        (PackedBuilder::finish(&mut self), IndexList::default())
    }
}

/// A task's shared buffer: elements go to whichever reader asks first. Its end completes the
/// task, and its failure is recorded on the task, so every later stream of it fails alike.
pub(crate) struct BufferSource {
    runner: Arc<TaskRunner>,
    buffer: Arc<TaskBuffer>,
    state: Arc<WorkerState>,
}

impl BufferSource {
    pub(crate) fn new(runner: Arc<TaskRunner>, state: Arc<WorkerState>) -> BufferSource {
        let buffer = runner.buffer();
        BufferSource {
            runner,
            buffer,
            state,
        }
    }

    fn took(&self, taken: Taken, message: &mut Chunks) -> Took {
        match taken {
            Taken::Elements(chunk, first) => {
                let n = chunk.len() as u64;
                self.runner.took(n);
                message.bytes += chunk.byte_len();
                message.chunks.push(chunk);
                message.indices.extend(self.runner.stream_indices(first, n));
                Took::Elements(n)
            }
            Taken::Error(e) => {
                self.runner.set_error(e.clone());
                Took::Error(e)
            }
            Taken::Stopped => Took::Stopped,
            Taken::End => {
                if self.runner.exactly_once() {
                    self.state.complete_when_acknowledged(self.runner.clone());
                } else {
                    self.state.complete(self.runner.task_id());
                }
                Took::End
            }
        }
    }
}

fn as_usize(max: u64) -> usize {
    max.min(usize::MAX as u64) as usize
}

impl FetchSource for BufferSource {
    type Message = Chunks;

    fn failed(&self) -> Option<TaskFailure> {
        self.runner.error()
    }

    async fn take(&self, max: u64, message: &mut Chunks) -> Took {
        let taken = self.buffer.take(as_usize(max)).await;
        self.took(taken, message)
    }

    /// Sealed chunks only: what is still open stays with the pipeline to fill (see
    /// `TaskBuffer::try_take_sealed`).
    fn try_take(&self, max: u64, message: &mut Chunks) -> Option<Took> {
        let taken = self.buffer.try_take_sealed(as_usize(max))?;
        Some(self.took(taken, message))
    }

    fn recorded(&self, n: u64) {
        self.runner.recorded(n);
        self.state.progress();
    }

    /// A task that delivers at most once: the dispatcher has recorded its end first. A reader
    /// that saw the end then knows the task will not be given again to this worker restarted
    /// at the same address, which would run it again with no reader left for it, and its
    /// iteration would never finish. Without the end, a reader of a worker that died reads the
    /// task's new run, as tf.data's does. (An exactly-once task's end waits for its readers'
    /// acknowledgements instead, and its rerun skips what they received.)
    async fn before_end(&self) -> bool {
        if self.runner.exactly_once() {
            return true;
        }
        self.state.until_reported(self.runner.task_id()).await
    }
}

/// A task that ended before this stream opened, read by a reader that has elements to get
/// again (see `reader_ledger`): the stream resends them, then ends.
pub(crate) struct EndedSource;

impl FetchSource for EndedSource {
    type Message = Chunks;

    fn failed(&self) -> Option<TaskFailure> {
        None
    }

    async fn take(&self, _max: u64, _message: &mut Chunks) -> Took {
        Took::End
    }

    fn try_take(&self, _max: u64, _message: &mut Chunks) -> Option<Took> {
        Some(Took::End)
    }
}

/// A cross-trainer cache task, read as one trainer: the trainer's next elements from the task's
/// window. The task never ends (its end is an error); stopped, it just closes the stream.
pub(crate) struct CacheSource {
    cache: Arc<CrossTrainerCache>,
    trainer: String,
}

impl CacheSource {
    pub(crate) fn new(cache: Arc<CrossTrainerCache>, trainer: String) -> CacheSource {
        CacheSource { cache, trainer }
    }
}

/// One element of the window into the message.
fn took_one(got: Result<Bytes, CacheError>, message: &mut PackedBuilder) -> Took {
    match got {
        Ok(element) => {
            message.push_encoded(&element, Bytes::new());
            Took::Elements(1)
        }
        Err(CacheError::Failed(e)) => Took::Error(e),
        Err(CacheError::Stopped) => Took::Stopped,
    }
}

impl FetchSource for CacheSource {
    type Message = PackedBuilder;

    /// A failed read fails only the stream that made it: the cache records the input's failure
    /// itself, for every trainer.
    fn failed(&self) -> Option<TaskFailure> {
        None
    }

    /// One element at a time: the window is shared between trainers, element by element.
    async fn take(&self, _max: u64, message: &mut PackedBuilder) -> Took {
        // `get` is cancel-safe: more credits arriving first lose no element.
        let got = self.cache.get(&self.trainer).await;
        took_one(got, message)
    }

    fn try_take(&self, _max: u64, message: &mut PackedBuilder) -> Option<Took> {
        let got = self.cache.try_get(&self.trainer)?;
        Some(took_one(got, message))
    }
}
