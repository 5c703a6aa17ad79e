//! The leader's side of readers' admissions (see `sluice_security::fetch_admission`): the
//! cluster's fetch key, set in the replicated state the first time a leader needs it, and the
//! admission of each iteration client signed with it.
//!
//! The key is chosen here, at random, outside `apply`, and travels in a `SetFetchKey` update;
//! the state keeps the first one applied, so leaders racing to set one agree on it once it
//! is committed. A leader elected over a state without a key (a fresh cluster, or one whose
//! log began before keys existed) sets one from its timers, and any handler that needs the key
//! (an admission, a worker's heartbeat reply) sets it first if no timer has yet.

use crate::error::DispatcherError;
use crate::proposer::ProposerHandle;
use crate::state::DispatcherState;
use sluice_security::{Admission, FetchKey};
use sluice_types::{ClientId, IterationId};

/// The cluster's fetch key: the state's (read by `read`), or, when it has none, the one a
/// `SetFetchKey` of a fresh random key leaves there (this one, or another leader's that was
/// applied first).
pub(crate) async fn fetch_key(
    read: impl Fn() -> Option<FetchKey>,
    proposer: &ProposerHandle,
) -> Result<FetchKey, DispatcherError> {
    if let Some(key) = read() {
        return Ok(key);
    }
    proposer.set_fetch_key(FetchKey::random()).await?;
    // The entry is applied on this replica before the proposer answers.
    read().ok_or_else(|| DispatcherError::UnexpectedOutcome {
        update: "set_fetch_key",
        outcome: "the state has no fetch key after it was set".into(),
    })
}

/// The state's fetch key, cloned out of the lock.
pub(crate) fn key_of(state: &DispatcherState) -> Option<FetchKey> {
    state.fetch_key().cloned()
}

/// What a client admitted to an iteration presents to the workers.
pub(crate) fn admission(
    key: &FetchKey,
    iteration_id: IterationId,
    client_id: ClientId,
) -> Admission {
    key.admit(iteration_id.0, client_id.0)
}
