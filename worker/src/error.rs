//! `WorkerError`: why a worker could not start, a task could not run, or a reader's request was
//! refused; and the one map from it to the gRPC status a reader sees.
//!
//! The status code decides what the reader does next: the client retries a worker's
//! `Unavailable` (as it retries a worker it cannot reach) until the task is served again, and
//! takes `InvalidArgument`, `FailedPrecondition` and `NotFound` from a worker as its final
//! answer, which fails the reader's epoch. The map below has no catch-all arm, so a new variant
//! must choose its code; nothing else in this crate builds a `Status`.

use crate::cross_trainer_cache::EMPTY_TRAINER_ID;
use crate::reader_ledger::AckError;
use crate::round_robin::RoundError;
use sluice_element::DatasetError;
use sluice_rpc::RpcError;
use sluice_security::{AdmissionRefusal, SecurityError};
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{0}")]
    Config(String),
    #[error("bind {addr}: {message}")]
    Bind { addr: String, message: String },
    #[error("dispatcher: {0}")]
    Dispatcher(#[from] RpcError),
    /// The dispatcher refused to register this worker (e.g. its address has no free entry in
    /// the static-sharding worker list); the dispatcher's message as is.
    #[error("{0}")]
    Registration(String),
    #[error("task {task_id}: {source}")]
    Task { task_id: u64, source: DatasetError },
    /// A reader asked for a task this worker does not hold: the dispatcher has not assigned it
    /// here yet, or this worker restarted and has not been given it again. The code is
    /// `Unavailable`, not the `NotFound` the dispatcher answers for a task it does not know:
    /// the dispatcher knows every task, so its answer is final, while a worker knows only what
    /// it has been given so far, and its readers must keep retrying until the task arrives (a
    /// `NotFound` would fail their epoch). tf.data's worker answers the same, with this message.
    #[error("Task {task_id} not found")]
    TaskNotHereYet { task_id: u64 },
    /// A reader asked for a task that ran here and was deleted: it is probably re-creating an
    /// iteration that has finished. tf.data's message, word for word.
    #[error(
        "Got request for local task {task_id} of worker {worker}, which has been deleted. You \
         may be creating a duplicate iteration which has already finished. To fix this, make \
         sure to create your dataset only once, as opposed to re-creating it repeatedly inside \
         a loop."
    )]
    TaskDeleted { task_id: u64, worker: String },
    /// A fetch stream ended before its first request, which names the task.
    #[error("a fetch stream must start with a request naming the task")]
    NoFirstRequest,
    /// A cross-trainer cache task was fetched without a trainer id (tf.data's message).
    #[error("{}", EMPTY_TRAINER_ID)]
    EmptyTrainerId,
    /// A coordinated read (`GetElement`) of a task that is not read in rounds (tf.data's
    /// message).
    #[error(
        "RoundRobinTaskRunner needs to know the consumer index and element index of each \
         request."
    )]
    NotRoundRobin { task_id: u64 },
    /// A coordinated read got no element: the task stopped, or its round failed.
    #[error(transparent)]
    Round(#[from] RoundError),
    /// A raw fetch client sent more requests than the worker queues for a stream.
    #[error("more than {limit} fetch requests waiting")]
    TooManyRequests { limit: usize },
    /// The reader's request stream failed before it named a task; its status, passed on as is.
    #[error("{0}")]
    Reader(Status),
    /// A raw fetch client of another protocol version.
    #[error(
        "raw fetch protocol version {got} is not spoken here: this worker speaks version \
         {spoken}; the reader and the worker must be the same release"
    )]
    RawVersion { got: u8, spoken: u8 },
    /// The worker's TLS or credentials cannot be used, or it would serve beyond loopback
    /// unprotected: it does not start.
    #[error("{0}")]
    Security(#[from] SecurityError),
    /// A raw fetch caller presented no credential, or one this worker does not know.
    #[error("{0}")]
    Unauthenticated(String),
    /// A raw fetch caller whose role may not read elements.
    #[error("{0}")]
    PermissionDenied(String),
    /// A reader acknowledged elements of task `task_id` it cannot have received.
    #[error("task {task_id}: {source}")]
    Ack { task_id: u64, source: AckError },
    /// A reader of task `task_id` presented no admission to its iteration, or one that is not
    /// the dispatcher's admission of the client it names. The message never shows a byte of
    /// what was presented.
    #[error("{}", not_admitted(*task_id, *iteration_id, *client_id, *refusal))]
    NotAdmitted {
        task_id: u64,
        iteration_id: u64,
        client_id: u64,
        refusal: AdmissionRefusal,
    },
    /// This worker has not heard the cluster's fetch key from the dispatcher yet, so it cannot
    /// check a reader's admission: the reader retries until it has.
    #[error(
        "task {task_id}: this worker has not yet received the cluster's fetch key from the \
         dispatcher, so it cannot check the reader's admission; retry"
    )]
    NoFetchKey { task_id: u64 },
}

fn not_admitted(
    task_id: u64,
    iteration_id: u64,
    client_id: u64,
    refusal: AdmissionRefusal,
) -> String {
    let why = match refusal {
        AdmissionRefusal::Missing => "the request carries no admission".to_string(),
        AdmissionRefusal::Invalid => format!(
            "the admission presented is not the dispatcher's admission of client {client_id} \
             to iteration {iteration_id}"
        ),
    };
    format!(
        "task {task_id} of iteration {iteration_id}: {why}; only readers the dispatcher \
         admitted to the iteration (GetOrCreateIteration) may read its tasks"
    )
}

impl WorkerError {
    pub fn is_retryable(&self) -> bool {
        match self {
            WorkerError::Config(_) => false,
            WorkerError::Bind { .. } => false,
            WorkerError::Dispatcher(e) => e.is_retryable(),
            WorkerError::Registration(_) => false,
            WorkerError::Task { source, .. } => source.is_retryable(),
            WorkerError::TaskNotHereYet { .. } => true,
            WorkerError::TaskDeleted { .. } => false,
            WorkerError::NoFirstRequest => false,
            WorkerError::EmptyTrainerId => false,
            WorkerError::NotRoundRobin { .. } => false,
            WorkerError::Round(RoundError::Stopped) => true,
            WorkerError::Round(RoundError::Failed(_)) => false,
            WorkerError::TooManyRequests { .. } => true,
            // The reader's own stream broke: whether to open another is the reader's decision.
            WorkerError::Reader(_) => false,
            WorkerError::RawVersion { .. } => false,
            WorkerError::Security(_) => false,
            WorkerError::Unauthenticated(_) => false,
            WorkerError::PermissionDenied(_) => false,
            WorkerError::Ack { .. } => false,
            WorkerError::NotAdmitted { .. } => false,
            WorkerError::NoFetchKey { .. } => true,
        }
    }
}

impl From<WorkerError> for Status {
    fn from(error: WorkerError) -> Status {
        let message = error.to_string();
        let code = match error {
            WorkerError::Config(_) => Code::InvalidArgument,
            WorkerError::Bind { .. } => Code::FailedPrecondition,
            WorkerError::Dispatcher(e) if e.is_retryable() => Code::Unavailable,
            WorkerError::Dispatcher(_) => Code::FailedPrecondition,
            WorkerError::Registration(_) => Code::FailedPrecondition,
            WorkerError::Task { source, .. } if source.is_retryable() => Code::Unavailable,
            // Also an op past the memory budget (`DatasetError::ResourceExhausted`): readers
            // retry a worker's RESOURCE_EXHAUSTED, and the same definition would fail again.
            WorkerError::Task { .. } => Code::FailedPrecondition,
            WorkerError::TaskNotHereYet { .. } => Code::Unavailable,
            WorkerError::TaskDeleted { .. } => Code::FailedPrecondition,
            WorkerError::NoFirstRequest => Code::InvalidArgument,
            WorkerError::EmptyTrainerId => Code::InvalidArgument,
            WorkerError::NotRoundRobin { .. } => Code::FailedPrecondition,
            // The task stopped (deleted, or the worker is shutting down): the consumer retries
            // elsewhere or later, as after a crash.
            WorkerError::Round(RoundError::Stopped) => Code::Unavailable,
            WorkerError::Round(RoundError::Failed(_)) => Code::FailedPrecondition,
            WorkerError::TooManyRequests { .. } => Code::ResourceExhausted,
            WorkerError::Reader(status) => return status,
            WorkerError::RawVersion { .. } => Code::FailedPrecondition,
            WorkerError::Security(_) => Code::FailedPrecondition,
            WorkerError::Unauthenticated(_) => Code::Unauthenticated,
            WorkerError::PermissionDenied(_) => Code::PermissionDenied,
            WorkerError::Ack { .. } => Code::InvalidArgument,
            WorkerError::NotAdmitted { .. } => Code::PermissionDenied,
            WorkerError::NoFetchKey { .. } => Code::Unavailable,
        };
        Status::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row per variant (two where the code depends on retryability). Adding a variant
    /// breaks `variant_has_a_row` until it gets a row here.
    fn rows() -> Vec<(WorkerError, Code, &'static str)> {
        vec![
            (
                WorkerError::Ack {
                    task_id: 7,
                    source: AckError {
                        received: 9,
                        sent: 4,
                    },
                },
                Code::InvalidArgument,
                "task 7: the reader acknowledged 9 elements, but only 4 were sent",
            ),
            (
                WorkerError::Config("buffer size must be positive".into()),
                Code::InvalidArgument,
                "buffer size must be positive",
            ),
            (
                WorkerError::Bind {
                    addr: "127.0.0.1:1".into(),
                    message: "address in use".into(),
                },
                Code::FailedPrecondition,
                "bind 127.0.0.1:1: address in use",
            ),
            (
                WorkerError::Dispatcher(RpcError::Unavailable {
                    attempts: 3,
                    message: "connection refused".into(),
                }),
                Code::Unavailable,
                "dispatcher: dispatcher unavailable after 3 attempts: connection refused",
            ),
            (
                WorkerError::Dispatcher(RpcError::NotFound("Task 4 not found".into())),
                Code::FailedPrecondition,
                "dispatcher: Task 4 not found",
            ),
            (
                WorkerError::Registration("no free worker address".into()),
                Code::FailedPrecondition,
                "no free worker address",
            ),
            (
                WorkerError::Task {
                    task_id: 3,
                    source: DatasetError::Splits {
                        message: "no leader".into(),
                        retryable: true,
                    },
                },
                Code::Unavailable,
                "task 3: cannot get next split: no leader",
            ),
            (
                WorkerError::Task {
                    task_id: 3,
                    source: DatasetError::ResourceExhausted {
                        op: "shuffle".into(),
                        held: 90,
                        needed: 20,
                        limit: 100,
                        in_use: 90,
                        setting: "--memory-budget".into(),
                    },
                },
                Code::FailedPrecondition,
                "task 3: shuffle needs 20 more bytes (it holds 90), more than the memory budget \
                 of 100 bytes has left (90 in use); raise --memory-budget or make the shuffle \
                 smaller",
            ),
            (
                WorkerError::Task {
                    task_id: 3,
                    source: DatasetError::Codec("truncated".into()),
                },
                Code::FailedPrecondition,
                "task 3: cannot decode element: truncated",
            ),
            (
                WorkerError::TaskNotHereYet { task_id: 7 },
                Code::Unavailable,
                "Task 7 not found",
            ),
            (
                WorkerError::TaskDeleted {
                    task_id: 5,
                    worker: "w:1".into(),
                },
                Code::FailedPrecondition,
                "Got request for local task 5 of worker w:1, which has been deleted. You may be \
                 creating a duplicate iteration which has already finished. To fix this, make \
                 sure to create your dataset only once, as opposed to re-creating it repeatedly \
                 inside a loop.",
            ),
            (
                WorkerError::NoFirstRequest,
                Code::InvalidArgument,
                "a fetch stream must start with a request naming the task",
            ),
            (
                WorkerError::EmptyTrainerId,
                Code::InvalidArgument,
                EMPTY_TRAINER_ID,
            ),
            (
                WorkerError::NotRoundRobin { task_id: 2 },
                Code::FailedPrecondition,
                "RoundRobinTaskRunner needs to know the consumer index and element index of \
                 each request.",
            ),
            (
                WorkerError::Round(RoundError::Stopped),
                Code::Unavailable,
                "the round-robin task was stopped",
            ),
            (
                WorkerError::Round(RoundError::Failed("the input ended".into())),
                Code::FailedPrecondition,
                "the input ended",
            ),
            (
                WorkerError::TooManyRequests { limit: 64 },
                Code::ResourceExhausted,
                "more than 64 fetch requests waiting",
            ),
            (
                WorkerError::Reader(Status::internal("h2 protocol error")),
                Code::Internal,
                "h2 protocol error",
            ),
            (
                WorkerError::RawVersion { got: 1, spoken: 2 },
                Code::FailedPrecondition,
                "raw fetch protocol version 1 is not spoken here: this worker speaks version 2; \
                 the reader and the worker must be the same release",
            ),
            (
                WorkerError::Security(SecurityError::Exposed("refusing to serve".into())),
                Code::FailedPrecondition,
                "refusing to serve",
            ),
            (
                WorkerError::Unauthenticated("no credentials".into()),
                Code::Unauthenticated,
                "no credentials",
            ),
            (
                WorkerError::PermissionDenied("worker 'w' may not call Fetch".into()),
                Code::PermissionDenied,
                "worker 'w' may not call Fetch",
            ),
            (
                WorkerError::NotAdmitted {
                    task_id: 4000,
                    iteration_id: 2000,
                    client_id: 3001,
                    refusal: AdmissionRefusal::Missing,
                },
                Code::PermissionDenied,
                "task 4000 of iteration 2000: the request carries no admission; only readers \
                 the dispatcher admitted to the iteration (GetOrCreateIteration) may read its \
                 tasks",
            ),
            (
                WorkerError::NotAdmitted {
                    task_id: 4000,
                    iteration_id: 2000,
                    client_id: 3001,
                    refusal: AdmissionRefusal::Invalid,
                },
                Code::PermissionDenied,
                "task 4000 of iteration 2000: the admission presented is not the dispatcher's \
                 admission of client 3001 to iteration 2000; only readers the dispatcher \
                 admitted to the iteration (GetOrCreateIteration) may read its tasks",
            ),
            (
                WorkerError::NoFetchKey { task_id: 4000 },
                Code::Unavailable,
                "task 4000: this worker has not yet received the cluster's fetch key from the \
                 dispatcher, so it cannot check the reader's admission; retry",
            ),
        ]
    }

    /// Compiles only while every variant is listed: a reminder to add its row.
    fn variant_has_a_row(error: &WorkerError) {
        match error {
            WorkerError::Config(_)
            | WorkerError::Bind { .. }
            | WorkerError::Dispatcher(_)
            | WorkerError::Registration(_)
            | WorkerError::Task { .. }
            | WorkerError::TaskNotHereYet { .. }
            | WorkerError::TaskDeleted { .. }
            | WorkerError::NoFirstRequest
            | WorkerError::EmptyTrainerId
            | WorkerError::NotRoundRobin { .. }
            | WorkerError::Round(_)
            | WorkerError::TooManyRequests { .. }
            | WorkerError::Reader(_)
            | WorkerError::RawVersion { .. }
            | WorkerError::Security(_)
            | WorkerError::Unauthenticated(_)
            | WorkerError::PermissionDenied(_)
            | WorkerError::Ack { .. }
            | WorkerError::NotAdmitted { .. }
            | WorkerError::NoFetchKey { .. } => {}
        }
    }

    #[test]
    fn each_error_maps_to_its_code_and_message() {
        for (error, code, message) in rows() {
            variant_has_a_row(&error);
            let described = format!("{error:?}");
            let status = Status::from(error);
            assert_eq!(
                (status.code(), status.message()),
                (code, message),
                "{described}"
            );
        }
    }

    /// The client retries a worker's `Unavailable` and fails its epoch on a refusal; the
    /// retryability a worker reports must say the same.
    #[test]
    fn retryable_errors_are_the_ones_readers_retry() {
        for (error, code, _) in rows() {
            let described = format!("{error:?}");
            let retried = matches!(code, Code::Unavailable | Code::ResourceExhausted);
            assert_eq!(error.is_retryable(), retried, "{described}");
        }
    }
}
