//! Reading one task: a `Fetch` stream to its worker with credit-based flow control.
//!
//! The stream never asks for more elements than it holds permits for (one permit per element,
//! from the epoch's shared semaphore), and hands each arriving element to the caller together
//! with its permit. A broken stream (worker down or restarting, task not there yet) is retried
//! with backoff until the worker serves the task again, or until the iteration is finished, at
//! which point a task that cannot be reached has nothing left for this client.

use crate::element_stream::{Delivered, Delivery, Elements};
use crate::error::{is_worker_refusal, ClientError};
use sluice_proto::worker::worker_client::WorkerClient;
use sluice_proto::worker::FetchRequest;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

/// HTTP/2 frame size this client accepts (the largest the protocol allows is 16 MiB - 1).
const FRAME_BYTES: u32 = 1 << 20;
/// HTTP/2 stream and connection receive windows.
const WINDOW_BYTES: u32 = 64 << 20;

pub(crate) struct TaskStreamConfig {
    pub task_id: u64,
    pub address: String,
    pub client_id: u64,
    /// Cross-trainer cache jobs: whose cursor into the task's cache this stream reads.
    pub trainer_id: String,
    /// Credits this stream may hold at once.
    pub max_credits: u32,
}

enum FetchError {
    /// Try again later (worker unreachable, task not started yet, stream broken).
    Retry(String),
    /// The epoch fails.
    Fatal(ClientError),
}

/// Reads the task until its end. `Ok` also when cancelled or when the consumer went away.
pub(crate) async fn run(
    config: TaskStreamConfig,
    permits: Arc<Semaphore>,
    out: flume::Sender<Delivery>,
    finished: watch::Receiver<bool>,
    cancel: CancellationToken,
) -> Result<(), ClientError> {
    let mut backoff = Duration::from_millis(10);
    loop {
        let attempt = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            result = fetch(&config, &permits, &out) => result,
        };
        match attempt {
            Ok(()) => return Ok(()),
            Err(FetchError::Fatal(e)) => return Err(e),
            Err(FetchError::Retry(message)) => {
                if *finished.borrow() {
                    return Ok(());
                }
                tracing::debug!(task = config.task_id, worker = %config.address, %message, "retrying task stream");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

fn classify(address: &str, status: tonic::Status) -> FetchError {
    if !is_worker_refusal(status.code()) {
        FetchError::Retry(status.message().to_string())
    } else {
        FetchError::Fatal(ClientError::Worker {
            address: address.to_string(),
            message: status.message().to_string(),
        })
    }
}

/// Credits held: permits taken from the epoch's semaphore for elements requested and not yet
/// received, kept as one merged permit.
struct Held {
    permit: Option<OwnedSemaphorePermit>,
}

impl Held {
    fn count(&self) -> u32 {
        self.permit.as_ref().map_or(0, |p| p.num_permits() as u32)
    }

    /// Takes up to `max - held` more permits, waiting for one only when none is held and `wait`.
    async fn top_up(&mut self, permits: &Arc<Semaphore>, max: u32, wait: bool) -> u32 {
        let mut taken = 0;
        if wait && self.count() == 0 {
            let first = permits
                .clone()
                .acquire_owned()
                .await
                .expect("the permit semaphore is never closed");
            self.add(first);
            taken += 1;
        }
        let want = max
            .saturating_sub(self.count())
            .min(permits.available_permits() as u32);
        if want > 0 {
            if let Ok(more) = permits.clone().try_acquire_many_owned(want) {
                self.add(more);
                taken += want;
            }
        }
        taken
    }

    fn add(&mut self, permit: OwnedSemaphorePermit) {
        match &mut self.permit {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
    }

    /// Hands over the permits of `n` received elements.
    fn take(&mut self, n: usize) -> Option<OwnedSemaphorePermit> {
        if n == 0 {
            return None;
        }
        let held = self.permit.as_mut()?;
        if held.num_permits() == n {
            return self.permit.take();
        }
        held.split(n)
    }
}

async fn fetch(
    config: &TaskStreamConfig,
    permits: &Arc<Semaphore>,
    out: &flume::Sender<Delivery>,
) -> Result<(), FetchError> {
    let endpoint = Endpoint::from_shared(format!("http://{}", config.address))
        .map_err(|e| {
            FetchError::Fatal(ClientError::InvalidArgument(format!(
                "worker address {}: {e}",
                config.address
            )))
        })?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        // HTTP/2 defaults (16 KiB frames, a 2 MiB stream window) cut a 1 MiB element into 64
        // frames and let only two be in flight before a window update. Credits already bound
        // what the worker sends, so larger windows add no memory beyond that bound.
        .max_frame_size(FRAME_BYTES)
        .initial_stream_window_size(WINDOW_BYTES)
        .initial_connection_window_size(WINDOW_BYTES);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| FetchError::Retry(e.to_string()))?;
    let mut worker = WorkerClient::new(channel).max_decoding_message_size(usize::MAX);

    // Permits held = credits granted to the worker and not yet used.
    let mut held = Held { permit: None };
    let granted = held.top_up(permits, config.max_credits, true).await;
    let (credits_tx, credits_rx) = mpsc::channel(16);
    credits_tx
        .send(FetchRequest {
            task_id: config.task_id,
            credits: granted,
            client_id: config.client_id,
            trainer_id: config.trainer_id.clone(),
        })
        .await
        .map_err(|_| FetchError::Retry("request stream closed".into()))?;
    let mut stream = worker
        .fetch(ReceiverStream::new(credits_rx))
        .await
        .map_err(|s| classify(&config.address, s))?
        .into_inner();
    // Grants are at least this large (except the first), so the worker's messages stay large.
    let half = (config.max_credits / 2).max(1);
    loop {
        // Refill once half the credits are used, while reading: permits come back as the
        // caller takes elements, and noticing them only when the next message arrived left the
        // worker waiting for credits most of the time (stop-and-go with large elements).
        let refill = held.count() <= config.max_credits / 2;
        let message = tokio::select! {
            biased;
            message = stream.message() => message,
            permit = permits.clone().acquire_many_owned(half), if refill => {
                held.add(permit.expect("the permit semaphore is never closed"));
                let granted = half + held.top_up(permits, config.max_credits, false).await;
                let more = FetchRequest {
                    task_id: config.task_id,
                    credits: granted,
                    client_id: config.client_id,
                    trainer_id: config.trainer_id.clone(),
                };
                // A closed request side means the worker already ended the response (its last
                // batch may still be unread): keep reading, the response says what happened.
                let _ = credits_tx.send(more).await;
                continue;
            }
        };
        let batch = match message {
            Ok(Some(batch)) => batch,
            Ok(None) => return Err(FetchError::Retry("the worker closed the stream".into())),
            Err(status) => return Err(classify(&config.address, status)),
        };
        if !batch.error.is_empty() {
            return Err(FetchError::Fatal(ClientError::Worker {
                address: config.address.clone(),
                message: batch.error,
            }));
        }
        let elements = sluice_dataset::Packed::from_wire(
            batch.packed,
            batch.lengths,
            batch.each_length,
            batch.payloads,
        )
        .map_err(|e| {
            FetchError::Fatal(ClientError::Worker {
                address: config.address.clone(),
                message: format!("a malformed message: {e}"),
            })
        })?;
        if !elements.is_empty() {
            let permit = held.take(elements.len()).ok_or_else(|| {
                FetchError::Fatal(ClientError::Worker {
                    address: config.address.clone(),
                    message: "the worker sent more elements than it was granted credits for".into(),
                })
            })?;
            // Decoded as the caller takes them (see `Elements`).
            let delivered = Delivered {
                elements: Elements::Packed(elements.into_decoder()),
                permit: Some(permit),
            };
            if out.send_async(Ok(delivered)).await.is_err() {
                return Ok(()); // the consumer went away
            }
        }
        if batch.end_of_sequence {
            return Ok(());
        }
    }
}
