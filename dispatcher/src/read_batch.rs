//! `ReadBatch`: one quorum confirmation serves every linearizable read that arrived before it
//! started (read-index batching, as etcd batches its read requests).
//!
//! `Raft::ensure_linearizable` sends a round of heartbeats to the followers and waits for a
//! quorum's answer. One round per read is what made thousands of heartbeats a second cost
//! thousands of peer RPCs a second. Here at most one round runs at a time: the reads arriving
//! while it runs wait together for the next one, which starts as soon as the running one ends.
//!
//! Invariant (what makes a shared round linearizable): a read only joins a round that has not
//! started yet, so the round's confirmation and its read index are taken after the read
//! arrived; the round also waits until this replica applied up to that index. A read never
//! joins a round already in flight, whose read index may predate the read.

use crate::error::DispatcherError;
use crate::raft_error::{raft_error, RaftFailure};
use crate::raft_types::Raft;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How long one round waits for a quorum to confirm the leader before its reads hear
/// `Unavailable`.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);

/// A round's outcome, shared by every read that waited for it.
type RoundResult = Option<Result<(), RaftFailure>>;

pub struct ReadBatch {
    raft: Raft,
    /// A std mutex: held only to join or take the next round, never across `.await`.
    rounds: Mutex<Rounds>,
}

#[derive(Default)]
struct Rounds {
    /// The round reads join: not started yet.
    next: Option<watch::Sender<RoundResult>>,
    /// Whether the task that runs rounds is alive (it exits when no read waits).
    running: bool,
}

impl ReadBatch {
    pub fn new(raft: Raft) -> Arc<ReadBatch> {
        Arc::new(ReadBatch {
            raft,
            rounds: Mutex::new(Rounds::default()),
        })
    }

    /// Returns once a quorum confirmed this replica as leader after the call began and this
    /// replica applied everything committed before that confirmation.
    pub async fn confirm(self: &Arc<Self>) -> Result<(), DispatcherError> {
        let mut outcome = {
            let mut rounds = self.rounds.lock().expect("read batch lock poisoned");
            let receiver = match &rounds.next {
                Some(round) => round.subscribe(),
                None => {
                    let (round, receiver) = watch::channel(None);
                    rounds.next = Some(round);
                    receiver
                }
            };
            if !rounds.running {
                rounds.running = true;
                tokio::spawn(self.clone().run_rounds());
            }
            receiver
        };
        let result = match outcome.wait_for(Option::is_some).await {
            Ok(result) => result.clone(),
            // The round was dropped unanswered: only when the runtime shuts down.
            Err(_) => Some(Err(RaftFailure::Stopped(
                "read confirmation dropped".into(),
            ))),
        };
        match result {
            Some(Ok(())) => Ok(()),
            Some(Err(failure)) => Err(raft_error(failure)),
            None => Err(raft_error(RaftFailure::Stopped(
                "read confirmation unanswered".into(),
            ))),
        }
    }

    /// Runs rounds back to back while reads wait for one.
    async fn run_rounds(self: Arc<Self>) {
        loop {
            let round = {
                let mut rounds = self.rounds.lock().expect("read batch lock poisoned");
                match rounds.next.take() {
                    Some(round) => round,
                    None => {
                        rounds.running = false;
                        return;
                    }
                }
            };
            let result = match tokio::time::timeout(
                CONFIRM_TIMEOUT,
                self.raft.ensure_linearizable(),
            )
            .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(RaftFailure::from(e)),
                Err(_) => Err(RaftFailure::QuorumNotEnough(
                    "no quorum confirmed the leader in time".into(),
                )),
            };
            round.send_replace(Some(result));
        }
    }
}
