//! `StateReader`: reads of the applied state that must be current, and long polls on it.
//!
//! A read is current when this replica is the leader, a quorum confirmed it after the request
//! arrived, and it applied everything committed before (`linearizable`). A long poll then
//! re-reads the state after every applied entry until the caller's view changed, its deadline
//! passed, or this replica stopped leading (the caller then asks again, maybe elsewhere).

use crate::error::DispatcherError;
use crate::ids::NodeId;
use crate::raft_error::raft_error;
use crate::raft_types::{Raft, StateHandle};
use crate::state::DispatcherState;
use std::time::Duration;
use tokio::time::Instant;

/// How long a linearizable read waits for a quorum to confirm the leader before the caller
/// hears `Unavailable`.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone)]
pub struct StateReader {
    id: NodeId,
    raft: Raft,
    state: StateHandle,
    /// A leader no quorum acknowledged for this long is probably deposed (or cut off): it
    /// answers `Unavailable` at once instead of letting callers wait on writes that cannot
    /// commit.
    quorum_lease: Duration,
}

impl StateReader {
    pub fn new(id: NodeId, raft: Raft, state: StateHandle, quorum_lease: Duration) -> Self {
        StateReader {
            id,
            raft,
            state,
            quorum_lease,
        }
    }

    /// Fails fast when this replica leads but no quorum acknowledged it within the lease.
    pub fn check_quorum(&self) -> Result<(), DispatcherError> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        match m.millis_since_quorum_ack {
            Some(ms) if m.state.is_leader() && Duration::from_millis(ms) > self.quorum_lease => {
                Err(DispatcherError::QuorumUnavailable(format!(
                    "no quorum has acknowledged this leader for {ms} ms"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Waits until this replica is the confirmed leader and has applied everything committed
    /// before the call, so the state read next is current.
    pub async fn linearizable(&self) -> Result<(), DispatcherError> {
        self.check_quorum()?;
        let confirmed = tokio::time::timeout(CONFIRM_TIMEOUT, self.raft.ensure_linearizable())
            .await
            .map_err(|_| {
                DispatcherError::QuorumUnavailable("no quorum confirmed the leader in time".into())
            })?;
        confirmed.map(|_| ()).map_err(raft_error)
    }

    /// Reads the applied state (current only after [`StateReader::linearizable`]).
    pub fn read<T>(&self, f: impl FnOnce(&DispatcherState) -> T) -> T {
        let applied = self.state.read().expect("state lock poisoned");
        f(&applied.state)
    }

    /// Evaluates `view` now and after each applied entry; returns its value once it reports a
    /// change, when `deadline` passes, or when this replica no longer leads.
    pub async fn long_poll<T>(
        &self,
        deadline: Instant,
        mut view: impl FnMut(&DispatcherState) -> Result<(T, bool), DispatcherError>,
    ) -> Result<T, DispatcherError> {
        loop {
            let (value, changed) = self.read(&mut view)?;
            if changed || !self.wait_for_change(deadline).await {
                return Ok(value);
            }
        }
    }

    /// Waits for the next applied entry, or until `deadline`; false when the deadline passed or
    /// this replica is no longer the leader.
    async fn wait_for_change(&self, deadline: Instant) -> bool {
        let mut metrics = self.raft.metrics();
        metrics.borrow_and_update();
        if metrics.borrow().current_leader != Some(self.id) {
            return false;
        }
        matches!(
            tokio::time::timeout_at(deadline, metrics.changed()).await,
            Ok(Ok(()))
        )
    }
}
