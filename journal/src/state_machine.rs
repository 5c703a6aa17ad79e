//! `StateMachineStore`: openraft's `RaftStateMachine` over an in-memory [`ReplicatedState`],
//! made durable by snapshots in the data dir's snapshot file (`snapshot_file.rs`).
//!
//! This is the "persistent snapshot" design of openraft's `RaftStateMachine::apply` docs:
//! - `apply` mutates memory only (no I/O); the log and `committed` are what is durable;
//! - every snapshot (built here or installed from the leader) is written and synced before
//!   openraft learns about it, and it is the only copy of applied state on disk;
//! - at open the state is loaded from the persisted snapshot; openraft's
//!   `StorageHelper::get_initial_state` (called by `Raft::new`) then re-applies the committed
//!   entries `(snapshot, committed]` from the log.
//!
//! The adapter is thin: it records `last_applied` and membership and hands normal payloads to
//! `ReplicatedState::apply`. Business logic lives in the state type, elsewhere.
//!
//! Concurrency: openraft applies and installs from one task, but builds snapshots in another.
//! Builders take a point-in-time clone under the read lock; snapshot persistence is
//! serialised by `persisted`, and a build never overwrites a newer persisted snapshot.

use std::fmt::Debug;
use std::io::Cursor;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::RwLock;

use openraft::storage::RaftStateMachine;
use openraft::storage::Snapshot;
use openraft::Entry;
use openraft::EntryPayload;
use openraft::ErrorSubject;
use openraft::ErrorVerb;
use openraft::LogId;
use openraft::RaftSnapshotBuilder;
use openraft::RaftTypeConfig;
use openraft::SnapshotMeta;
use openraft::StorageError;
use openraft::StoredMembership;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde::Serialize;

use crate::codec;
use crate::error::JournalError;
use crate::snapshot_file::SnapshotFile;
use crate::snapshot_file::StoredSnapshot;
use crate::type_config::JournalTypeConfig;

type StorageResult<T, C> = Result<T, StorageError<<C as RaftTypeConfig>::NodeId>>;

/// The replicated state persisted by the journal. Pure: no I/O, clock or randomness, so that
/// the same log gives the same state on every replica.
pub trait ReplicatedState<C: RaftTypeConfig>:
    Default + Clone + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// Applies the payload of one normal log entry and returns its response.
    fn apply(&mut self, log_id: &LogId<C::NodeId>, data: &C::D) -> C::R;
}

/// Everything the state machine holds in memory: the state plus Raft's bookkeeping.
///
/// Its codec encoding is also the snapshot data shipped to followers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(bound(serialize = "S: Serialize", deserialize = "S: DeserializeOwned"))]
pub struct AppliedState<C: RaftTypeConfig, S> {
    /// The last log entry applied to `state`.
    pub last_applied: Option<LogId<C::NodeId>>,
    /// The last membership config applied.
    pub last_membership: StoredMembership<C::NodeId, C::Node>,
    /// The application state.
    pub state: S,
}

/// Shared read access for the dispatcher's queries.
///
/// A std `RwLock` because no holder awaits under it (readers must not either): `apply` takes
/// the write lock for one batch of entries, snapshot building clones under the read lock.
pub type StateHandle<C, S> = Arc<RwLock<AppliedState<C, S>>>;

/// The last log id of the persisted snapshot (`None`: none, or one of an empty state).
type PersistedLogId<C> = Option<LogId<<C as RaftTypeConfig>::NodeId>>;

/// The Raft state machine. Clones share the in-memory state and the snapshot file; a clone is
/// also the snapshot builder.
pub struct StateMachineStore<C: RaftTypeConfig, S> {
    file: SnapshotFile,
    state: StateHandle<C, S>,
    /// Last sequence number used in a snapshot id; persisted with each snapshot.
    snapshot_seq: Arc<AtomicU64>,
    /// What the snapshot file holds. Its lock serialises "compare with the persisted snapshot,
    /// write, sync" across builders and `install_snapshot`; a tokio mutex, held across the
    /// write.
    persisted: Arc<tokio::sync::Mutex<PersistedLogId<C>>>,
}

impl<C: RaftTypeConfig, S> Clone for StateMachineStore<C, S> {
    fn clone(&self) -> Self {
        StateMachineStore {
            file: self.file.clone(),
            state: self.state.clone(),
            snapshot_seq: self.snapshot_seq.clone(),
            persisted: self.persisted.clone(),
        }
    }
}

impl<C: RaftTypeConfig, S> Debug for StateMachineStore<C, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMachineStore")
            .field("snapshot_seq", &self.snapshot_seq)
            .finish_non_exhaustive()
    }
}

impl<C, S> StateMachineStore<C, S>
where
    C: JournalTypeConfig,
    S: ReplicatedState<C>,
{
    /// Loads the persisted snapshot, if any, into memory. Blocking (called at startup).
    pub(crate) fn open(file: SnapshotFile) -> Result<Self, JournalError> {
        let (applied, seq, persisted) = match file.read::<C>()? {
            Some(stored) => {
                let applied = decode_snapshot_data::<C, S>(&stored.meta, &stored.data)?;
                tracing::info!(snapshot = %stored.meta, "loaded state from snapshot");
                (applied, stored.seq, stored.meta.last_log_id)
            }
            None => (AppliedState::default(), 0, None),
        };
        Ok(StateMachineStore {
            file,
            state: Arc::new(RwLock::new(applied)),
            snapshot_seq: Arc::new(AtomicU64::new(seq)),
            persisted: Arc::new(tokio::sync::Mutex::new(persisted)),
        })
    }

    /// Shared read access to the in-memory state.
    pub fn handle(&self) -> StateHandle<C, S> {
        self.state.clone()
    }

    fn apply_entries(
        &self,
        entries: impl Iterator<Item = Entry<C>>,
    ) -> Result<Vec<C::R>, JournalError> {
        let mut guard = self
            .state
            .write()
            .map_err(|_| JournalError::StatePoisoned)?;
        let applied = &mut *guard;
        let mut responses = Vec::with_capacity(entries.size_hint().0);
        for entry in entries {
            let response = match entry.payload {
                EntryPayload::Blank => C::R::default(),
                EntryPayload::Normal(ref data) => applied.state.apply(&entry.log_id, data),
                EntryPayload::Membership(membership) => {
                    applied.last_membership =
                        StoredMembership::new(Some(entry.log_id.clone()), membership);
                    C::R::default()
                }
            };
            applied.last_applied = Some(entry.log_id);
            responses.push(response);
        }
        Ok(responses)
    }

    /// Writes `stored` as the current snapshot (written, synced, renamed into place). With
    /// `only_if_newer`, keeps a persisted snapshot whose last log id is greater and returns
    /// `false`.
    async fn persist_snapshot(
        &self,
        meta: SnapshotMeta<C::NodeId, C::Node>,
        data: Vec<u8>,
        only_if_newer: bool,
    ) -> Result<bool, JournalError> {
        let mut persisted = self.persisted.lock().await;
        if only_if_newer && *persisted > meta.last_log_id {
            tracing::info!(kept = ?*persisted, built = %meta, "not persisting an older snapshot");
            return Ok(false);
        }
        let last_log_id = meta.last_log_id.clone();
        // Every sequence number handed out so far is at most this, so ids stay unique after a
        // restart from this file.
        let seq = self.snapshot_seq.load(Ordering::SeqCst);
        let stored = StoredSnapshot::<C> { meta, data, seq };
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || file.write(stored))
            .await
            .map_err(JournalError::task)??;
        *persisted = last_log_id;
        Ok(true)
    }

    async fn build(&self) -> Result<Snapshot<C>, JournalError> {
        // Point-in-time view: clone under the read lock, encode outside it.
        let applied = self
            .state
            .read()
            .map_err(|_| JournalError::StatePoisoned)?
            .clone();
        let seq = self.snapshot_seq.fetch_add(1, Ordering::SeqCst) + 1;
        let snapshot_id = match &applied.last_applied {
            Some(last) => format!("{}-{}-{}", last.leader_id, last.index, seq),
            None => format!("none-{seq}"),
        };
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied.clone(),
            last_membership: applied.last_membership.clone(),
            snapshot_id,
        };
        let data = tokio::task::spawn_blocking(move || codec::try_encode(&applied))
            .await
            .map_err(JournalError::task)??;
        self.persist_snapshot(meta.clone(), data.clone(), true)
            .await?;
        tracing::info!(snapshot = %meta, bytes = data.len(), "built snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }

    async fn install(
        &self,
        meta: &SnapshotMeta<C::NodeId, C::Node>,
        data: Vec<u8>,
    ) -> Result<(), JournalError> {
        let decode_meta = meta.clone();
        let (applied, data) = tokio::task::spawn_blocking(move || {
            decode_snapshot_data::<C, S>(&decode_meta, &data).map(|applied| (applied, data))
        })
        .await
        .map_err(JournalError::task)??;
        // Durable first, then visible: after a crash here the node restarts from this snapshot.
        self.persist_snapshot(meta.clone(), data, false).await?;
        *self
            .state
            .write()
            .map_err(|_| JournalError::StatePoisoned)? = applied;
        tracing::info!(snapshot = %meta, "installed snapshot");
        Ok(())
    }
}

/// Decodes snapshot bytes and checks they are the state `meta` describes.
fn decode_snapshot_data<C, S>(
    meta: &SnapshotMeta<C::NodeId, C::Node>,
    data: &[u8],
) -> Result<AppliedState<C, S>, JournalError>
where
    C: JournalTypeConfig,
    S: ReplicatedState<C>,
{
    let applied: AppliedState<C, S> = codec::decode(data)?;
    if applied.last_applied != meta.last_log_id || applied.last_membership != meta.last_membership {
        return Err(JournalError::corrupt(format!(
            "snapshot {} data does not match its meta (data: last applied {:?}, membership {}; meta: last log id {:?})",
            meta.snapshot_id, applied.last_applied, applied.last_membership, meta.last_log_id
        )));
    }
    Ok(applied)
}

impl<C, S> RaftSnapshotBuilder<C> for StateMachineStore<C, S>
where
    C: JournalTypeConfig,
    S: ReplicatedState<C>,
{
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<C>, C> {
        self.build()
            .await
            .map_err(|e| e.into_storage(ErrorSubject::Snapshot(None), ErrorVerb::Write))
    }
}

impl<C, S> RaftStateMachine<C> for StateMachineStore<C, S>
where
    C: JournalTypeConfig,
    S: ReplicatedState<C>,
{
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<
        (
            Option<LogId<C::NodeId>>,
            StoredMembership<C::NodeId, C::Node>,
        ),
        C,
    > {
        let guard = self.state.read().map_err(|_| {
            JournalError::StatePoisoned.into_storage(ErrorSubject::StateMachine, ErrorVerb::Read)
        })?;
        Ok((guard.last_applied.clone(), guard.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<C::R>, C>
    where
        I: IntoIterator<Item = Entry<C>> + Send,
        I::IntoIter: Send,
    {
        self.apply_entries(entries.into_iter())
            .map_err(|e| e.into_storage(ErrorSubject::StateMachine, ErrorVerb::Write))
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>, C> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<C::NodeId, C::Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<(), C> {
        self.install(meta, snapshot.into_inner())
            .await
            .map_err(|e| {
                e.into_storage(
                    ErrorSubject::Snapshot(Some(meta.signature())),
                    ErrorVerb::Write,
                )
            })
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<C>>, C> {
        let file = self.file.clone();
        let stored = tokio::task::spawn_blocking(move || file.read::<C>())
            .await
            .map_err(JournalError::task)
            .and_then(|r| r)
            .map_err(|e| e.into_storage(ErrorSubject::Snapshot(None), ErrorVerb::Read))?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::testing::log_id;

    use super::*;
    use crate::test_support::KvState;
    use crate::test_support::ToyConfig;

    fn meta(index: u64, id: &str) -> SnapshotMeta<u64, openraft::BasicNode> {
        SnapshotMeta {
            last_log_id: Some(log_id(1, 1, index)),
            last_membership: StoredMembership::default(),
            snapshot_id: id.to_string(),
        }
    }

    /// A build that cloned the state before an install, but persists after it, must not
    /// replace the installed (newer) snapshot; an install always replaces.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_older_build_does_not_replace_a_newer_snapshot() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let journal = crate::test_support::open_or_create(tmp.path())?;
        let sm = journal.state_machine::<ToyConfig, KvState>()?;
        let persist =
            |index, id, only_if_newer| sm.persist_snapshot(meta(index, id), vec![], only_if_newer);
        let current =
            || -> anyhow::Result<_> { Ok(sm.file.read::<ToyConfig>()?.expect("a snapshot").meta) };

        assert!(persist(10, "installed", false).await?);
        assert!(!persist(5, "late-build", true).await?);
        assert_eq!(current()?, meta(10, "installed"));

        assert!(persist(12, "newer-build", true).await?);
        assert!(persist(3, "install", false).await?);
        assert_eq!(current()?, meta(3, "install"));
        Ok(())
    }
}
