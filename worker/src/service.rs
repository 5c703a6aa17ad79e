//! The worker's data plane: `Fetch` streams elements of one task to one reader, never more than
//! the reader's granted credits, many elements per message. A task's elements come from its
//! shared buffer (first come, first served) or, for cross-trainer cache jobs, from the task's
//! window at the cursor of the stream's trainer id.
//!
//! Serving a fetch stream does not depend on its transport: `open_fetch` takes the requests and
//! gives the batches to send, for the gRPC `Fetch` here and for raw fetch connections
//! (`raw_fetch`) alike.

use crate::cross_trainer_cache::{CacheError, CrossTrainerCache, EMPTY_TRAINER_ID};
use crate::round_robin::{RoundError, RoundReply};
use crate::task_buffer::Taken;
use crate::task_runner::TaskRunner;
use crate::worker_state::WorkerState;
use bytes::Bytes;
use sluice_dataset::{Packed, PackedBuilder};
use sluice_proto::worker::worker_server::Worker;
use sluice_proto::worker::{
    ElementBatch, FetchRequest, GetElementRequest, GetElementResponse, GetWorkerTasksRequest,
    GetWorkerTasksResponse,
};
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

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

#[tonic::async_trait]
impl Worker for WorkerService {
    type FetchStream = BatchStream;

    async fn fetch(
        &self,
        request: Request<Streaming<FetchRequest>>,
    ) -> Result<Response<BatchStream>, Status> {
        let batches = open_fetch(&self.state, FetchRequests::new(request.into_inner())).await?;
        Ok(Response::new(Box::pin(ReceiverStream::new(batches))))
    }

    /// Coordinated reads: one element of one round (see `round_robin`).
    async fn get_element(
        &self,
        request: Request<GetElementRequest>,
    ) -> Result<Response<GetElementResponse>, Status> {
        let req = request.into_inner();
        let Some(runner) = self.state.get(req.task_id) else {
            // Not assigned here yet, or the worker restarted: the consumer retries.
            return Err(Status::unavailable(format!(
                "Task {} not found",
                req.task_id
            )));
        };
        let round_robin = runner.round_robin().ok_or_else(|| {
            Status::failed_precondition(
                "RoundRobinTaskRunner needs to know the consumer index and element index of \
                 each request.",
            )
        })?;
        let reply = round_robin
            .get(
                req.consumer_index,
                req.round_index,
                req.allow_skip,
                req.skipped_previous_round,
            )
            .await
            .map_err(|e| match e {
                RoundError::Stopped => Status::unavailable(e.to_string()),
                RoundError::Failed(message) => Status::failed_precondition(message),
            })?;
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
        _request: Request<GetWorkerTasksRequest>,
    ) -> Result<Response<GetWorkerTasksResponse>, Status> {
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
/// after the last one; a refusal (task not here yet, deleted, a bad request) is the `Status`
/// the stream fails with.
pub(crate) async fn open_fetch(
    state: &Arc<WorkerState>,
    mut requests: FetchRequests,
) -> Result<mpsc::Receiver<Result<ElementBatch, Status>>, Status> {
    let first = requests.message().await?.ok_or_else(|| {
        Status::invalid_argument("a fetch stream must start with a request naming the task")
    })?;
    let task_id = first.task_id;
    let Some(runner) = state.get(task_id) else {
        if state.is_deleted(task_id) {
            return Err(Status::failed_precondition(format!(
                "Got request for local task {task_id} of worker {}, which has been deleted. \
                 You may be creating a duplicate iteration which has already finished. To \
                 fix this, make sure to create your dataset only once, as opposed to \
                 re-creating it repeatedly inside a loop.",
                state.address
            )));
        }
        if state.is_finished(task_id) {
            let (tx, rx) = mpsc::channel(1);
            tx.try_send(Ok(end_of_sequence()))
                .expect("a fresh channel has room for one batch");
            return Ok(rx);
        }
        // Not assigned here yet (or the worker restarted): the reader retries.
        return Err(Status::unavailable(format!("Task {task_id} not found")));
    };
    let (tx, rx) = mpsc::channel(2);
    let credits = u64::from(first.credits);
    match runner.cross_trainer_cache() {
        Some(cache) => {
            if first.trainer_id.is_empty() {
                return Err(Status::invalid_argument(EMPTY_TRAINER_ID));
            }
            let trainer = first.trainer_id;
            tokio::spawn(serve_cache(cache, trainer, credits, requests, tx));
        }
        None => {
            tokio::spawn(serve_buffer(runner, state.clone(), credits, requests, tx));
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

/// Streams the task's shared buffer: elements go to whichever reader asks first.
async fn serve_buffer(
    runner: Arc<TaskRunner>,
    state: Arc<WorkerState>,
    mut credits: u64,
    mut requests: FetchRequests,
    tx: Batches,
) {
    let task_id = runner.task_id();
    let buffer = runner.buffer();
    loop {
        if let Some(error) = runner.error() {
            let _ = tx
                .send(Ok(ElementBatch {
                    error,
                    ..Default::default()
                }))
                .await;
            return;
        }
        // Wait for credits, then for at least one element (or more credits).
        while credits == 0 {
            if !add_credits(&mut credits, requests.message().await) {
                return; // the reader went away
            }
        }
        let want = credits.min(usize::MAX as u64) as usize;
        // `take` is cancel-safe: when more credits win the race, nothing was taken.
        let first = tokio::select! {
            taken = buffer.take(want) => taken,
            more = requests.message() => {
                if add_credits(&mut credits, more) { continue; }
                return;
            }
        };
        // Chunks joined into one message at the end (one copy each).
        let mut chunks: Vec<Packed> = Vec::new();
        let mut bytes = 0usize;
        let (mut error, mut end_of_sequence) = (String::new(), false);
        let mut next = Some(first);
        // One message: what is ready now, up to the credits and the byte bound.
        while let Some(taken) = next.take() {
            match taken {
                Taken::Elements(chunk) => {
                    credits -= chunk.len() as u64;
                    bytes += chunk.byte_len();
                    chunks.push(chunk);
                }
                Taken::Error(e) => {
                    runner.set_error(e.clone());
                    error = e;
                    break;
                }
                Taken::Stopped => {
                    if !chunks.is_empty() {
                        let _ = tx.send(Ok(batch_of(Packed::concat(chunks)))).await;
                    }
                    return;
                }
                Taken::End => {
                    end_of_sequence = true;
                    break;
                }
            }
            if credits > 0 && bytes < MAX_BATCH_BYTES {
                next = buffer.try_take_sealed(credits.min(usize::MAX as u64) as usize);
            }
        }
        let batch = ElementBatch {
            error,
            end_of_sequence,
            ..batch_of(Packed::concat(chunks))
        };
        let last = batch.end_of_sequence || !batch.error.is_empty();
        if batch.end_of_sequence {
            state.complete(task_id);
        }
        if tx.send(Ok(batch)).await.is_err() || last {
            return;
        }
    }
}

/// Streams a cross-trainer cache task to one reader of `trainer`: the trainer's next elements
/// from the task's window. The task never ends (its end is an error); a task stopped here just
/// closes the stream, as a worker that went away would.
async fn serve_cache(
    cache: Arc<CrossTrainerCache>,
    trainer: String,
    mut credits: u64,
    mut requests: FetchRequests,
    tx: Batches,
) {
    loop {
        while credits == 0 {
            if !add_credits(&mut credits, requests.message().await) {
                return;
            }
        }
        // `get` is cancel-safe: more credits arriving first lose no element.
        let first = tokio::select! {
            element = cache.get(&trainer) => element,
            more = requests.message() => {
                if add_credits(&mut credits, more) { continue; }
                return;
            }
        };
        let mut elements = PackedBuilder::default();
        let mut error = String::new();
        let mut next = Some(first);
        while let Some(item) = next {
            match item {
                Ok(element) => {
                    elements.push_encoded(&element, Bytes::new());
                    credits -= 1;
                }
                Err(CacheError::Failed(e)) => {
                    error = e;
                    break;
                }
                Err(CacheError::Stopped) => {
                    if !elements.is_empty() {
                        let _ = tx.send(Ok(batch_of(elements.finish()))).await;
                    }
                    return;
                }
            }
            if credits == 0 || elements.byte_len() >= MAX_BATCH_BYTES {
                break;
            }
            next = cache.try_get(&trainer);
        }
        let batch = ElementBatch {
            error,
            ..batch_of(elements.finish())
        };
        let failed = !batch.error.is_empty();
        if tx.send(Ok(batch)).await.is_err() || failed {
            return;
        }
    }
}
