//! `ElementStream`: one epoch of a `ServiceDataset`, as the caller reads it. The loop behind
//! it (heartbeats, task streams) is `driver`'s; it hands deliveries (`delivery`) to the stream
//! over a channel, through the local pipeline (`local_ops`) when ops follow `distribute`.
//!
//! Memory is bounded by a semaphore of `max_outstanding_requests` permits: a permit is taken
//! before an element is requested (granted as a credit to the worker) and released when the
//! caller takes the element, so requested plus buffered elements never exceed the bound.
//!
//! Dropping the stream cancels the loop (see `driver` for what it does then).
//!
//! In an exactly-once job each delivery carries its elements' task and indices; the stream
//! keeps those of the deliveries handed out (per delivery, nothing per element), so that
//! [`ElementStream::state`] can tell the dispatcher exactly what the caller has had.

use crate::delivery::{Delivery, Elements};
use crate::driver::Driver;
use crate::error::ClientError;
use crate::local_ops::run_local_ops;
use crate::options::DistributeOptions;
use crate::read_ahead::ReadAhead;
use crate::read_metrics::ReadMetrics;
use crate::reader_state::{Checkpointing, ReaderState, Taken};
use sluice_element::{pb as dpb, DatasetError, Element, PythonRunner};
use sluice_executor::ExecOptions;
use sluice_rpc::{DispatcherClient, IterationClient};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

/// The elements of one epoch, in arrival order.
pub struct ElementStream {
    rx: flume::Receiver<Delivery>,
    /// The batch being handed out, front first, and its permits.
    current: Elements,
    current_permit: Option<OwnedSemaphorePermit>,
    /// Elements taken from the current batch whose permits were not released yet.
    taken: usize,
    /// The wait for the next delivery, kept between polls.
    waiting: Option<flume::r#async::RecvFut<'static, Delivery>>,
    /// Set when an element failed to decode: nothing more is handed out.
    ended: bool,
    cancel: CancellationToken,
    /// The loop behind the stream (heartbeats, task streams, the release at the end); `close`
    /// waits for it. `None` for a stream over a channel alone (tests).
    driver: Option<tokio::task::JoinHandle<()>>,
    /// Counts deliveries and waits; nothing per element.
    metrics: ReadMetrics,
    /// When the caller began waiting for a delivery, while it waits.
    stalled_since: Option<Instant>,
    /// The read-ahead window, told when the caller starves (`None`: a stream over a channel
    /// alone).
    read_ahead: Option<Arc<ReadAhead>>,
    /// The current batch's task and indices (exactly-once tasks), and its size when it came.
    current_indices: Option<(u64, Vec<(u64, u64)>)>,
    current_len: u64,
    /// Elements of the batches before the current one.
    consumed: u64,
    /// Indices handed out since the last state, but the current batch's.
    handed_out: Taken,
    /// How states are taken, or why this epoch cannot take them.
    checkpointing: Result<Checkpointing, String>,
}

/// Why a reader with ops after `distribute` takes no state.
const LOCAL_OPS_TAKE_NO_STATE: &str = "a reader with ops after `distribute` takes no state (what \
     they hold between elements is not part of one): move them before `distribute`";

/// How long a `repeat` after `distribute` waits, when it is closed, for the dispatcher to hear
/// that the current pass's reader has gone.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// The wait before the next pass of a `repeat()` after `distribute` that read nothing: the
/// first, and the most it grows to.
const EMPTY_PASS_WAIT: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// `rx`, through the ops chained after `distribute` (run in this process) when there are any.
fn through_local_ops(
    rx: flume::Receiver<Delivery>,
    ops: &[dpb::Op],
    python: Option<Arc<dyn PythonRunner>>,
    cancel: &CancellationToken,
) -> Result<flume::Receiver<Delivery>, ClientError> {
    if ops.is_empty() {
        return Ok(rx);
    }
    let options = ExecOptions {
        python,
        ..ExecOptions::default()
    };
    run_local_ops(rx, ops, &options, cancel.clone())
}

/// Permits released at once as the caller takes elements.
const RELEASE_EVERY: usize = 64;

impl Drop for ElementStream {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl ElementStream {
    pub(crate) fn start(
        client: DispatcherClient,
        iteration: IterationClient,
        options: &DistributeOptions,
        local_ops: Vec<dpb::Op>,
        python: Option<Arc<dyn PythonRunner>>,
        metrics: ReadMetrics,
        checkpointing: Result<Checkpointing, String>,
    ) -> Result<ElementStream, ClientError> {
        let checkpointing = if local_ops.is_empty() {
            checkpointing
        } else {
            Err(LOCAL_OPS_TAKE_NO_STATE.to_string())
        };
        let cancel = CancellationToken::new();
        let (tx, rx) = flume::unbounded();
        // A child: the driver stops its task streams when the epoch ends without stopping the
        // local pipeline, which still drains what was delivered.
        let read_ahead = Arc::new(options.read_ahead());
        let driver = Driver::new(
            client,
            iteration,
            options,
            read_ahead.clone(),
            tx,
            cancel.child_token(),
        );
        let driver = tokio::spawn(driver.run());
        let rx = through_local_ops(rx, &local_ops, python, &cancel)?;
        let mut stream = ElementStream::over(rx, cancel);
        stream.driver = Some(driver);
        stream.read_ahead = Some(read_ahead);
        stream.metrics = metrics;
        stream.checkpointing = checkpointing;
        Ok(stream)
    }

    /// The passes of a `repeat` chained after `distribute`: each pass is a new epoch of the
    /// job (its next repetition, as tf.data repeats a dataset read from the service), `count`
    /// of them (`None`: for ever), then the ops chained after the repeat. As in tf.data, an
    /// empty pass does not end a `repeat()` over the service (a reader that joins a shared job
    /// late finds its first repetitions finished, and empty): the next pass starts after a
    /// wait that grows while passes stay empty, so an empty job is not asked for new epochs in
    /// a loop.
    pub(crate) fn repeated<F, Fut>(
        mut next_pass: F,
        count: Option<u64>,
        after: Vec<dpb::Op>,
        python: Option<Arc<dyn PythonRunner>>,
    ) -> Result<ElementStream, ClientError>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<ElementStream, ClientError>> + Send,
    {
        let cancel = CancellationToken::new();
        let (tx, rx) = flume::bounded(1);
        let stop = cancel.clone();
        let passes = tokio::spawn(async move {
            let mut pass = 0u64;
            let mut empty_wait = EMPTY_PASS_WAIT.0;
            while count.is_none_or(|count| pass < count) {
                let mut stream = match next_pass().await {
                    Ok(stream) => stream,
                    Err(e) => {
                        let _ = tx.send_async(Err(e)).await;
                        return;
                    }
                };
                let mut yielded = false;
                loop {
                    let next = tokio::select! {
                        biased;
                        _ = stop.cancelled() => {
                            stream.close(RELEASE_WAIT).await;
                            return;
                        }
                        next = stream.next() => next,
                    };
                    let delivery = match next {
                        None => break,
                        Some(Ok(element)) => Ok(crate::delivery::Delivered {
                            bytes: element.byte_size() as u64,
                            elements: Elements::one(element),
                            permit: None,
                            indices: None,
                        }),
                        Some(Err(e)) => Err(e),
                    };
                    let failed = delivery.is_err();
                    yielded = true;
                    if tx.send_async(delivery).await.is_err() || failed {
                        stream.close(RELEASE_WAIT).await;
                        return;
                    }
                }
                pass += 1;
                if yielded {
                    empty_wait = EMPTY_PASS_WAIT.0;
                } else if count.is_none() {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(empty_wait) => {}
                    }
                    empty_wait = (empty_wait * 2).min(EMPTY_PASS_WAIT.1);
                }
            }
        });
        let rx = through_local_ops(rx, &after, python, &cancel)?;
        let mut stream = ElementStream::over(rx, cancel);
        stream.driver = Some(passes);
        stream.checkpointing = Err(LOCAL_OPS_TAKE_NO_STATE.to_string());
        Ok(stream)
    }

    /// Ends the epoch now, as dropping the stream does, and waits (at most `timeout`) until the
    /// dispatcher has been told this client is gone. A process about to exit closes its streams
    /// this way: a dropped stream's release runs on the runtime, which may not outlive it.
    pub async fn close(mut self, timeout: Duration) {
        self.cancel.cancel();
        if let Some(driver) = self.driver.take() {
            let _ = tokio::time::timeout(timeout, driver).await;
        }
    }

    /// A stream of what arrives on `rx`; `cancel` is cancelled when it is dropped.
    fn over(rx: flume::Receiver<Delivery>, cancel: CancellationToken) -> ElementStream {
        ElementStream {
            rx,
            current: Elements::Decoded(Vec::new().into_iter()),
            current_permit: None,
            taken: 0,
            waiting: None,
            ended: false,
            cancel,
            driver: None,
            metrics: ReadMetrics::detached(),
            stalled_since: None,
            read_ahead: None,
            current_indices: None,
            current_len: 0,
            consumed: 0,
            handed_out: Taken::default(),
            checkpointing: Err("this stream reads no job".into()),
        }
    }

    /// Elements handed out so far in the epoch, counting from the state it was restored
    /// from, if any.
    pub fn position(&self) -> u64 {
        let first = self.checkpointing.as_ref().map_or(0, |c| c.first_step);
        first + self.consumed + self.taken_from_current()
    }

    fn taken_from_current(&self) -> u64 {
        self.current_len
            .saturating_sub(self.current.remaining() as u64)
    }

    /// The reader's state now: everything handed out so far is what a restore from it will
    /// not deliver again (see `ReaderState`). Needs a named job that delivers exactly once,
    /// and no ops after `distribute`.
    pub async fn state(&mut self) -> Result<ReaderState, ClientError> {
        let from_current = self.taken_from_current();
        let step = self.position();
        let checkpointing = self
            .checkpointing
            .as_mut()
            .map_err(|why| ClientError::FailedPrecondition(why.clone()))?;
        if let Some((task_id, runs)) = &self.current_indices {
            self.handed_out.add_prefix(*task_id, runs, from_current);
        }
        checkpointing.save(step, &mut self.handed_out).await
    }

    /// The next element; `None` at the end of the epoch. After an error the stream ends.
    ///
    /// Cancel-safe: a delivery that arrives while the returned future is pending is kept by the
    /// stream, so dropping the future loses nothing.
    // Not `async fn`: the future's `poll` is inlined into the caller's loop (see `poll_element`).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> impl Future<Output = Option<Result<Element, ClientError>>> + '_ {
        Next(self)
    }

    /// Like [`ElementStream::next`], for callers outside async code.
    pub fn next_blocking(&mut self) -> Option<Result<Element, ClientError>> {
        loop {
            if let Some(element) = self.take() {
                return Some(Ok(element));
            }
            if let Some(e) = self.current.take_error() {
                return Some(Err(self.fail(e)));
            }
            if self.ended {
                return None;
            }
            let delivery = match self.rx.try_recv() {
                Ok(delivery) => delivery,
                Err(flume::TryRecvError::Disconnected) => return None,
                Err(flume::TryRecvError::Empty) => {
                    self.starved();
                    let since = Instant::now();
                    let delivery = self.rx.recv().ok()?;
                    self.metrics.stalled(since.elapsed());
                    delivery
                }
            };
            if let Some(e) = self.accept(delivery) {
                return Some(Err(e));
            }
        }
    }

    /// The element of the current batch when there is one: no more than a decode, inlined into
    /// the caller's loop (with `Next::poll`; forced, as LLVM kept both out of line), so the
    /// element is built close to where the caller reads it (each function boundary it crossed
    /// by value cost a few ns in moves); otherwise waits for a delivery.
    #[inline(always)]
    fn poll_element(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Element, ClientError>>> {
        match self.take() {
            Some(element) => Poll::Ready(Some(Ok(element))),
            None => self.poll_refill(cx),
        }
    }

    /// The current batch has no element left (or one that does not decode): the error, or the
    /// first element of the next delivery, or the end.
    #[inline(never)]
    fn poll_refill(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Element, ClientError>>> {
        loop {
            if let Some(e) = self.current.take_error() {
                return Poll::Ready(Some(Err(self.fail(e))));
            }
            let Some(delivery) = ready!(self.poll_delivery(cx)) else {
                return Poll::Ready(None);
            };
            if let Some(e) = self.accept(delivery) {
                return Poll::Ready(Some(Err(e)));
            }
            if let Some(element) = self.take() {
                return Poll::Ready(Some(Ok(element)));
            }
        }
    }

    /// The caller found nothing to read: a growing read-ahead window opens.
    #[cold]
    fn starved(&self) {
        if let Some(read_ahead) = &self.read_ahead {
            read_ahead.starved(self.consumed + self.taken_from_current());
        }
    }

    /// Waits for the next delivery; `None` once the epoch ended.
    fn poll_delivery(&mut self, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let rx = &self.rx;
        let waiting = self
            .waiting
            .get_or_insert_with(|| rx.clone().into_recv_async());
        let Poll::Ready(delivery) = Pin::new(waiting).poll(cx) else {
            if self.stalled_since.is_none() {
                self.stalled_since = Some(Instant::now());
                self.starved();
            }
            return Poll::Pending;
        };
        self.waiting = None;
        // A wait that ends with the epoch's end is not a stall for an element.
        if let (Some(since), Ok(delivery)) = (self.stalled_since.take(), &delivery) {
            self.metrics.stalled(since.elapsed());
            if let (Some(read_ahead), Ok(batch)) = (&self.read_ahead, delivery) {
                let taken = self.consumed + self.taken_from_current();
                // The burst: this message's elements and the messages already behind it (a
                // large element travels alone, so a worker's burst of them is many messages).
                let burst = batch.elements.remaining() as u64 + self.rx.len() as u64;
                read_ahead.stall_ended(burst, taken);
            }
        }
        Poll::Ready(delivery.ok())
    }

    /// The next element of the current batch; `None` when it has none left or its next element
    /// does not decode (which ends the epoch: see `fail`). Its permit goes back to the epoch's
    /// semaphore in a group of `RELEASE_EVERY`, or with the batch's last element, so the worker
    /// may be granted credits again while the caller works on it (with
    /// `max_outstanding_requests` 1, that is all the overlap there is): one semaphore operation
    /// per element was a measurable share of a tiny element's cost, and holding a few permits a
    /// little longer only tightens the bound. The element is counted, and the group released,
    /// before the decode, so nothing stands between the decode and the caller's slot (a call
    /// there made the element take a detour through the stack, at a store-forwarding stall).
    /// Counting one that is not there (the batch is spent) is harmless: the whole permit has
    /// gone back with the batch's last element.
    #[inline]
    fn take(&mut self) -> Option<Element> {
        self.taken += 1;
        if self.taken >= RELEASE_EVERY || self.current.remaining() <= 1 {
            self.release_taken();
        }
        self.current.next_element()
    }

    /// Releases the permits of the elements taken since the last release.
    fn release_taken(&mut self) {
        if let Some(permit) = &mut self.current_permit {
            if permit.num_permits() > self.taken {
                drop(permit.split(self.taken));
            } else {
                self.current_permit = None;
            }
        }
        self.taken = 0;
    }

    /// An element did not decode: the epoch ends here.
    #[cold]
    fn fail(&mut self, e: DatasetError) -> ClientError {
        self.cancel.cancel();
        self.current = Elements::Decoded(Vec::new().into_iter());
        self.current_permit = None;
        self.ended = true;
        e.into()
    }

    /// Makes a delivered batch current (releasing the previous batch's permits).
    fn accept(&mut self, delivery: Delivery) -> Option<ClientError> {
        match delivery {
            Ok(batch) => {
                let count = batch.elements.remaining() as u64;
                self.metrics.delivered(count, batch.bytes);
                if let Some((task_id, runs)) = self.current_indices.take() {
                    self.handed_out.add_runs(task_id, &runs);
                }
                self.consumed += self.current_len;
                self.current_len = count;
                // Indices are kept only where a state can be taken: a reader that cannot take
                // one (no job name, ops after `distribute`) would only accumulate them.
                self.current_indices = batch.indices.filter(|_| self.checkpointing.is_ok());
                self.current = batch.elements;
                self.current_permit = batch.permit;
                self.taken = 0;
                None
            }
            Err(e) => Some(e),
        }
    }

    /// Reads the rest of the epoch.
    pub async fn collect(mut self) -> Result<Vec<Element>, ClientError> {
        let mut out = Vec::new();
        while let Some(element) = self.next().await {
            out.push(element?);
        }
        Ok(out)
    }
}

/// The future of [`ElementStream::next`].
struct Next<'a>(&'a mut ElementStream);

impl Future for Next<'_> {
    type Output = Option<Result<Element, ClientError>>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().0.poll_element(cx)
    }
}

/// The same elements as [`ElementStream::next`], for stream combinators.
impl futures::Stream for ElementStream {
    type Item = Result<Element, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_element(cx)
    }
}

#[cfg(test)]
#[path = "element_stream_tests.rs"]
mod tests;
