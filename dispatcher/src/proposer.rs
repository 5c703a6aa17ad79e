//! Group commit: the proposer gathers concurrent requests into one log entry.
//!
//! openraft 0.9 appends (and fsyncs) one client write at a time, so one entry per request would
//! cap the dispatcher at one request per fsync. The proposer instead takes every request queued
//! while earlier entries are in flight and proposes them as one `Proposal`; at most
//! `MAX_IN_FLIGHT` entries are outstanding, which is what makes requests queue up and batch.
//! Each caller gets the outcome of its own request, after the entry committed and applied.

use crate::error::DispatcherError;
use crate::state::{Outcome, Proposal, Request};
use crate::types::{Raft, TypeConfig};
use openraft::error::ClientWriteError;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tracing::debug;

/// How long a caller waits for its entry to commit before hearing `Unavailable`.
const COMMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Requests per log entry at most.
const MAX_BATCH: usize = 1024;
/// Entries proposed and not yet answered at most.
const MAX_IN_FLIGHT: usize = 2;

type Reply = oneshot::Sender<Result<Outcome, DispatcherError>>;

/// Clone-able handle to the proposer task.
#[derive(Clone)]
pub struct ProposerHandle {
    tx: mpsc::UnboundedSender<(Request, Reply)>,
}

impl ProposerHandle {
    /// Starts the proposer task; it ends when every handle is dropped.
    pub fn spawn(raft: Raft) -> ProposerHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, rx));
        ProposerHandle { tx }
    }

    /// Proposes one request and waits for its outcome.
    pub async fn propose(&self, request: Request) -> Result<Outcome, DispatcherError> {
        let (reply, outcome) = oneshot::channel();
        self.tx
            .send((request, reply))
            .map_err(|_| DispatcherError::RaftStopped("the proposer has stopped".into()))?;
        match tokio::time::timeout(COMMIT_TIMEOUT, outcome).await {
            Ok(outcome) => outcome.map_err(|_| {
                DispatcherError::RaftStopped("the proposer dropped the request".into())
            })?,
            Err(_) => Err(DispatcherError::QuorumUnavailable(format!(
                "the write was not committed within {COMMIT_TIMEOUT:?}; it may still be: retry it \
                 with the same request id"
            ))),
        }
    }
}

async fn run(raft: Raft, mut rx: mpsc::UnboundedReceiver<(Request, Reply)>) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        // Everything that queued while we waited for a free slot goes into this entry.
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let (requests, replies): (Vec<Request>, Vec<Reply>) = batch.into_iter().unzip();
        debug!(requests = requests.len(), "propose");
        let written = raft.client_write_ff(Proposal { time_micros: now_micros(), requests }).await;
        tokio::spawn(async move {
            let result = match written {
                Ok(receiver) => receiver
                    .await
                    .map_err(|_| DispatcherError::RaftStopped("raft dropped the write".into())),
                Err(fatal) => Err(DispatcherError::RaftStopped(fatal.to_string())),
            };
            drop(permit);
            answer(result, replies);
        });
    }
}

type WriteResult = Result<
    Result<
        openraft::raft::ClientWriteResponse<TypeConfig>,
        ClientWriteError<u64, crate::types::NodeInfo>,
    >,
    DispatcherError,
>;

fn answer(result: WriteResult, replies: Vec<Reply>) {
    match result {
        Ok(Ok(response)) => {
            let outcomes = response.data.0;
            debug_assert_eq!(outcomes.len(), replies.len());
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok(outcome));
            }
        }
        Ok(Err(ClientWriteError::ForwardToLeader(forward))) => {
            let leader = forward.leader_node.map(|n| n.addr);
            for reply in replies {
                let _ = reply.send(Err(DispatcherError::NotLeader {
                    leader: leader.clone(),
                }));
            }
        }
        Ok(Err(ClientWriteError::ChangeMembershipError(e))) => {
            for reply in replies {
                let _ = reply.send(Err(DispatcherError::QuorumUnavailable(e.to_string())));
            }
        }
        Err(err) => {
            let message = err.to_string();
            for reply in replies {
                let _ = reply.send(Err(DispatcherError::RaftStopped(message.clone())));
            }
        }
    }
}

/// The leader's wall clock in microseconds since the Unix epoch: the time stamped on each entry.
pub fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
