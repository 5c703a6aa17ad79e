//! Reading one task: a `Fetch` stream to its worker with credit-based flow control, over the
//! raw fetch transport (`raw_fetch`; its failures read as the gRPC stream's statuses would).
//!
//! The stream never asks for more elements than it holds permits for (one permit per element,
//! from the epoch's shared semaphore), and hands each arriving element to the caller together
//! with its permit. A broken stream (worker down or restarting, task not there yet) is retried
//! with backoff until the worker serves the task again.
//!
//! Nothing is lost with a broken connection to a live worker, and nothing is delivered twice:
//! the reader acknowledges what it received (`Resume`, in every request), the worker keeps what
//! was not acknowledged, and a stream opened again resumes at the reader's count; elements the
//! reader already has (numbered below its count) are dropped on arrival. So a task is retried
//! until its end arrives, also once the iteration is finished (that only means there is no new
//! work): only a worker that is gone (it refuses connections, or no longer holds the task), or
//! one unreachable for `UNREACHABLE_GRACE` after the iteration finished, ends the stream without
//! its end. What such a worker held is lost with it.
//!
//! The stream presents the reader's credentials (the `ClientSecurity` its dispatcher client
//! has): TLS when it has a CA, its token in the handshake. A worker's refusal of them
//! (`Unauthenticated`, `PermissionDenied`), or a worker certificate the reader cannot verify,
//! fails the epoch at once: retrying cannot change the answer.

use crate::delivery::{Delivered, Delivery, Elements};
use crate::error::{is_worker_refusal, worker_refusal, ClientError};
use crate::read_ahead::ReadAhead;
use crate::received::Received;
use sluice_element::{DatasetError, PythonException};
use sluice_proto::worker::{ElementBatch, FetchRequest};
use sluice_rpc::raw_fetch;
use sluice_security::{Admission, ClientSecurity};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

pub(crate) struct TaskStreamConfig {
    pub task_id: u64,
    pub address: String,
    pub client_id: u64,
    /// The dispatcher's admission of `client_id` to the task's iteration, sent with the first
    /// request of every stream.
    pub admission: Admission,
    /// Cross-trainer cache jobs: whose cursor into the task's cache this stream reads.
    pub trainer_id: String,
    /// Credits this stream may hold at once.
    pub max_credits: u32,
    /// TLS settings and token presented to the worker.
    pub security: ClientSecurity,
    /// Where the indices of what arrives are recorded (exactly-once tasks number their
    /// elements; other tasks' messages carry no indices).
    pub received: Received,
}

/// After the iteration finished, how long a worker that cannot be reached (no answer, as in a
/// partition) is tried before its task is given up: it may still hold elements for this reader.
const UNREACHABLE_GRACE: Duration = Duration::from_secs(10);

enum FetchError {
    /// Try again later (worker unreachable, task not started yet, stream broken); what the
    /// failure says of the worker.
    Retry(String, Worker),
    /// The epoch fails.
    Fatal(ClientError),
}

/// What a failed attempt says of the task's worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Worker {
    /// It answered: the stream broke, or the task is not there yet.
    Alive,
    /// It does not answer (a connection timed out).
    Unreachable,
    /// Nothing listens at its address, or it does not hold the task (it restarted): what it
    /// held for this reader is gone.
    Gone,
}

/// Where this reader stands in the task's sequence (see the module header): the worker
/// incarnation it counts in (0 before it heard of one) and how many elements it received.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Resume {
    incarnation: u64,
    received: u64,
}

impl Resume {
    /// A message of `n` elements numbered from `first` in `incarnation` (0: a worker that does
    /// not number them) arrived: how many of its first elements this reader already has. A
    /// worker of another incarnation (a restarted one) numbers from 0 again. A message that
    /// starts past what was received means elements were skipped: an error.
    fn admit(&mut self, incarnation: u64, first: u64, n: usize) -> Result<usize, String> {
        if incarnation == 0 {
            return Ok(0);
        }
        if incarnation != self.incarnation {
            *self = Resume {
                incarnation,
                received: 0,
            };
        }
        if first > self.received {
            return Err(format!(
                "the worker skipped elements {}..{first} of the task",
                self.received
            ));
        }
        let skip = ((self.received - first) as usize).min(n);
        self.received = self.received.max(first + n as u64);
        Ok(skip)
    }

    /// A request granting `credits` and acknowledging what was received.
    fn request(&self, config: &TaskStreamConfig, credits: u32) -> FetchRequest {
        FetchRequest {
            task_id: config.task_id,
            credits,
            client_id: config.client_id,
            trainer_id: config.trainer_id.clone(),
            acknowledges: true,
            received: self.received,
            incarnation: self.incarnation,
            window: config.max_credits,
            ..Default::default()
        }
    }
}

/// Reads the task until its end. `Ok` also when cancelled or when the consumer went away.
pub(crate) async fn run(
    config: TaskStreamConfig,
    read_ahead: Arc<ReadAhead>,
    out: flume::Sender<Delivery>,
    finished: watch::Receiver<bool>,
    cancel: CancellationToken,
) -> Result<(), ClientError> {
    let mut backoff = Duration::from_millis(10);
    let mut resume = Resume::default();
    // Since when the worker has not answered (reset by any answer).
    let mut unreachable_since: Option<Instant> = None;
    loop {
        let before = resume;
        let attempt = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            result = fetch(&config, &read_ahead, &out, &mut resume) => result,
        };
        if resume != before {
            // The stream made progress before it broke: a blip, not a worker that is down.
            backoff = Duration::from_millis(10);
        }
        match attempt {
            Ok(()) => return Ok(()),
            Err(FetchError::Fatal(e)) => return Err(e),
            Err(FetchError::Retry(message, worker)) => {
                let unreachable_for = match worker {
                    Worker::Unreachable => {
                        unreachable_since.get_or_insert_with(Instant::now).elapsed()
                    }
                    _ => {
                        unreachable_since = None;
                        Duration::ZERO
                    }
                };
                if gives_up(*finished.borrow(), worker, unreachable_for) {
                    tracing::debug!(task = config.task_id, worker = %config.address, %message, "giving up the task of a worker that is gone");
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

/// Whether a task stream stops retrying after a failed attempt that says `worker` of the
/// task's worker (unreachable for `unreachable_for` so far). A finished iteration has no new
/// work, so a worker that is gone has nothing left for this reader; a live one may still hold
/// elements it sent and that never arrived, so it is retried until the task's end arrives.
fn gives_up(finished: bool, worker: Worker, unreachable_for: Duration) -> bool {
    finished
        && match worker {
            Worker::Alive => false,
            Worker::Unreachable => unreachable_for >= UNREACHABLE_GRACE,
            Worker::Gone => true,
        }
}

fn classify(config: &TaskStreamConfig, status: tonic::Status) -> FetchError {
    let address = &config.address;
    if !is_worker_refusal(status.code()) {
        // The worker's answer for a task it does not hold (tf.data's words): not yet, or no
        // longer, which only matters once the iteration is finished.
        let worker = if status.message() == format!("Task {} not found", config.task_id) {
            Worker::Gone
        } else {
            Worker::Alive
        };
        FetchError::Retry(status.message().to_string(), worker)
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
    read_ahead: &ReadAhead,
    out: &flume::Sender<Delivery>,
    resume: &mut Resume,
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
            std::io::ErrorKind::InvalidData => FetchError::Fatal(ClientError::worker(
                config.address.clone(),
                format!("TLS handshake failed: {e}"),
            )),
            std::io::ErrorKind::ConnectionRefused => FetchError::Retry(e.to_string(), Worker::Gone),
            _ => FetchError::Retry(e.to_string(), Worker::Unreachable),
        })?;

    let permits = &read_ahead.permits();
    // Permits held = credits granted to the worker and not yet used.
    let mut held = Held { permit: None };
    let granted = held.top_up(permits, config.max_credits, true).await;
    // The admission goes with the first request: the worker checks it before it serves.
    // A worker on this machine may offer a shared memory region for large payloads.
    let first = FetchRequest {
        admission: config.admission.to_bytes(),
        shared_memory: true,
        ..resume.request(config, granted)
    };
    // Whether the worker serves the task is the stream's first message (as a status it would
    // have answered the gRPC call with).
    let token = config.security.token().map(|t| t.expose().as_bytes());
    let (credits_tx, mut stream) = raw_fetch::open(socket, token, first, config.max_credits)
        .await
        .map_err(|e| FetchError::Retry(e.to_string(), Worker::Alive))?;
    loop {
        // Grants are at least this large (except the first), so the worker's messages stay
        // large: half the stream's credits, or of the read-ahead window while that is smaller
        // (it grows while the caller starves).
        let half = read_ahead.grant(config.max_credits);
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
                let more = resume.request(config, granted);
                // A closed request side means the worker already ended the response (its last
                // batch may still be unread): keep reading, the response says what happened.
                let _ = credits_tx.send(more).await;
                continue;
            }
        };
        let batch = match message {
            Ok(Some(batch)) => batch,
            Ok(None) => {
                return Err(FetchError::Retry(
                    "the worker closed the stream".into(),
                    Worker::Alive,
                ))
            }
            Err(status) => return Err(classify(config, status)),
        };
        if !batch.error.is_empty() {
            return Err(FetchError::Fatal(batch_error(&config.address, batch)));
        }
        let mut elements = sluice_element::Packed::from_wire(
            batch.packed,
            batch.lengths,
            batch.each_length,
            batch.payloads,
        )
        .map_err(|e| {
            FetchError::Fatal(ClientError::worker(
                config.address.clone(),
                format!("a malformed message: {e}"),
            ))
        })?;
        let skip = resume
            .admit(batch.incarnation, batch.first_sequence, elements.len())
            .map_err(|message| {
                FetchError::Fatal(ClientError::worker(config.address.clone(), message))
            })?;
        let indices = config
            .received
            .record_message(config.task_id, &batch.index_runs, elements.len(), skip)
            .map_err(|message| {
                FetchError::Fatal(ClientError::worker(config.address.clone(), message))
            })?;
        if !elements.is_empty() {
            let mut permit = held.take(elements.len()).ok_or_else(|| {
                FetchError::Fatal(ClientError::worker(
                    config.address.clone(),
                    "the worker sent more elements than it was granted credits for",
                ))
            })?;
            if skip > 0 {
                // Already delivered (a resend that overlaps what arrived before the break):
                // dropped, and their permits go back.
                drop(elements.split_to(skip));
                drop(permit.split(skip));
            }
            if !elements.is_empty() {
                // Decoded as the caller takes them (see `Elements`).
                let delivered = Delivered {
                    bytes: elements.byte_len() as u64,
                    elements: Elements::Packed(elements.into_decoder()),
                    permit: Some(permit),
                    indices: (!indices.is_empty()).then_some((config.task_id, indices)),
                };
                if out.send_async(Ok(delivered)).await.is_err() {
                    return Ok(()); // the consumer went away
                }
            }
        }
        if batch.end_of_sequence {
            // The worker keeps what it sent until it hears that everything arrived.
            let _ = credits_tx.try_send(resume.request(config, 0));
            return Ok(());
        }
        if held.count() == 0 {
            // No credits left, and none to grant until the caller takes elements (a reader
            // that holds its window full): acknowledge what arrived now, since an exactly-once
            // task's end waits for its readers' acknowledgements.
            let _ = credits_tx.try_send(resume.request(config, 0));
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
        // 0: a worker that sends no code.
        None => ClientError::Worker {
            address: address.to_string(),
            message: batch.error,
            code: match tonic::Code::from_i32(batch.error_code) {
                tonic::Code::Ok => tonic::Code::Internal,
                code => code,
            },
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
            ClientError::Worker { address, message, code: tonic::Code::Internal }
                if address == "w:1" && message == "boom"
        ));
        // The worker's code is the class the reader raises the failure with.
        let missing = ElementBatch {
            error: "cannot read '/d/a': No such file or directory".into(),
            error_code: tonic::Code::NotFound as i32,
            ..Default::default()
        };
        assert!(matches!(
            batch_error("w:1", missing),
            ClientError::Worker {
                code: tonic::Code::NotFound,
                ..
            }
        ));
    }

    /// A raw fetch stream's status frames become the gRPC statuses the worker would have failed
    /// the call with; classifying them must not depend on the transport.
    fn config() -> TaskStreamConfig {
        TaskStreamConfig {
            task_id: 7,
            address: "w:1".into(),
            client_id: 3,
            admission: Default::default(),
            trainer_id: String::new(),
            max_credits: 16,
            security: ClientSecurity::default(),
            received: Received::default(),
        }
    }

    #[test]
    fn a_missing_task_is_retried_and_a_deleted_one_fails_the_epoch() {
        let missing = classify(&config(), tonic::Status::unavailable("Task 7 not found"));
        assert!(matches!(missing, FetchError::Retry(m, Worker::Gone) if m == "Task 7 not found"));
        let broken = classify(
            &config(),
            tonic::Status::unavailable("raw fetch stream: reset"),
        );
        assert!(matches!(broken, FetchError::Retry(_, Worker::Alive)));
        let deleted = classify(
            &config(),
            tonic::Status::failed_precondition(
                "Got request for local task 7 of worker w:1, which has been deleted.",
            ),
        );
        assert!(matches!(
            deleted,
            FetchError::Fatal(ClientError::Worker { address, message, code: tonic::Code::FailedPrecondition })
                if address == "w:1" && message.contains("which has been deleted")
        ));
    }

    #[test]
    fn a_live_worker_is_retried_until_the_end_even_after_the_iteration_finished() {
        let grace = UNREACHABLE_GRACE;
        let rows = [
            // (finished, worker, unreachable for, gives up)
            (false, Worker::Alive, Duration::ZERO, false),
            (false, Worker::Gone, Duration::ZERO, false),
            (false, Worker::Unreachable, grace * 10, false),
            (true, Worker::Alive, Duration::ZERO, false),
            (true, Worker::Unreachable, grace / 2, false),
            (true, Worker::Unreachable, grace, true),
            (true, Worker::Gone, Duration::ZERO, true),
        ];
        for (finished, worker, unreachable_for, want) in rows {
            assert_eq!(
                gives_up(finished, worker, unreachable_for),
                want,
                "{finished} {worker:?} {unreachable_for:?}"
            );
        }
    }

    /// One arriving message per row: where the reader stood, the message's (incarnation, first
    /// sequence number, elements), and the elements dropped as already delivered, or the error.
    #[test]
    fn resent_elements_are_delivered_once_and_a_gap_is_an_error() {
        let at = |incarnation, received| Resume {
            incarnation,
            received,
        };
        type Row = (Resume, (u64, u64, usize), Result<usize, ()>, Resume);
        let rows: Vec<Row> = vec![
            // A worker that does not number its messages: everything is new, nothing counted.
            (at(0, 0), (0, 0, 5), Ok(0), at(0, 0)),
            // The first message: the reader learns the incarnation.
            (at(0, 0), (9, 0, 5), Ok(0), at(9, 5)),
            // In order.
            (at(9, 5), (9, 5, 3), Ok(0), at(9, 8)),
            // A resend overlapping what arrived: the first two are dropped.
            (at(9, 8), (9, 6, 4), Ok(2), at(9, 10)),
            // A resend of nothing new.
            (at(9, 10), (9, 4, 6), Ok(6), at(9, 10)),
            // The end's message (no elements) at the reader's count.
            (at(9, 10), (9, 10, 0), Ok(0), at(9, 10)),
            // A restarted worker numbers from 0 again.
            (at(9, 10), (4, 0, 2), Ok(0), at(4, 2)),
            // Elements skipped: an error, and nothing counted.
            (at(9, 10), (9, 12, 1), Err(()), at(9, 10)),
        ];
        for (before, (incarnation, first, n), want, after) in rows {
            let mut resume = before;
            let got = resume.admit(incarnation, first, n).map_err(|_| ());
            assert_eq!(
                (got, resume),
                (want, after),
                "{before:?} + {incarnation}/{first}/{n}"
            );
        }
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
                classify(&config(), status),
                FetchError::Fatal(ClientError::Rpc { code: c, message })
                    if c == code && message.starts_with("worker w:1: ")
            ));
        }
    }
}
