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
//! Refusals are `WorkerError`s; `error.rs` maps them to the status a reader sees. Every RPC is
//! for readers: the service runs behind the authenticator's interceptor (`raw_fetch::serve_port`)
//! and each handler first checks that the caller holds the client role (admins do too).

use crate::error::WorkerError;
use crate::fetch_source::{BufferSource, CacheSource, FetchSource, Message, Took};
use crate::round_robin::RoundReply;
use crate::task_failure::TaskFailure;
use crate::worker_state::WorkerState;
use sluice_dataset::Packed;
use sluice_proto::worker::worker_server::Worker;
use sluice_proto::worker::{
    ElementBatch, FetchRequest, GetElementRequest, GetElementResponse, GetWorkerTasksRequest,
    GetWorkerTasksResponse,
};
use sluice_security::{authorize, Role};
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
    let (packed, lengths, each_length, payloads) = elements.into_wire();
    ElementBatch {
        packed,
        lengths,
        each_length,
        payloads,
        ..Default::default()
    }
}

/// The last message of a failed stream: the elements produced before the failure, and the
/// failure (with a Python function's exception, when one raised).
fn failed_batch(failure: TaskFailure, elements: Packed) -> ElementBatch {
    ElementBatch {
        python_exception: failure.python_proto(),
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
        let requests = FetchRequests::new(request.into_inner());
        let batches = open_fetch(&self.state, requests).await?;
        Ok(Response::new(Box::pin(ReceiverStream::new(batches))))
    }

    /// Coordinated reads: one element of one round (see `round_robin`).
    async fn get_element(
        &self,
        request: Request<GetElementRequest>,
    ) -> Result<Response<GetElementResponse>, Status> {
        authorize(&request, "GetElement", READERS)?;
        let req = request.into_inner();
        let runner = self
            .state
            .get(req.task_id)
            .ok_or(WorkerError::TaskNotHereYet {
                task_id: req.task_id,
            })?;
        let round_robin = runner.round_robin().ok_or(WorkerError::NotRoundRobin {
            task_id: req.task_id,
        })?;
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

/// Opens a fetch stream, whatever its transport: reads the first request (which names the
/// task), and starts serving it. The batches to send come out of the receiver, which closes
/// after the last one; a refusal (task not here yet, deleted, a bad request) is the error the
/// stream fails with.
pub(crate) async fn open_fetch(
    state: &Arc<WorkerState>,
    mut requests: FetchRequests,
) -> Result<mpsc::Receiver<Result<ElementBatch, Status>>, WorkerError> {
    let first = requests
        .message()
        .await
        .map_err(WorkerError::Reader)?
        .ok_or(WorkerError::NoFirstRequest)?;
    let task_id = first.task_id;
    let Some(runner) = state.get(task_id) else {
        if state.is_deleted(task_id) {
            return Err(WorkerError::TaskDeleted {
                task_id,
                worker: state.address.clone(),
            });
        }
        if state.is_finished(task_id) {
            let (tx, rx) = mpsc::channel(1);
            tx.try_send(Ok(end_of_sequence()))
                .expect("a fresh channel has room for one batch");
            return Ok(rx);
        }
        return Err(WorkerError::TaskNotHereYet { task_id });
    };
    let (tx, rx) = mpsc::channel(2);
    let credits = u64::from(first.credits);
    match runner.cross_trainer_cache() {
        Some(cache) => {
            if first.trainer_id.is_empty() {
                return Err(WorkerError::EmptyTrainerId);
            }
            let source = CacheSource::new(cache, first.trainer_id);
            tokio::spawn(serve(source, credits, requests, tx));
        }
        None => {
            let source = BufferSource::new(runner, state.clone());
            tokio::spawn(serve(source, credits, requests, tx));
        }
    }
    Ok(rx)
}

/// Adds the credits of the reader's next request; false when the reader went away.
fn add_credits(credits: &mut u64, more: Result<Option<FetchRequest>, Status>) -> bool {
    match more {
        Ok(Some(more)) => {
            *credits += u64::from(more.credits);
            true
        }
        _ => false,
    }
}

/// Streams `source` to one reader: never more elements than the reader granted credits for,
/// each message what is ready when it is gathered (up to the credits and `MAX_BATCH_BYTES`),
/// until the source ends, fails or stops, or the reader goes away.
async fn serve<S: FetchSource>(
    source: S,
    mut credits: u64,
    mut requests: FetchRequests,
    tx: Batches,
) {
    loop {
        if let Some(failure) = source.failed() {
            let _ = tx.send(Ok(failed_batch(failure, Packed::default()))).await;
            return;
        }
        // Wait for credits, then for at least one element (or more credits).
        while credits == 0 {
            if !add_credits(&mut credits, requests.message().await) {
                return; // the reader went away
            }
        }
        let mut message = S::Message::default();
        // `take` is cancel-safe: when more credits win the race, nothing was taken.
        let first = tokio::select! {
            took = source.take(credits, &mut message) => took,
            more = requests.message() => {
                if add_credits(&mut credits, more) { continue; }
                return;
            }
        };
        let (mut failure, mut end_of_sequence) = (None, false);
        let mut next = Some(first);
        // One message: what is ready now, up to the credits and the byte bound.
        while let Some(took) = next.take() {
            match took {
                Took::Elements(n) => credits -= n,
                Took::Error(e) => {
                    failure = Some(e);
                    break;
                }
                Took::Stopped => {
                    if !message.is_empty() {
                        let _ = tx.send(Ok(batch_of(message.finish()))).await;
                    }
                    return;
                }
                Took::End => {
                    end_of_sequence = true;
                    break;
                }
            }
            if credits > 0 && message.byte_len() < MAX_BATCH_BYTES {
                next = source.try_take(credits, &mut message);
            }
        }
        let last = end_of_sequence || failure.is_some();
        let batch = match failure {
            Some(failure) => failed_batch(failure, message.finish()),
            None => ElementBatch {
                end_of_sequence,
                ..batch_of(message.finish())
            },
        };
        if tx.send(Ok(batch)).await.is_err() || last {
            return;
        }
    }
}
