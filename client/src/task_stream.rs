//! Reading one task: a `Fetch` stream to its worker with credit-based flow control, over the
//! raw fetch transport (`raw_fetch`; its failures read as the gRPC stream's statuses would).
//!
//! The stream never asks for more elements than it holds permits for (one permit per element,
//! from the epoch's shared semaphore), and hands each arriving element to the caller together
//! with its permit. A broken stream (worker down or restarting, task not there yet) is retried
//! with backoff until the worker serves the task again, or until the iteration is finished, at
//! which point a task that cannot be reached has nothing left for this client.
//!
//! The stream presents the reader's credentials (the `ClientSecurity` its dispatcher client
//! has): TLS when it has a CA, its token in the handshake. A worker's refusal of them
//! (`Unauthenticated`, `PermissionDenied`), or a worker certificate the reader cannot verify,
//! fails the epoch at once: retrying cannot change the answer.

use crate::element_stream::{Delivered, Delivery, Elements};
use crate::error::{is_worker_refusal, worker_refusal, ClientError};
use sluice_dataset::{DatasetError, PythonException};
use sluice_proto::worker::{ElementBatch, FetchRequest};
use sluice_rpc::raw_fetch;
use sluice_security::ClientSecurity;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

pub(crate) struct TaskStreamConfig {
    pub task_id: u64,
    pub address: String,
    pub client_id: u64,
    /// Cross-trainer cache jobs: whose cursor into the task's cache this stream reads.
    pub trainer_id: String,
    /// Credits this stream may hold at once.
    pub max_credits: u32,
    /// TLS settings and token presented to the worker.
    pub security: ClientSecurity,
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
        FetchError::Fatal(worker_refusal(address, status))
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
    // The raw fetch stream (see `raw_frame`): the worker's `Fetch` without gRPC, so a large
    // tensor's bytes are not copied through a protobuf encoding and decode buffer on the way.
    let socket = raw_fetch::connect(&config.address, &config.security)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidInput => FetchError::Fatal(ClientError::InvalidArgument(
                format!("worker address {}: {e}", config.address),
            )),
            // rustls' verdict on the worker's certificate: a setup to fix, not a blip.
            std::io::ErrorKind::InvalidData => FetchError::Fatal(ClientError::Worker {
                address: config.address.clone(),
                message: format!("TLS handshake failed: {e}"),
            }),
            _ => FetchError::Retry(e.to_string()),
        })?;

    // Permits held = credits granted to the worker and not yet used.
    let mut held = Held { permit: None };
    let granted = held.top_up(permits, config.max_credits, true).await;
    let first = FetchRequest {
        task_id: config.task_id,
        credits: granted,
        client_id: config.client_id,
        trainer_id: config.trainer_id.clone(),
    };
    // Whether the worker serves the task is the stream's first message (as a status it would
    // have answered the gRPC call with).
    let token = config.security.token().map(|t| t.expose().as_bytes());
    let (credits_tx, mut stream) = raw_fetch::open(socket, token, first, config.max_credits)
        .await
        .map_err(|e| FetchError::Retry(e.to_string()))?;
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
            return Err(FetchError::Fatal(batch_error(&config.address, batch)));
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

/// The error a failed batch ends the epoch with: a Python function's exception as
/// `DatasetError::Python` (the reader raises it again), anything else as the worker's text.
fn batch_error(address: &str, batch: ElementBatch) -> ClientError {
    match batch.python_exception {
        Some(exception) => ClientError::WorkerPipeline {
            address: address.to_string(),
            error: Box::new(DatasetError::Python(Box::new(PythonException::from_proto(
                exception,
            )))),
        },
        None => ClientError::Worker {
            address: address.to_string(),
            message: batch.error,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_exception_from_the_worker_is_raised_again_with_its_fields() {
        let exception = sluice_proto::worker::PythonException {
            type_module: "builtins".into(),
            type_name: "KeyError".into(),
            message: "'x'".into(),
            traceback: "Traceback (most recent call last):\n  File \"m.py\", line 3".into(),
            function: "m.f".into(),
        };
        let batch = ElementBatch {
            error: "python function 'm.f' raised KeyError: 'x'".into(),
            python_exception: Some(exception.clone()),
            ..Default::default()
        };
        let error = batch_error("w:1", batch);
        assert_eq!(
            error.to_string(),
            "Failed to get element from worker w:1: python function 'm.f' raised KeyError: 'x'"
        );
        let ClientError::WorkerPipeline { error, .. } = error else {
            panic!("not a pipeline error: {error:?}");
        };
        assert_eq!(
            *error,
            DatasetError::Python(Box::new(PythonException::from_proto(exception)))
        );
        let plain = ElementBatch {
            error: "boom".into(),
            ..Default::default()
        };
        assert!(matches!(
            batch_error("w:1", plain),
            ClientError::Worker { address, message } if address == "w:1" && message == "boom"
        ));
    }

    /// A raw fetch stream's status frames become the gRPC statuses the worker would have failed
    /// the call with; classifying them must not depend on the transport.
    #[test]
    fn a_missing_task_is_retried_and_a_deleted_one_fails_the_epoch() {
        let missing = classify("w:1", tonic::Status::unavailable("Task 7 not found"));
        assert!(matches!(missing, FetchError::Retry(m) if m == "Task 7 not found"));
        let deleted = classify(
            "w:1",
            tonic::Status::failed_precondition(
                "Got request for local task 7 of worker w:1, which has been deleted.",
            ),
        );
        assert!(matches!(
            deleted,
            FetchError::Fatal(ClientError::Worker { address, message })
                if address == "w:1" && message.contains("which has been deleted")
        ));
    }

    /// A worker that refuses the reader's credentials refuses them on every retry.
    #[test]
    fn a_refused_credential_fails_the_epoch() {
        for status in [
            tonic::Status::unauthenticated("the token presented is not valid on this server"),
            tonic::Status::permission_denied("worker 'w' may not call Fetch"),
        ] {
            let code = status.code();
            assert!(matches!(
                classify("w:1", status),
                FetchError::Fatal(ClientError::Rpc { code: c, message })
                    if c == code && message.starts_with("worker w:1: ")
            ));
        }
    }
}
