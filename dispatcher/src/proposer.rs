//! Group commit: the proposer gathers concurrent requests into one log entry.
//!
//! openraft 0.9 appends (and fsyncs) one client write at a time, so one entry per request would
//! cap the dispatcher at one request per fsync. The proposer instead takes every request queued
//! while earlier entries are in flight and proposes them as one `Proposal`; at most
//! `max_in_flight` entries are outstanding, which is what makes requests queue up and batch. An
//! entry holds at most `max_requests` requests and, once it has one, grows no further past
//! `max_bytes` (estimated): a request that would cross the bound opens the next entry.
//!
//! Invariants: each caller gets the outcome of its own request, after the entry committed and
//! applied; an entry that fails fails every request in it with the same error; the entry is
//! stamped with the leader's wall clock once, here (`now_micros`), which is the only time
//! `apply` sees.
//!
//! Typed replies: each kind of update has one method that proposes it and turns its outcome
//! into the reply callers want (`lease_splits` gives a `SplitLease`). The mapping of outcome
//! variants to replies lives in those methods and nowhere else; a rejection becomes
//! `DispatcherError::Rejected`, an outcome of another kind `DispatcherError::UnexpectedOutcome`.

use crate::error::DispatcherError;
use crate::raft_error::{raft_error, RaftFailure};
use crate::raft_types::{Raft, TypeConfig};
use crate::registration::Registration;
use crate::state::{
    DatasetMetadata, DeliveryReport, JobOptions, Outcome, Outcomes, Proposal, Request, RequestId,
    Update,
};
use openraft::raft::responder::{OneshotResponder, Responder};
use sluice_security::FetchKey;
use sluice_types::{
    ClientId, DatasetId, Delivery, IterationId, JobId, LeaseRequest, ShardingPolicy, SplitLease,
    TaskId,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tracing::debug;

/// How long a caller waits for its entry to commit before hearing `Unavailable`, by default
/// (`DispatcherConfig::commit_timeout`).
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(3);

/// A definition larger than this is proposed in parts of this size (`StageDefinition`), each
/// in an entry of at most [`BatchLimits::max_bytes`]: openraft gives an append to a follower one
/// heartbeat interval, so no entry may take longer than that to send and write. 256 KiB is 2 ms
/// on a 1 Gbit/s link; a 16 MiB definition in one entry would be 134 ms there, never in time,
/// and the log would stall behind it.
pub const DEFINITION_PART_BYTES: usize = 256 * 1024;

/// The bounds of group commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Requests per log entry at most.
    pub max_requests: usize,
    /// Estimated bytes per log entry past which no further request joins it (a single larger
    /// request still gets an entry of its own). Well below the gRPC message bound, since one
    /// append to a follower may carry several entries.
    pub max_bytes: usize,
    /// Entries proposed and not yet answered at most.
    pub max_in_flight: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            max_requests: 1024,
            max_bytes: 1024 * 1024,
            max_in_flight: 2,
        }
    }
}

/// Where the proposer's entries go: the Raft log in production, a fake in tests.
pub trait LogWriter: Send + 'static {
    /// Resolves when the entry is committed and applied, with one outcome per request.
    type Committed: Future<Output = Result<Outcomes, RaftFailure>> + Send + 'static;

    /// Hands one entry to the log. Entries are submitted in order; waiting for the commit is
    /// the returned future's part, so the next entry can be submitted meanwhile.
    fn submit(
        &self,
        proposal: Proposal,
    ) -> impl Future<Output = Result<Self::Committed, RaftFailure>> + Send;
}

impl LogWriter for Raft {
    type Committed = RaftCommit;

    async fn submit(&self, proposal: Proposal) -> Result<RaftCommit, RaftFailure> {
        Ok(RaftCommit(self.client_write_ff(proposal).await?))
    }
}

/// openraft's answer to one submitted entry, reduced to its outcomes.
pub struct RaftCommit(<OneshotResponder<TypeConfig> as Responder<TypeConfig>>::Receiver);

impl Future for RaftCommit {
    type Output = Result<Outcomes, RaftFailure>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|received| match received {
                Ok(Ok(response)) => Ok(response.data),
                Ok(Err(e)) => Err(e.into()),
                Err(_) => Err(RaftFailure::Stopped("raft dropped the write".into())),
            })
    }
}

type Reply = oneshot::Sender<Result<Outcome, DispatcherError>>;
type Queued = (Request, Reply);

/// Clone-able handle to the proposer task.
#[derive(Clone)]
pub struct ProposerHandle {
    tx: mpsc::UnboundedSender<Queued>,
    /// Held while a definition is staged in parts: one at a time (the state keeps at most one
    /// definition in staging).
    staging: Arc<tokio::sync::Mutex<()>>,
    /// How long a caller waits for its entry to commit before hearing `Unavailable`.
    commit_timeout: Duration,
}

impl ProposerHandle {
    /// Starts the proposer task on the Raft log; it ends when every handle is dropped.
    pub fn spawn(raft: Raft) -> ProposerHandle {
        Self::spawn_with(raft, BatchLimits::default())
    }

    /// Starts the proposer task on any log, with the given bounds.
    pub fn spawn_with(writer: impl LogWriter, limits: BatchLimits) -> ProposerHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(writer, rx, limits));
        ProposerHandle {
            tx,
            staging: Arc::default(),
            commit_timeout: COMMIT_TIMEOUT,
        }
    }

    /// The same proposer, its callers waiting `commit_timeout` for a commit.
    pub fn with_commit_timeout(mut self, commit_timeout: Duration) -> ProposerHandle {
        self.commit_timeout = commit_timeout;
        self
    }

    /// Proposes one request and waits for its outcome (a rejection is an `Ok` outcome here).
    pub async fn propose(&self, request: Request) -> Result<Outcome, DispatcherError> {
        let outcome = self.enqueue(request)?;
        self.outcome(outcome).await
    }

    /// Queues a request for the next entries; requests queued one after another are applied in
    /// that order.
    fn enqueue(
        &self,
        request: Request,
    ) -> Result<oneshot::Receiver<Result<Outcome, DispatcherError>>, DispatcherError> {
        let (reply, outcome) = oneshot::channel();
        self.tx
            .send((request, reply))
            .map_err(|_| DispatcherError::RaftStopped("the proposer has stopped".into()))?;
        Ok(outcome)
    }

    async fn outcome(
        &self,
        outcome: oneshot::Receiver<Result<Outcome, DispatcherError>>,
    ) -> Result<Outcome, DispatcherError> {
        let commit_timeout = self.commit_timeout;
        match tokio::time::timeout(commit_timeout, outcome).await {
            Ok(outcome) => outcome.map_err(|_| {
                DispatcherError::RaftStopped("the proposer dropped the request".into())
            })?,
            Err(_) => Err(DispatcherError::QuorumUnavailable(format!(
                "the write was not committed within {commit_timeout:?}; it may still be: retry it \
                 with the same request id"
            ))),
        }
    }

    /// Proposes one update; a rejection is an error.
    async fn accepted(
        &self,
        id: Option<RequestId>,
        update: Update,
    ) -> Result<(&'static str, Outcome), DispatcherError> {
        let kind = update.kind();
        match self.propose(Request { id, update }).await? {
            Outcome::Rejected(rejection) => Err(rejection.into()),
            outcome => Ok((kind, outcome)),
        }
    }

    /// Registers a dataset; a large definition is staged in parts first (in order, queued at
    /// once so that they fill consecutive entries).
    pub async fn register_dataset(
        &self,
        id: Option<RequestId>,
        registration: Registration,
    ) -> Result<DatasetId, DispatcherError> {
        let (parts, register) = registration.into_updates(DEFINITION_PART_BYTES);
        let _one_at_a_time = if parts.is_empty() {
            None
        } else {
            Some(self.staging.lock().await)
        };
        let queued = parts
            .into_iter()
            .map(|update| self.enqueue(Request { id: None, update }))
            .collect::<Result<Vec<_>, _>>()?;
        for outcome in queued {
            match self.outcome(outcome).await? {
                Outcome::DefinitionStaged { .. } => {}
                Outcome::Rejected(rejection) => return Err(rejection.into()),
                other => return Err(unexpected("stage_definition", other)),
            }
        }
        match self.accepted(id, register).await? {
            (_, Outcome::DatasetRegistered { dataset_id }) => Ok(dataset_id),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    /// Registers (or re-registers) a worker; the tasks it got are in the state.
    pub async fn register_worker(
        &self,
        id: Option<RequestId>,
        address: String,
        tags: Vec<String>,
        worker_addresses: Vec<String>,
        owner: String,
    ) -> Result<Vec<TaskId>, DispatcherError> {
        let update = Update::RegisterWorker {
            address,
            tags,
            worker_addresses,
            owner,
        };
        match self.accepted(id, update).await? {
            (_, Outcome::WorkerRegistered { tasks }) => Ok(tasks),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn get_or_create_job(
        &self,
        id: Option<RequestId>,
        dataset_id: DatasetId,
        sharding: ShardingPolicy,
        job_name: Option<String>,
        anonymous_suffix: u64,
        options: JobOptions,
        delivery: Delivery,
    ) -> Result<JobId, DispatcherError> {
        let update = Update::GetOrCreateJobWithDelivery {
            dataset_id,
            sharding,
            job_name,
            anonymous_suffix,
            options,
            delivery,
        };
        match self.accepted(id, update).await? {
            (_, Outcome::Job { job_id }) => Ok(job_id),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    /// Records what a client received from exactly-once tasks and which moving tasks it let
    /// go of.
    pub async fn report_delivered(
        &self,
        id: Option<RequestId>,
        client_id: ClientId,
        reports: Vec<DeliveryReport>,
    ) -> Result<(), DispatcherError> {
        let update = Update::ReportDelivered { client_id, reports };
        match self.accepted(id, update).await? {
            (_, Outcome::DeliveryRecorded) => Ok(()),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    /// Records the process a worker runs in; the tasks whose lineages moved because it
    /// restarted.
    pub async fn worker_incarnation(
        &self,
        address: String,
        incarnation: u64,
    ) -> Result<Vec<TaskId>, DispatcherError> {
        let update = Update::WorkerIncarnation {
            address,
            incarnation,
        };
        match self.accepted(None, update).await? {
            (_, Outcome::WorkerRestarted { moved }) => Ok(moved),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    /// The iteration and the new iteration client attached to it; with `resume` (a reader's
    /// step and name), the iteration restored from the reader's state.
    pub async fn get_or_create_iteration(
        &self,
        id: Option<RequestId>,
        job_id: JobId,
        repetition: u64,
        resume: Option<(u64, String)>,
    ) -> Result<(IterationId, ClientId), DispatcherError> {
        let update = match resume {
            None => Update::GetOrCreateIteration { job_id, repetition },
            Some((step, reader)) => Update::ResumeIteration {
                job_id,
                repetition,
                step,
                reader,
            },
        };
        match self.accepted(id, update).await? {
            (
                _,
                Outcome::Iteration {
                    iteration_id,
                    client_id,
                },
            ) => Ok((iteration_id, client_id)),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    /// Adds what a reader took to its iteration's checkpoint at `step`; the job's name, the
    /// repetition and the definition the job reads.
    pub async fn save_checkpoint(
        &self,
        id: Option<RequestId>,
        client_id: ClientId,
        reader: String,
        step: u64,
        base_step: Option<u64>,
        taken: Vec<(TaskId, Vec<(u64, u64)>)>,
    ) -> Result<(String, u64, [u8; 32]), DispatcherError> {
        let update = Update::SaveCheckpoint {
            client_id,
            reader,
            step,
            base_step,
            taken,
        };
        match self.accepted(id, update).await? {
            (
                _,
                Outcome::CheckpointSaved {
                    job_name,
                    repetition,
                    definition,
                },
            ) => Ok((job_name, repetition, definition)),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    pub async fn lease_splits(
        &self,
        id: Option<RequestId>,
        lease: LeaseRequest,
    ) -> Result<SplitLease, DispatcherError> {
        let update = Update::LeaseSplits(lease);
        match self.accepted(id, update).await? {
            (_, Outcome::Splits(lease)) => Ok(lease),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    pub async fn release_iteration_client(
        &self,
        id: Option<RequestId>,
        client_id: ClientId,
    ) -> Result<(), DispatcherError> {
        let update = Update::ReleaseIterationClient { client_id };
        match self.accepted(id, update).await? {
            (_, Outcome::ClientReleased) => Ok(()),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    pub async fn finish_tasks(
        &self,
        id: Option<RequestId>,
        worker: String,
        task_ids: Vec<TaskId>,
    ) -> Result<(), DispatcherError> {
        let update = Update::FinishTasks { worker, task_ids };
        match self.accepted(id, update).await? {
            (_, Outcome::TasksFinished) => Ok(()),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    /// Fails the iterations of tasks a crashed run of `worker` was running; returns those
    /// failed now.
    pub async fn fail_crashed_tasks(
        &self,
        worker: String,
        task_ids: Vec<TaskId>,
        signal: String,
    ) -> Result<Vec<IterationId>, DispatcherError> {
        let update = Update::FailCrashedTasks {
            worker,
            task_ids,
            signal,
        };
        match self.accepted(None, update).await? {
            (_, Outcome::IterationsFailed { iterations }) => Ok(iterations),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    /// The pending task's target round after the update (`None`: no task is pending).
    pub async fn client_rounds(
        &self,
        client_id: ClientId,
        current_round: u64,
        blocked_round: Option<u64>,
    ) -> Result<Option<u64>, DispatcherError> {
        let update = Update::ClientRounds {
            client_id,
            current_round,
            blocked_round,
        };
        match self.accepted(None, update).await? {
            (_, Outcome::Rounds { block_round }) => Ok(block_round),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    pub async fn remove_task(&self, task_id: TaskId) -> Result<(), DispatcherError> {
        match self.accepted(None, Update::RemoveTask { task_id }).await? {
            (_, Outcome::TaskRemoved) => Ok(()),
            (update, other) => Err(unexpected(update, other)),
        }
    }

    /// Proposes `key` as the cluster's fetch key; whether it became it (`false`: a key was
    /// set already, and stays).
    pub async fn set_fetch_key(&self, key: FetchKey) -> Result<bool, DispatcherError> {
        match self.accepted(None, Update::SetFetchKey { key }).await? {
            (_, Outcome::FetchKeySet { set }) => Ok(set),
            (update, other) => Err(unexpected(update, other)),
        }
    }
}

/// An outcome of another kind than the update's: a bug in `apply`, reported as such.
fn unexpected(update: &'static str, outcome: Outcome) -> DispatcherError {
    DispatcherError::UnexpectedOutcome {
        update,
        outcome: format!("{outcome:?}"),
    }
}

async fn run(writer: impl LogWriter, mut rx: mpsc::UnboundedReceiver<Queued>, limits: BatchLimits) {
    let in_flight = Arc::new(Semaphore::new(limits.max_in_flight));
    // A request that would have crossed the byte bound of the previous entry opens the next.
    let mut carried: Option<Queued> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match rx.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        // Everything that queued while we waited for a free slot goes into this entry.
        let mut bytes = approx_bytes(&first.0.update);
        let mut batch = vec![first];
        while batch.len() < limits.max_requests {
            let Ok(item) = rx.try_recv() else { break };
            bytes += approx_bytes(&item.0.update);
            if bytes > limits.max_bytes {
                carried = Some(item);
                break;
            }
            batch.push(item);
        }
        let (requests, replies): (Vec<Request>, Vec<Reply>) = batch.into_iter().unzip();
        debug!(requests = requests.len(), bytes, "propose");
        let submitted = writer
            .submit(Proposal {
                time_micros: now_micros(),
                requests,
            })
            .await;
        tokio::spawn(async move {
            let result = match submitted {
                Ok(committed) => committed.await,
                Err(failure) => Err(failure),
            };
            drop(permit);
            answer(result, replies);
        });
    }
}

fn answer(result: Result<Outcomes, RaftFailure>, replies: Vec<Reply>) {
    match result {
        Ok(Outcomes(outcomes)) => {
            debug_assert_eq!(outcomes.len(), replies.len());
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(failure) => {
            for reply in replies {
                let _ = reply.send(Err(raft_error(failure.clone())));
            }
        }
    }
}

/// A cheap estimate of a request's size in the log (no encoding): its variable-length fields
/// plus a constant for the rest.
fn approx_bytes(update: &Update) -> usize {
    const FIXED: usize = 64;
    let strings = |s: &[String]| s.iter().map(String::len).sum::<usize>();
    FIXED
        + match update {
            Update::RegisterDataset {
                dataset_id,
                def,
                metadata,
                num_splits,
            } => def.len() + registration_bytes(dataset_id, metadata, num_splits),
            Update::RegisterWorker {
                address,
                tags,
                worker_addresses,
                owner,
            } => address.len() + strings(tags) + strings(worker_addresses) + owner.len(),
            Update::GetOrCreateJob { job_name, .. }
            | Update::GetOrCreateJobWithDelivery { job_name, .. } => {
                job_name.as_ref().map_or(0, String::len)
            }
            Update::ReportDelivered { reports, .. } => reports
                .iter()
                .map(|r| 16 + 16 * r.runs.len())
                .sum::<usize>(),
            Update::WorkerIncarnation { address, .. } => address.len(),
            Update::SaveCheckpoint { reader, taken, .. } => {
                reader.len() + taken.iter().map(|t| 16 + 16 * t.1.len()).sum::<usize>()
            }
            Update::ResumeIteration { reader, .. } => reader.len(),
            Update::FinishTasks { worker, task_ids } => worker.len() + 8 * task_ids.len(),
            Update::FailCrashedTasks {
                worker,
                task_ids,
                signal,
            } => worker.len() + 8 * task_ids.len() + signal.len(),
            Update::RemoveWorker { address } => address.len(),
            Update::RemoveIdle {
                iterations,
                jobs,
                datasets,
                ..
            } => {
                8 * (iterations.len() + jobs.len())
                    + datasets.iter().map(|d| d.0.len() + 8).sum::<usize>()
            }
            Update::StageDefinition { bytes, .. } => bytes.len(),
            Update::RegisterStagedDataset {
                dataset_id,
                metadata,
                num_splits,
                ..
            } => registration_bytes(dataset_id, metadata, num_splits),
            Update::GetOrCreateIteration { .. }
            | Update::LeaseSplits { .. }
            | Update::ReleaseIterationClient { .. }
            | Update::GarbageCollectIteration { .. }
            | Update::ClientRounds { .. }
            | Update::RemoveTask { .. }
            | Update::SetFetchKey { .. } => 0,
        }
}

/// What a registration carries besides its definition.
fn registration_bytes(
    dataset_id: &Option<DatasetId>,
    metadata: &DatasetMetadata,
    num_splits: &[u64],
) -> usize {
    dataset_id.as_ref().map_or(0, |d| d.0.len())
        + metadata.element_spec.len()
        + 8 * num_splits.len()
}

/// The leader's wall clock in microseconds since the Unix epoch: the time stamped on each
/// entry, and the time the timers compare replicated timestamps with.
pub fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "proposer_tests.rs"]
mod tests;
