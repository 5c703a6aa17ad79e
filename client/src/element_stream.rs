//! `ElementStream`: one epoch of a `ServiceDataset`, and the iteration loop behind it.
//!
//! The loop long-polls the dispatcher (`ClientHeartbeat`) for the iteration's tasks, opens one
//! fetch stream per task (see `task_stream`), and ends when the dispatcher says the iteration
//! finished and every stream this client opened has reached its end. Tasks of workers the
//! client does not target (`target_workers`) are never opened; once one is skipped the
//! iteration may never finish (nobody reads that task), so the epoch ends instead when every
//! task this client reads has ended (tf.data's `should_finish_iteration_ = false`).
//!
//! Memory is bounded by a semaphore of `max_outstanding_requests` permits: a permit is taken
//! before an element is requested (granted as a credit to the worker) and released when the
//! caller takes the element, so requested plus buffered elements never exceed the bound.
//!
//! Dropping the stream cancels the loop, which deletes the tasks only this client read from
//! workers in this process (tf.data's `DeleteLocalWorkerTasks`), then releases the iteration
//! client (best effort; the dispatcher's client timeout covers a lost release).

use crate::coordinated::{self, CoordinatedConfig};
use crate::error::ClientError;
use crate::local_ops::run_local_ops;
use crate::options::{deletes_task_when_done, reads_task, DistributeOptions, HeartbeatWaits};
use crate::read_metrics::ReadMetrics;
use crate::task_stream::{self, TaskStreamConfig};
use sluice_dataset::{pb as dpb, DatasetError, Element, ExecOptions, PackedDecoder, PythonRunner};
use sluice_proto::dispatcher as pb;
use sluice_rpc::{
    ClientHeartbeat, ClientHeartbeatReply, DispatcherClient, KnownTasks, LocalWorkers,
};
use sluice_types::{ClientId, TargetWorkers, TaskId};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Elements of one message from a worker, with the permits that account for them (released
/// when the caller has taken the last of them).
pub(crate) struct Delivered {
    pub elements: Elements,
    pub permit: Option<OwnedSemaphorePermit>,
    /// Their size, for the client metrics (see `client_metrics`).
    pub bytes: u64,
}

/// The elements of one delivery, front first: decoded already, or packed as the worker sent
/// them and decoded as the caller takes them. Decoding on the caller's thread means a small
/// element's allocation is made and freed by the same thread, and nothing per element is
/// shared between threads.
pub(crate) enum Elements {
    Decoded(std::vec::IntoIter<Element>),
    Packed(PackedDecoder),
}

impl Elements {
    pub fn one(element: Element) -> Elements {
        Elements::Decoded(vec![element].into_iter())
    }

    #[inline]
    fn remaining(&self) -> usize {
        match self {
            Elements::Decoded(elements) => elements.len(),
            Elements::Packed(elements) => elements.remaining(),
        }
    }

    /// The next element; `None` at the end or when it does not decode (`take_error` says why).
    #[inline]
    fn next_element(&mut self) -> Option<Element> {
        match self {
            Elements::Decoded(elements) => elements.next(),
            Elements::Packed(elements) => elements.next_element(),
        }
    }

    fn take_error(&mut self) -> Option<DatasetError> {
        match self {
            Elements::Decoded(_) => None,
            Elements::Packed(elements) => elements.take_error(),
        }
    }
}

impl Iterator for Elements {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_element() {
            Some(element) => Some(Ok(element)),
            None => self.take_error().map(Err),
        }
    }
}

/// What the iteration loop hands to the caller: elements, or the error that ended the epoch.
pub(crate) type Delivery = Result<Delivered, ClientError>;

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
        client_id: ClientId,
        options: &DistributeOptions,
        local_ops: Vec<dpb::Op>,
        python: Option<Arc<dyn PythonRunner>>,
        metrics: ReadMetrics,
    ) -> Result<ElementStream, ClientError> {
        let cancel = CancellationToken::new();
        let (tx, rx) = flume::unbounded();
        let driver = Driver {
            client,
            client_id,
            consumer_index: options.consumer_index,
            trainer_id: options
                .cross_trainer_cache
                .as_ref()
                .map(|c| c.trainer_id.clone())
                .unwrap_or_default(),
            target_workers: options.target_workers,
            outstanding: options.outstanding(),
            heartbeat_poll: options.heartbeat_poll,
            permits: Arc::new(Semaphore::new(options.outstanding() as usize)),
            out: tx,
            // A child: the driver stops its task streams when the epoch ends without stopping
            // the local pipeline, which still drains what was delivered.
            cancel: cancel.child_token(),
        };
        let driver = tokio::spawn(driver.run());
        let rx = if local_ops.is_empty() {
            rx
        } else {
            let options = ExecOptions {
                python,
                ..ExecOptions::default()
            };
            run_local_ops(rx, &local_ops, &options, cancel.clone())?
        };
        let mut stream = ElementStream::over(rx, cancel);
        stream.driver = Some(driver);
        stream.metrics = metrics;
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
        }
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
            self.stalled_since.get_or_insert_with(Instant::now);
            return Poll::Pending;
        };
        self.waiting = None;
        // A wait that ends with the epoch's end is not a stall for an element.
        if let (Some(since), Ok(_)) = (self.stalled_since.take(), &delivery) {
            self.metrics.stalled(since.elapsed());
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

struct Driver {
    client: DispatcherClient,
    client_id: ClientId,
    /// Coordinated reads: this consumer's index.
    consumer_index: Option<u32>,
    /// Cross-trainer cache jobs: this trainer's id (empty otherwise).
    trainer_id: String,
    /// Which workers' tasks this client reads.
    target_workers: TargetWorkers,
    outstanding: u32,
    heartbeat_poll: Duration,
    permits: Arc<Semaphore>,
    out: flume::Sender<Delivery>,
    cancel: CancellationToken,
}

impl Driver {
    async fn run(self) {
        let mut opened = Vec::new();
        let result = match self.consumer_index {
            Some(consumer_index) => {
                let config = CoordinatedConfig {
                    client_id: self.client_id,
                    consumer_index,
                    max_outstanding: self.outstanding,
                    heartbeat_poll: self.heartbeat_poll,
                };
                let (permits, out) = (self.permits.clone(), self.out.clone());
                coordinated::run(
                    self.client.clone(),
                    config,
                    permits,
                    out,
                    self.cancel.clone(),
                )
                .await
            }
            None => self.iterate(&mut opened).await,
        };
        if let Err(e) = result {
            let _ = self.out.send(Err(e));
        }
        self.cancel.cancel();
        self.delete_local_tasks(&opened);
        self.release().await;
    }

    /// Reads the iteration's tasks until the epoch ends; `opened` collects the tasks read.
    async fn iterate(&self, opened: &mut Vec<pb::TaskInfo>) -> Result<(), ClientError> {
        let (finished_tx, finished_rx) = watch::channel(false);
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(u64, Result<(), ClientError>)>();
        // Task id -> whether its stream reached the end.
        let mut streams: HashMap<u64, bool> = HashMap::new();
        // Tasks of workers this client does not target; while there are any, the epoch ends
        // when this client's own tasks end rather than when the iteration finishes.
        let mut skipped: HashSet<u64> = HashSet::new();
        let epoch_done = |streams: &HashMap<u64, bool>, skipped: &HashSet<u64>, finished: bool| {
            let own_tasks_ended = streams.values().all(|done| *done);
            own_tasks_ended && (finished || (!skipped.is_empty() && !streams.is_empty()))
        };
        let mut known_tasks = KnownTasks::default();
        let mut waits = HeartbeatWaits::new(self.heartbeat_poll);
        let mut pending = Box::pin(heartbeat(
            self.client.clone(),
            self.client_id,
            known_tasks,
            Duration::ZERO,
        ));
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return Ok(()),
                response = &mut pending => {
                    let response = response?;
                    // No list: the one known is current.
                    let tasks = match response.tasks {
                        Some(tasks) => {
                            known_tasks = KnownTasks::of(&tasks);
                            tasks
                        }
                        None => Vec::new(),
                    };
                    if response.iteration_finished {
                        let _ = finished_tx.send(true);
                    }
                    // A finished iteration has nothing left in tasks not opened yet (tf.data
                    // updates no tasks once the iteration finished).
                    let mut new_tasks = Vec::new();
                    for task in tasks {
                        if *finished_tx.borrow()
                            || streams.contains_key(&task.task_id)
                            || skipped.contains(&task.task_id)
                        {
                            continue;
                        }
                        let local = LocalWorkers::global().contains(&task.worker_address);
                        if reads_task(self.target_workers, &task, local) {
                            new_tasks.push(task);
                        } else {
                            debug!(task = task.task_id, worker = %task.worker_address, "not a target worker: skipping its task");
                            skipped.insert(task.task_id);
                        }
                    }
                    let read_tasks = (streams.len() + new_tasks.len()) as u32;
                    for task in new_tasks {
                        streams.insert(task.task_id, false);
                        opened.push(task.clone());
                        let config = TaskStreamConfig {
                            task_id: task.task_id,
                            address: task.worker_address,
                            client_id: self.client_id.0,
                            trainer_id: self.trainer_id.clone(),
                            max_credits: (self.outstanding / read_tasks.max(1)).max(1),
                            // What the reader presents to the dispatcher, it presents to workers.
                            security: self.client.security().clone(),
                        };
                        debug!(task = config.task_id, worker = %config.address, "reading task");
                        let done = done_tx.clone();
                        let (permits, out, finished, cancel) =
                            (self.permits.clone(), self.out.clone(), finished_rx.clone(), self.cancel.child_token());
                        tokio::spawn(async move {
                            let task_id = config.task_id;
                            let result = task_stream::run(config, permits, out, finished, cancel).await;
                            let _ = done.send((task_id, result));
                        });
                    }
                    if epoch_done(&streams, &skipped, *finished_tx.borrow()) {
                        return Ok(());
                    }
                    pending = Box::pin(heartbeat(self.client.clone(), self.client_id, known_tasks, waits.draw()));
                }
                Some((task_id, result)) = done_rx.recv() => {
                    result?;
                    streams.insert(task_id, true);
                    if epoch_done(&streams, &skipped, *finished_tx.borrow()) {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Deletes, from workers in this process, the tasks nobody but this client reads, so they
    /// stop producing (a later reader of them gets tf.data's "which has been deleted" error).
    fn delete_local_tasks(&self, opened: &[pb::TaskInfo]) {
        for task in opened {
            if !deletes_task_when_done(self.target_workers, task) {
                continue;
            }
            if let Some(worker) = LocalWorkers::global().get(&task.worker_address) {
                debug!(task = task.task_id, worker = %task.worker_address, "deleting local task");
                worker.delete_local_task(TaskId(task.task_id));
            }
        }
    }

    async fn release(&self) {
        let client_id = self.client_id;
        let release = self.client.release_iteration_client(client_id);
        if tokio::time::timeout(Duration::from_secs(2), release)
            .await
            .is_err()
        {
            debug!(
                client = %client_id,
                "release of the iteration client timed out"
            );
        }
    }
}

async fn heartbeat(
    client: DispatcherClient,
    client_id: ClientId,
    known_tasks: KnownTasks,
    poll: Duration,
) -> Result<ClientHeartbeatReply, ClientError> {
    let heartbeat = ClientHeartbeat {
        client_id,
        known_tasks,
        current_round: None,
        blocked_round: None,
    };
    Ok(client.client_heartbeat(&heartbeat, poll).await?)
}

#[cfg(test)]
#[path = "element_stream_tests.rs"]
mod tests;
