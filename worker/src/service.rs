//! The worker's data plane: `Fetch` streams elements of one task to one reader, never more than
//! the reader's granted credits, many elements per message. A task's elements come from its
//! shared buffer (first come, first served) or, for cross-trainer cache jobs, from the task's
//! window at the cursor of the stream's trainer id.
//!
//! Serving a fetch stream does not depend on its transport: `open_fetch` takes the requests and
//! gives the batches to send, for the gRPC `Fetch` here and for raw fetch connections
//! (`raw_fetch`) alike. Nor does it depend on where the elements come from: `serve` is one
//! credit loop over a `FetchSource` (the task's buffer, or its cross-trainer cache).
//!
//! Every element a stream takes goes into its reader's ledger before it is sent, and is sent
//! from there (`reader_stream`): a reader that acknowledges what it receives and reconnects after
//! a broken connection is resent what it had not received, before anything new, and a finished
//! task still serves it that rest and the end.
//!
//! Refusals are `WorkerError`s; `error.rs` maps them to the status a reader sees. Every RPC is
//! for readers: the service runs behind the authenticator's interceptor (`raw_fetch::serve_port`)
//! and each handler first checks that the caller holds the client role (admins do too). A
//! client credential is not enough to read a task: the reader must present the dispatcher's
//! admission of its client id to the task's iteration (in a fetch stream's first request, and
//! in every coordinated `GetElement`), checked before anything is taken from the task
//! (`WorkerState::check_admission`).

use crate::error::WorkerError;
use crate::fetch_source::{BufferSource, CacheSource, EndedSource, FetchSource, Message, Took};
use crate::reader_stream::{ledger_key, ReaderStream};
use crate::round_robin::RoundReply;
use crate::task_failure::TaskFailure;
use crate::worker_state::WorkerState;
use sluice_element::Packed;
use sluice_proto::worker::worker_server::Worker;
use sluice_proto::worker::{
    ElementBatch, FetchRequest, GetElementRequest, GetElementResponse, GetWorkerTasksRequest,
    GetWorkerTasksResponse,
};
use sluice_security::{authorize, ConnInfo, Role};
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// Who may call the worker's RPCs: readers.
const READERS: &[Role] = &[Role::Client];

/// Bytes of elements per message at most (a single larger element still goes alone).
const MAX_BATCH_BYTES: usize = 1024 * 1024;

pub struct WorkerService {
    state: Arc<WorkerState>,
}

impl WorkerService {
    pub fn new(state: Arc<WorkerState>) -> Self {
        WorkerService { state }
    }
}

type BatchStream = Pin<Box<dyn Stream<Item = Result<ElementBatch, Status>> + Send>>;

fn end_of_sequence() -> ElementBatch {
    ElementBatch {
        end_of_sequence: true,
        ..Default::default()
    }
}

/// A message carrying `elements` (see worker.proto).
fn batch_of(elements: Packed) -> ElementBatch {
    with_elements(ElementBatch::default(), elements)
}

/// `header` (a message's sequence fields) carrying `elements`.
fn with_elements(header: ElementBatch, elements: Packed) -> ElementBatch {
    let (packed, lengths, each_length, payloads) = elements.into_wire();
    ElementBatch {
        packed,
        lengths,
        each_length,
        payloads,
        ..header
    }
}

/// The last message of a failed stream: the elements produced before the failure, and the
/// failure (with a Python function's exception, when one raised).
fn failed_batch(failure: TaskFailure, elements: Packed) -> ElementBatch {
    ElementBatch {
        python_exception: failure.python_proto(),
        error_code: failure.code as i32,
        error: failure.message,
        ..batch_of(elements)
    }
}

#[tonic::async_trait]
impl Worker for WorkerService {
    type FetchStream = BatchStream;

    async fn fetch(
        &self,
        request: Request<Streaming<FetchRequest>>,
    ) -> Result<Response<BatchStream>, Status> {
        authorize(&request, "Fetch", READERS)?;
        let same_host = same_host(&request);
        let requests = FetchRequests::new(request.into_inner());
        let batches = open_fetch(&self.state, requests, same_host).await?;
        Ok(Response::new(Box::pin(ReceiverStream::new(batches))))
    }

    /// Coordinated reads: one element of one round (see `round_robin`).
    async fn get_element(
        &self,
        request: Request<GetElementRequest>,
    ) -> Result<Response<GetElementResponse>, Status> {
        authorize(&request, "GetElement", READERS)?;
        let same_host = same_host(&request);
        let req = request.into_inner();
        self.state
            .check_admission(req.task_id, req.client_id, &req.admission)?;
        let runner = self
            .state
            .get(req.task_id)
            .ok_or(WorkerError::TaskNotHereYet {
                task_id: req.task_id,
            })?;
        let round_robin = runner.round_robin().ok_or(WorkerError::NotRoundRobin {
            task_id: req.task_id,
        })?;
        self.state.reader_of(&runner, same_host);
        let reply = round_robin
            .get(
                req.consumer_index,
                req.round_index,
                req.allow_skip,
                req.skipped_previous_round,
            )
            .await
            .map_err(WorkerError::from)?;
        Ok(Response::new(match reply {
            RoundReply::Element(element) => GetElementResponse {
                element,
                ..Default::default()
            },
            RoundReply::Skip => GetElementResponse {
                skip_task: true,
                ..Default::default()
            },
        }))
    }

    async fn get_worker_tasks(
        &self,
        request: Request<GetWorkerTasksRequest>,
    ) -> Result<Response<GetWorkerTasksResponse>, Status> {
        authorize(&request, "GetWorkerTasks", READERS)?;
        Ok(Response::new(GetWorkerTasksResponse {
            task_ids: self.state.task_ids(),
        }))
    }
}

type Batches = mpsc::Sender<Result<ElementBatch, Status>>;

/// A fetch stream's requests, whichever transport carries them: a gRPC `Fetch` call's request
/// stream, or a raw fetch connection's (see `raw_fetch`).
pub(crate) struct FetchRequests(Pin<Box<dyn Stream<Item = Result<FetchRequest, Status>> + Send>>);

impl FetchRequests {
    pub(crate) fn new(
        requests: impl Stream<Item = Result<FetchRequest, Status>> + Send + 'static,
    ) -> Self {
        FetchRequests(Box::pin(requests))
    }

    /// The next request, `None` once the reader closed its side. Cancel-safe (as
    /// `Streaming::message`), which the serving loops' `select!`s rely on.
    async fn message(&mut self) -> Result<Option<FetchRequest>, Status> {
        self.0.next().await.transpose()
    }
}

/// Whether `request` comes from this machine (see `ConnInfo::same_host`).
fn same_host<T>(request: &Request<T>) -> bool {
    request
        .extensions()
        .get::<ConnInfo>()
        .is_some_and(|conn| conn.same_host)
}

/// Opens a fetch stream, whatever its transport: reads the first request (which names the
/// task), and starts serving it. The batches to send come out of the receiver, which closes
/// after the last one; a refusal (task not here yet, deleted, a bad request) is the error the
/// stream fails with. `same_host`: the reader runs on this machine (see
/// `WorkerState::reader_of`).
pub(crate) async fn open_fetch(
    state: &Arc<WorkerState>,
    mut requests: FetchRequests,
    same_host: bool,
) -> Result<mpsc::Receiver<Result<ElementBatch, Status>>, WorkerError> {
    let first = requests
        .message()
        .await
        .map_err(WorkerError::Reader)?
        .ok_or(WorkerError::NoFirstRequest)?;
    let task_id = first.task_id;
    // Before anything of the task is looked at for this reader: only admitted readers.
    state.check_admission(task_id, first.client_id, &first.admission)?;
    let (tx, rx) = mpsc::channel(2);
    let Some(runner) = state.get(task_id) else {
        if state.is_deleted(task_id) {
            return Err(WorkerError::TaskDeleted {
                task_id,
                worker: state.address.clone(),
            });
        }
        if state.is_finished(task_id) {
            // A reader that reconnects after the end gets what it had not received first.
            let held = first
                .acknowledges
                .then(|| state.existing_ledger(&ledger_key(&first)))
                .flatten();
            if let Some(ledger) = held {
                let reader = ReaderStream::open(state, &first, Some(ledger))?;
                tokio::spawn(serve(EndedSource, reader, requests, tx, state.clone()));
                return Ok(rx);
            }
            tx.try_send(Ok(end_of_sequence()))
                .expect("a fresh channel has room for one batch");
            return Ok(rx);
        }
        return Err(WorkerError::TaskNotHereYet { task_id });
    };
    state.reader_of(&runner, same_host);
    match runner.cross_trainer_cache() {
        Some(cache) => {
            if first.trainer_id.is_empty() {
                return Err(WorkerError::EmptyTrainerId);
            }
            let reader = ReaderStream::open(state, &first, None)?;
            let source = CacheSource::new(cache, first.trainer_id);
            tokio::spawn(serve(source, reader, requests, tx, state.clone()));
        }
        None => {
            let reader = ReaderStream::open(state, &first, None)?;
            let source = BufferSource::new(runner, state.clone());
            tokio::spawn(serve(source, reader, requests, tx, state.clone()));
        }
    }
    Ok(rx)
}

/// What became of a wait on the reader.
enum Heard {
    /// A request arrived and was taken into account.
    Request,
    /// The reader went away, or broke a rule (it was told so): the stream is over.
    Over,
}

/// Takes the reader's next request (`more`) into account: its credits and acknowledgement.
async fn hear(
    reader: &mut ReaderStream,
    more: Result<Option<FetchRequest>, Status>,
    tx: &Batches,
) -> Heard {
    match more {
        Ok(Some(more)) => match reader.on_request(&more) {
            Ok(()) => Heard::Request,
            Err(refused) => {
                let _ = tx.send(Err(refused.into())).await;
                Heard::Over
            }
        },
        _ => Heard::Over,
    }
}

/// Waits, reading the reader's requests, until `ready` holds; false when the stream is over.
async fn wait_until(
    reader: &mut ReaderStream,
    requests: &mut FetchRequests,
    tx: &Batches,
    ready: impl Fn(&ReaderStream) -> bool,
) -> bool {
    while !ready(reader) {
        if let Heard::Over = hear(reader, requests.message().await, tx).await {
            return false;
        }
    }
    true
}

/// Streams `source` to one reader: never more elements than the reader granted credits for,
/// each message what is ready when it is gathered (up to the credits and `MAX_BATCH_BYTES`),
/// until the source ends, fails or stops, or the reader goes away. What the reader's ledger
/// holds and this stream has not sent (a resend, after a reconnect) goes before anything new.
async fn serve<S: FetchSource>(
    source: S,
    mut reader: ReaderStream,
    mut requests: FetchRequests,
    tx: Batches,
    state: Arc<WorkerState>,
) {
    // The source reached its end (every element is in the ledger).
    let mut ended = false;
    // The source let the end go to the reader (`FetchSource::before_end`).
    let mut end_cleared = false;
    loop {
        if let Some(failure) = source.failed() {
            let _ = tx.send(Ok(failed_batch(failure, Packed::default()))).await;
            return;
        }
        if reader.is_replaced() {
            return; // a newer stream of the same reader serves it
        }
        if reader.has_unsent() {
            if !wait_until(&mut reader, &mut requests, &tx, |r| r.credits() > 0).await {
                return;
            }
            let Some((header, elements)) = reader.next_unsent(MAX_BATCH_BYTES) else {
                continue; // acknowledged meanwhile: nothing left to send
            };
            // The end goes with the last elements when nothing else is left to send, once the
            // source lets it go (`before_end`): until then they go without it.
            let last = ended && end_cleared && !reader.has_unsent();
            let batch = ElementBatch {
                end_of_sequence: last,
                ..with_elements(header, elements)
            };
            if tx.send(Ok(batch)).await.is_err() {
                return;
            }
            if last {
                return await_end_ack(reader, requests, &state).await;
            }
            continue;
        }
        if ended && !end_cleared {
            // Every element is sent: the end waits for the source, hearing the reader meanwhile.
            let may_end = loop {
                tokio::select! {
                    may_end = source.before_end() => break may_end,
                    more = requests.message() => match hear(&mut reader, more, &tx).await {
                        Heard::Request => continue,
                        Heard::Over => return,
                    },
                }
            };
            if !may_end {
                // Not an end (the worker is stopping): as for a stopped task, the reader retries.
                return;
            }
            end_cleared = true;
            continue;
        }
        if ended {
            let batch = ElementBatch {
                end_of_sequence: true,
                ..reader.end_header()
            };
            if tx.send(Ok(batch)).await.is_ok() {
                await_end_ack(reader, requests, &state).await;
            }
            return;
        }
        // Wait for credits and room in the window, then for at least one element.
        if !wait_until(&mut reader, &mut requests, &tx, |r| r.room() > 0).await {
            return;
        }
        let max = reader.room();
        let mut message = S::Message::default();
        // `take` is cancel-safe: when a request wins the race, nothing was taken.
        let first = tokio::select! {
            took = source.take(max, &mut message) => took,
            more = requests.message() => match hear(&mut reader, more, &tx).await {
                Heard::Request => continue,
                Heard::Over => return,
            },
        };
        let (mut failure, mut stopped, mut taken) = (None, false, 0);
        let mut next = Some(first);
        // One message: what is ready now, up to the room and the byte bound.
        while let Some(took) = next.take() {
            match took {
                Took::Elements(n) => taken += n,
                Took::Error(e) => {
                    failure = Some(e);
                    break;
                }
                Took::Stopped => {
                    stopped = true;
                    break;
                }
                Took::End => {
                    ended = true;
                    break;
                }
            }
            if taken < max && message.byte_len() < MAX_BATCH_BYTES {
                next = source.try_take(max - taken, &mut message);
            }
        }
        if !message.is_empty() {
            reader.record(message.finish());
            source.recorded(taken);
        }
        if let Some(failure) = failure {
            // The epoch fails: what was taken goes with the failure, unnumbered.
            let elements = reader
                .next_unsent(usize::MAX)
                .map(|(_, elements)| elements)
                .unwrap_or_default();
            let _ = tx.send(Ok(failed_batch(failure, elements))).await;
            return;
        }
        if stopped {
            // Not an end: the reader retries, and what it has not received stays held.
            if let Some((header, elements)) = reader.next_unsent(MAX_BATCH_BYTES) {
                let _ = tx.send(Ok(with_elements(header, elements))).await;
            }
            return;
        }
    }
}

/// How long a stream that sent its end waits for the reader to acknowledge it.
const END_ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// After the end: reads the reader's last acknowledgement, which lets the ledger go. Without
/// it (the connection broke first) the ledger stays for the reader to reconnect to.
async fn await_end_ack(mut reader: ReaderStream, mut requests: FetchRequests, state: &WorkerState) {
    if !reader.acknowledges() {
        return;
    }
    let _ = tokio::time::timeout(END_ACK_WAIT, async {
        while let Ok(Some(request)) = requests.message().await {
            if reader.acknowledged_end(state, &request) {
                return;
            }
        }
    })
    .await;
}
