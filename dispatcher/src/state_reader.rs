//! `StateReader`: reads of the applied state that must be current, and long polls on it.
//!
//! A read is current when this replica is the leader, a quorum confirmed it after the request
//! arrived (or recently enough that no other leader can exist yet), and it applied everything
//! committed before (`linearizable`; concurrent reads share one confirmation, see `ReadBatch`). A long poll then checks the caller's view after every
//! applied entry that touched what it waits on until it changed, its deadline passed, or this
//! replica stopped leading (the caller then asks again, maybe elsewhere).
//!
//! One task per replica follows Raft's metrics: on each applied entry it takes the keys the
//! entry touched (`state::changes`) and wakes only their long polls (`watchers`); a change of
//! leadership wakes them all. Raft's metrics also change on every quorum acknowledgement
//! (several times per heartbeat interval), and waking thousands of waiting heartbeats for those,
//! or for entries that did not concern them, re-read the state for nothing.
//!
//! A long poll that waited confirms again before it answers: this replica may have been frozen
//! (a GC or swap pause, a stopped VM) or cut off while it waited, and a thawed leader's timers
//! fire before it hears of the newer term. Its Raft metrics were taken before the freeze, so
//! only a quorum round, or a confirmation's lease that has not run out on this process's clock,
//! can tell; a round that fails answers the usual not-leader status.

use crate::error::DispatcherError;
use crate::raft_types::{NodeInfo, Raft, StateHandle};
use crate::read_batch::ReadBatch;
use crate::state::{DispatcherState, Watched};
use crate::watchers::{Watch, Watchers};
use openraft::RaftMetrics;
use sluice_types::NodeId;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// What a long poll waits for a change of: the last applied index, and whether this replica
/// leads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct AppliedMark {
    applied: Option<u64>,
    leading: bool,
}

/// What a long poll's check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    Changed,
    Unchanged,
}

/// How a long poll's wait ended.
enum Wait {
    Applied,
    TimedOut,
    NotLeading,
}

#[derive(Clone)]
pub struct StateReader {
    id: NodeId,
    raft: Raft,
    state: StateHandle,
    reads: Arc<ReadBatch>,
    /// Started by the first long poll (a runtime is needed to run its forwarding task).
    applied: Arc<OnceLock<watch::Receiver<AppliedMark>>>,
    /// The long polls waiting, by what they wait on.
    watchers: Arc<Watchers>,
    /// A leader no quorum acknowledged for this long is probably deposed (or cut off): it
    /// answers `Unavailable` at once instead of letting callers wait on writes that cannot
    /// commit.
    quorum_lease: Duration,
}

impl StateReader {
    /// `election_timeout`: the replicas' range; its upper bound is the quorum lease a leader
    /// must be acknowledged within, and half of it the lease of a read confirmation.
    pub fn new(
        id: NodeId,
        raft: Raft,
        state: StateHandle,
        election_timeout: (Duration, Duration),
    ) -> Self {
        let quorum_lease = election_timeout.1;
        StateReader {
            id,
            reads: ReadBatch::new(raft.clone(), election_timeout.1 / 2),
            applied: Arc::new(OnceLock::new()),
            watchers: Watchers::new(),
            raft,
            state,
            quorum_lease,
        }
    }

    /// Fails fast when this replica leads but no quorum acknowledged it within the lease.
    pub fn check_quorum(&self) -> Result<(), DispatcherError> {
        match unacknowledged_leader_ms(&self.raft.metrics().borrow(), self.quorum_lease) {
            Some(ms) => Err(DispatcherError::QuorumUnavailable(format!(
                "no quorum has acknowledged this leader for {ms} ms"
            ))),
            None => Ok(()),
        }
    }

    /// Waits until this replica is the confirmed leader and has applied everything committed
    /// before the call, so the state read next is current.
    pub async fn linearizable(&self) -> Result<(), DispatcherError> {
        self.check_quorum()?;
        self.reads.confirm().await
    }

    /// The size of the applied state in the journal's encoding (what a snapshot holds).
    pub fn encoded_state_bytes(&self) -> Result<usize, DispatcherError> {
        let applied = self.state.read().expect("state lock poisoned");
        Ok(sluice_journal::codec::try_encode(&applied.state)?.len())
    }

    /// Reads the applied state (current only after [`StateReader::linearizable`]).
    pub fn read<T>(&self, f: impl FnOnce(&DispatcherState) -> T) -> T {
        let applied = self.state.read().expect("state lock poisoned");
        f(&applied.state)
    }

    /// Checks `changed` now and after each applied entry that touched `key`; returns `view` once `changed` says so, when `deadline`
    /// passes, or when this replica no longer leads; after a wait, only once a quorum confirmed
    /// it still leads. `changed` may run many times while the poll waits, so it should be cheap;
    /// `view` runs once. Both get the applied index with the state.
    pub async fn long_poll<T>(
        &self,
        key: Watched,
        deadline: Instant,
        mut changed: impl FnMut(Option<u64>, &DispatcherState) -> Result<Check, DispatcherError>,
        view: impl FnOnce(Option<u64>, &DispatcherState) -> Result<T, DispatcherError>,
    ) -> Result<T, DispatcherError> {
        let applied = self.applied_marks();
        let mut watch = self.watchers.watch(key);
        let mut waited = false;
        loop {
            watch.mark_seen();
            let until = match self.read_applied(&mut changed)? {
                Check::Changed => break,
                Check::Unchanged => deadline,
            };
            waited = true;
            match Self::wait_for_change(&applied, &mut watch, until).await {
                Wait::Applied => {}
                Wait::TimedOut if Instant::now() < deadline => {}
                Wait::TimedOut | Wait::NotLeading => break,
            }
        }
        if waited {
            self.reads.confirm().await?;
        }
        self.read_applied(view)
    }

    /// Waits for the next wake of `watch`, or until `until`.
    async fn wait_for_change(
        applied: &watch::Receiver<AppliedMark>,
        watch: &mut Watch,
        until: Instant,
    ) -> Wait {
        if !applied.borrow().leading {
            return Wait::NotLeading;
        }
        match tokio::time::timeout_at(until, watch.changed()).await {
            // Raft stopped (the marks closed) or this replica stopped leading.
            Ok(()) if applied.has_changed().is_err() || !applied.borrow().leading => {
                Wait::NotLeading
            }
            Ok(()) => Wait::Applied,
            Err(_) => Wait::TimedOut,
        }
    }

    /// Reads the applied state with the index of the last entry applied to it.
    pub fn read_applied<T>(&self, f: impl FnOnce(Option<u64>, &DispatcherState) -> T) -> T {
        let applied = self.state.read().expect("state lock poisoned");
        f(applied.last_applied.map(|l| l.index), &applied.state)
    }

    /// The watch of applied entries and leadership, started on first use with the task that
    /// also wakes the long polls.
    fn applied_marks(&self) -> watch::Receiver<AppliedMark> {
        self.applied
            .get_or_init(|| {
                let mut metrics = self.raft.metrics();
                let id = self.id;
                let mark = move |m: &RaftMetrics<NodeId, NodeInfo>| AppliedMark {
                    applied: m.last_applied.map(|l| l.index),
                    leading: m.current_leader == Some(id),
                };
                let (marks, receiver) = watch::channel(mark(&metrics.borrow_and_update()));
                let (state, watchers) = (self.state.clone(), self.watchers.clone());
                tokio::spawn(async move {
                    // Ends when Raft stops (its metrics sender is dropped); the long polls then
                    // see the marks closed and return.
                    while metrics.changed().await.is_ok() {
                        let next = mark(&metrics.borrow_and_update());
                        let current = *marks.borrow();
                        if next == current {
                            continue;
                        }
                        marks.send_replace(next);
                        let mut touched = match state.read() {
                            Ok(applied) => applied.state.changes().take(),
                            Err(_) => break,
                        };
                        touched.all |= next.leading != current.leading;
                        watchers.wake(&touched);
                    }
                    // Raft stopped: every long poll finds the marks closed.
                    drop(marks);
                    watchers.wake(&crate::state::Touched::default());
                });
                receiver
            })
            .clone()
    }
}

/// How long ago a quorum last acknowledged this replica, when it leads and that is longer than
/// `lease`: a leader that may have been deposed without hearing of it.
pub fn unacknowledged_leader_ms(
    metrics: &RaftMetrics<NodeId, NodeInfo>,
    lease: Duration,
) -> Option<u64> {
    metrics
        .millis_since_quorum_ack
        .filter(|ms| metrics.state.is_leader() && Duration::from_millis(*ms) > lease)
}
