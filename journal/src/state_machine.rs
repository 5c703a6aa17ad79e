//! `StateMachineStore`: openraft's `RaftStateMachine` over an in-memory [`ReplicatedState`],
//! made durable by snapshots in the `snapshot` tree.
//!
//! This is the "persistent snapshot" design of openraft's `RaftStateMachine::apply` docs:
//! - `apply` mutates memory only (no I/O); the log and `committed` are what is durable;
//! - every snapshot (built here or installed from the leader) is persisted with one flush
//!   before openraft learns about it, and it is the only copy of applied state on disk;
//! - at open the state is loaded from the persisted snapshot; openraft's
//!   `StorageHelper::get_initial_state` (called by `Raft::new`) then re-applies the committed
//!   entries `(snapshot, committed]` from the log.
//!
//! The adapter is thin: it records `last_applied` and membership and hands normal payloads to
//! `ReplicatedState::apply`. Business logic lives in the state type, elsewhere.
//!
//! Concurrency: openraft applies and installs from one task, but builds snapshots in another.
//! Builders take a point-in-time clone under the read lock; snapshot persistence is
//! serialised by `snapshot_lock`, and a build never overwrites a newer persisted snapshot.

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
use crate::keys;
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

/// The Raft state machine. Clones share the in-memory state and the snapshot tree; a clone is
/// also the snapshot builder.
pub struct StateMachineStore<C: RaftTypeConfig, S> {
    db: sled::Db,
    snapshot: sled::Tree,
    state: StateHandle<C, S>,
    /// Last sequence number used in a snapshot id; persisted with each built snapshot.
    snapshot_seq: Arc<AtomicU64>,
    /// Serialises "compare with the persisted snapshot, write, flush" across builders and
    /// `install_snapshot`. A tokio mutex: it is held across the flush.
    snapshot_lock: Arc<tokio::sync::Mutex<()>>,
}

impl<C: RaftTypeConfig, S> Clone for StateMachineStore<C, S> {
    fn clone(&self) -> Self {
        StateMachineStore {
            db: self.db.clone(),
            snapshot: self.snapshot.clone(),
            state: self.state.clone(),
            snapshot_seq: self.snapshot_seq.clone(),
            snapshot_lock: self.snapshot_lock.clone(),
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

/// A snapshot as stored: its meta and the bytes openraft ships.
struct StoredSnapshot<C: RaftTypeConfig> {
    meta: SnapshotMeta<C::NodeId, C::Node>,
    data: Vec<u8>,
}

impl<C, S> StateMachineStore<C, S>
where
    C: JournalTypeConfig,
    S: ReplicatedState<C>,
{
    /// Loads the persisted snapshot, if any, into memory. Blocking (called at startup).
    pub(crate) fn open(db: sled::Db, snapshot: sled::Tree) -> Result<Self, JournalError> {
        let seq = match snapshot
            .get(keys::SNAPSHOT_SEQ)
            .map_err(|e| JournalError::sled("reading snapshot/seq", e))?
        {
            Some(v) => keys::be_u64("snapshot/seq", &v)?,
            None => 0,
        };
        let applied = match read_snapshot::<C>(&snapshot)? {
            Some(stored) => {
                let applied = decode_snapshot_data::<C, S>(&stored.meta, &stored.data)?;
                tracing::info!(snapshot = %stored.meta, "loaded state from snapshot");
                applied
            }
            None => AppliedState::default(),
        };
        Ok(StateMachineStore {
            db,
            snapshot,
            state: Arc::new(RwLock::new(applied)),
            snapshot_seq: Arc::new(AtomicU64::new(seq)),
            snapshot_lock: Arc::new(tokio::sync::Mutex::new(())),
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

    /// Writes `stored` as the current snapshot (one batch, one flush). With `only_if_newer`,
    /// keeps a persisted snapshot whose last log id is greater and returns `false`.
    async fn persist_snapshot(
        &self,
        stored: StoredSnapshot<C>,
        seq: Option<u64>,
        only_if_newer: bool,
    ) -> Result<bool, JournalError> {
        let _serialised = self.snapshot_lock.lock().await;
        if only_if_newer {
            let current: Option<SnapshotMeta<C::NodeId, C::Node>> = self
                .snapshot
                .get(keys::SNAPSHOT_META)
                .map_err(|e| JournalError::sled("reading snapshot/meta", e))?
                .map(|v| codec::decode(&v))
                .transpose()?;
            if let Some(current) = current {
                if current.last_log_id > stored.meta.last_log_id {
                    tracing::info!(kept = %current, built = %stored.meta, "not persisting an older snapshot");
                    return Ok(false);
                }
            }
        }
        let tree = self.snapshot.clone();
        tokio::task::spawn_blocking(move || {
            let mut batch = sled::Batch::default();
            batch.insert(keys::SNAPSHOT_META, codec::try_encode(&stored.meta)?);
            batch.insert(keys::SNAPSHOT_DATA, stored.data);
            if let Some(seq) = seq {
                batch.insert(keys::SNAPSHOT_SEQ, &seq.to_be_bytes());
            }
            tree.apply_batch(batch)
                .map_err(|e| JournalError::sled("writing the snapshot", e))
        })
        .await
        .map_err(JournalError::task)??;
        self.db
            .flush_async()
            .await
            .map_err(|e| JournalError::sled("flushing the snapshot", e))?;
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
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        self.persist_snapshot(stored, Some(seq), true).await?;
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
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        // Durable first, then visible: after a crash here the node restarts from this snapshot.
        self.persist_snapshot(stored, None, false).await?;
        *self
            .state
            .write()
            .map_err(|_| JournalError::StatePoisoned)? = applied;
        tracing::info!(snapshot = %meta, "installed snapshot");
        Ok(())
    }
}

/// Reads the current snapshot. Blocking.
fn read_snapshot<C: JournalTypeConfig>(
    tree: &sled::Tree,
) -> Result<Option<StoredSnapshot<C>>, JournalError> {
    let Some(meta) = tree
        .get(keys::SNAPSHOT_META)
        .map_err(|e| JournalError::sled("reading snapshot/meta", e))?
    else {
        return Ok(None);
    };
    let meta: SnapshotMeta<C::NodeId, C::Node> = codec::decode(&meta)?;
    let data = tree
        .get(keys::SNAPSHOT_DATA)
        .map_err(|e| JournalError::sled("reading snapshot/data", e))?
        .ok_or_else(|| {
            JournalError::corrupt(format!(
                "snapshot {} has meta but no data",
                meta.snapshot_id
            ))
        })?;
    Ok(Some(StoredSnapshot {
        meta,
        data: data.to_vec(),
    }))
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
        let tree = self.snapshot.clone();
        let stored = tokio::task::spawn_blocking(move || read_snapshot::<C>(&tree))
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
        let stored = |index, id| StoredSnapshot::<ToyConfig> {
            meta: meta(index, id),
            data: vec![],
        };

        assert!(
            sm.persist_snapshot(stored(10, "installed"), None, false)
                .await?
        );
        assert!(
            !sm.persist_snapshot(stored(5, "late-build"), Some(1), true)
                .await?
        );
        let current = read_snapshot::<ToyConfig>(&sm.snapshot)?.expect("snapshot");
        assert_eq!(current.meta, meta(10, "installed"));

        assert!(
            sm.persist_snapshot(stored(12, "newer-build"), Some(2), true)
                .await?
        );
        assert!(
            sm.persist_snapshot(stored(3, "install"), None, false)
                .await?
        );
        let current = read_snapshot::<ToyConfig>(&sm.snapshot)?.expect("snapshot");
        assert_eq!(current.meta, meta(3, "install"));
        Ok(())
    }
}
