//! `LogStore`: openraft's `RaftLogStorage` (log entries, vote, committed, last purged) on the
//! journal's sled trees `raft_log` and `raft_meta`.
//!
//! Durability rules: `save_vote` and `truncate` flush before they return; `purge` flushes its
//! new `last_purged` and then removes the entries without another flush; `append` writes one
//! sled batch, which makes the entries readable, and calls the `LogFlushed` callback only after
//! the flush that makes them durable (with the real error if the flush fails). A sled flush
//! covers every tree, so one flush per operation is enough. `save_committed` is the exception,
//! see there.
//!
//! openraft serialises all calls on one `LogStore` (and its clones used as log readers only
//! read), so no locking is needed here.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::Bound;
use std::ops::RangeBounds;

use openraft::storage::LogFlushed;
use openraft::storage::LogState;
use openraft::storage::RaftLogStorage;
use openraft::Entry;
use openraft::ErrorSubject;
use openraft::ErrorVerb;
use openraft::LogId;
use openraft::RaftLogReader;
use openraft::StorageError;
use openraft::Vote;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec;
use crate::error::JournalError;
use crate::keys;
use crate::type_config::JournalTypeConfig;

type StorageResult<T, C> = Result<T, StorageError<<C as openraft::RaftTypeConfig>::NodeId>>;

/// The Raft log store. Clones share the same sled trees; a clone is also the log reader.
pub struct LogStore<C> {
    db: sled::Db,
    raft_log: sled::Tree,
    raft_meta: sled::Tree,
    _config: PhantomData<C>,
}

impl<C> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        LogStore {
            db: self.db.clone(),
            raft_log: self.raft_log.clone(),
            raft_meta: self.raft_meta.clone(),
            _config: PhantomData,
        }
    }
}

impl<C> Debug for LogStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

impl<C: JournalTypeConfig> LogStore<C> {
    pub(crate) fn new(db: sled::Db, raft_log: sled::Tree, raft_meta: sled::Tree) -> Self {
        LogStore {
            db,
            raft_log,
            raft_meta,
            _config: PhantomData,
        }
    }

    fn read_meta<T: DeserializeOwned>(
        &self,
        key: &'static [u8],
    ) -> Result<Option<T>, JournalError> {
        let value = self
            .raft_meta
            .get(key)
            .map_err(|e| JournalError::sled(format!("reading raft_meta/{}", show_key(key)), e))?;
        value.map(|v| codec::decode(&v)).transpose()
    }

    fn write_meta<T: Serialize>(&self, key: &'static [u8], value: &T) -> Result<(), JournalError> {
        self.raft_meta
            .insert(key, codec::try_encode(value)?)
            .map_err(|e| JournalError::sled(format!("writing raft_meta/{}", show_key(key)), e))?;
        Ok(())
    }

    async fn flush(&self, context: &str) -> Result<(), JournalError> {
        self.db
            .flush_async()
            .await
            .map_err(|e| JournalError::sled(format!("flushing {context}"), e))?;
        Ok(())
    }

    fn read_last_log_id(&self) -> Result<Option<LogId<C::NodeId>>, JournalError> {
        let last = self
            .raft_log
            .last()
            .map_err(|e| JournalError::sled("reading the last log entry", e))?;
        let Some((key, value)) = last else {
            return Ok(None);
        };
        let entry: Entry<C> = codec::decode(&value)?;
        check_index(keys::log_index(&key)?, &entry)?;
        Ok(Some(entry.log_id))
    }

    /// Removes the log entries with index `since` and after (a truncation), the last first, in
    /// batches of [`REMOVALS_PER_BATCH`]: a crash midway leaves a shorter log, never a hole.
    /// Blocking.
    fn remove_since(raft_log: &sled::Tree, since: u64) -> Result<usize, JournalError> {
        let mut keys = Vec::new();
        for item in raft_log.range(keys::log_key(since)..) {
            let (key, _) =
                item.map_err(|e| JournalError::sled("scanning log entries to delete", e))?;
            keys.push(key);
        }
        Self::remove_keys(raft_log, keys.into_iter().rev())
    }

    /// Removes the log entries up to index `upto` (a purge), the first first, in batches of
    /// [`REMOVALS_PER_BATCH`]: a crash midway leaves entries at or below `last_purged`, which
    /// the next purge removes. The keys are computed from the first present index (the log has
    /// no holes), so no entry is read. Blocking.
    fn remove_upto(raft_log: &sled::Tree, upto: u64) -> Result<usize, JournalError> {
        let first = raft_log
            .first()
            .map_err(|e| JournalError::sled("reading the first log entry", e))?;
        let Some((first, _)) = first else {
            return Ok(0);
        };
        let first = keys::log_index(&first)?;
        Self::remove_keys(raft_log, (first..=upto).map(keys::log_key))
    }

    /// Removes `keys` in order, [`REMOVALS_PER_BATCH`] to a sled batch. Blocking.
    fn remove_keys<K: AsRef<[u8]>>(
        raft_log: &sled::Tree,
        keys: impl Iterator<Item = K>,
    ) -> Result<usize, JournalError> {
        let mut batch = sled::Batch::default();
        let (mut in_batch, mut n) = (0, 0);
        for key in keys {
            batch.remove(key.as_ref());
            in_batch += 1;
            n += 1;
            if in_batch == REMOVALS_PER_BATCH {
                raft_log
                    .apply_batch(std::mem::take(&mut batch))
                    .map_err(|e| JournalError::sled("deleting log entries", e))?;
                in_batch = 0;
            }
        }
        if in_batch > 0 {
            raft_log
                .apply_batch(batch)
                .map_err(|e| JournalError::sled("deleting log entries", e))?;
        }
        Ok(n)
    }

    async fn append_entries(&self, entries: Vec<Entry<C>>) -> Result<(), JournalError> {
        let raft_log = self.raft_log.clone();
        tokio::task::spawn_blocking(move || {
            let mut batch = sled::Batch::default();
            for entry in &entries {
                batch.insert(
                    &keys::log_key(entry.log_id.index),
                    codec::try_encode(entry)?,
                );
            }
            raft_log
                .apply_batch(batch)
                .map_err(|e| JournalError::sled("writing log entries", e))
        })
        .await
        .map_err(JournalError::task)?
    }
}

/// Log entries removed per sled batch by a purge or a truncation. openraft purges up to a
/// snapshot's worth of entries at once (50,000 by default). As one sled batch, the first purge
/// of a 400,000-job soak took the leader from 50 to 159 MiB resident, and it stayed at 114; in
/// batches of 1,024, 64 and then 56 MiB.
const REMOVALS_PER_BATCH: usize = 1024;

/// What one append to a follower carries at most, in encoded entry bytes (a single larger
/// entry still goes, alone). openraft gives an append one heartbeat interval to reach the
/// follower and be written there; 1 MiB is 8 ms on a 1 Gbit/s link. Without a bound, a
/// follower that fell behind would be sent everything it lacks at once, and never in time.
pub const MAX_APPEND_BYTES: usize = 1024 * 1024;

/// Reads the contiguous run of entries present in `[start, end]` (inclusive), stopping before
/// the entry that would take their encodings past `max_bytes` (the first entry always comes).
/// Blocking.
fn read_entries<C: JournalTypeConfig>(
    raft_log: &sled::Tree,
    start: u64,
    end: u64,
    max_bytes: usize,
) -> Result<Vec<Entry<C>>, JournalError> {
    let mut out: Vec<Entry<C>> = Vec::new();
    let mut bytes = 0usize;
    for item in raft_log.range(keys::log_key(start)..=keys::log_key(end)) {
        let (key, value) = item.map_err(|e| JournalError::sled("reading log entries", e))?;
        bytes = bytes.saturating_add(value.len());
        if bytes > max_bytes && !out.is_empty() {
            break;
        }
        let index = keys::log_index(&key)?;
        let entry: Entry<C> = codec::decode(&value)?;
        check_index(index, &entry)?;
        if let Some(prev) = out.last() {
            if prev.log_id.index + 1 != index {
                // The log never has holes (openraft's invariant); if one appears, return the
                // contiguous prefix so that nothing after a hole is treated as present.
                tracing::error!(
                    after = prev.log_id.index,
                    found = index,
                    "hole in the raft log"
                );
                break;
            }
        }
        out.push(entry);
    }
    Ok(out)
}

/// `[start, end]` of a `RangeBounds<u64>`, or `None` if it is empty.
fn inclusive_bounds(range: &impl RangeBounds<u64>) -> Option<(u64, u64)> {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => *e,
        Bound::Excluded(e) => e.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (start <= end).then_some((start, end))
}

fn check_index<C: JournalTypeConfig>(key_index: u64, entry: &Entry<C>) -> Result<(), JournalError> {
    if key_index != entry.log_id.index {
        return Err(JournalError::corrupt(format!(
            "raft_log key {key_index} holds the entry of log id {}",
            entry.log_id
        )));
    }
    Ok(())
}

fn show_key(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

impl<C: JournalTypeConfig> RaftLogReader<C> for LogStore<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<C>>, C> {
        let Some((start, end)) = inclusive_bounds(&range) else {
            return Ok(Vec::new());
        };
        self.read_bounded(start, end, usize::MAX).await
    }

    /// Entries for one append to a follower: `[start, end)`, cut at [`MAX_APPEND_BYTES`].
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> StorageResult<Vec<Entry<C>>, C> {
        let Some(last) = end.checked_sub(1).filter(|last| start <= *last) else {
            return Ok(Vec::new());
        };
        self.read_bounded(start, last, MAX_APPEND_BYTES).await
    }
}

impl<C: JournalTypeConfig> LogStore<C> {
    /// `read_entries` off the runtime.
    async fn read_bounded(
        &self,
        start: u64,
        end: u64,
        max_bytes: usize,
    ) -> StorageResult<Vec<Entry<C>>, C> {
        let raft_log = self.raft_log.clone();
        tokio::task::spawn_blocking(move || read_entries::<C>(&raft_log, start, end, max_bytes))
            .await
            .map_err(JournalError::task)
            .and_then(|r| r)
            .map_err(|e| e.into_storage(ErrorSubject::LogIndex(start), ErrorVerb::Read))
    }
}

impl<C: JournalTypeConfig> RaftLogStorage<C> for LogStore<C> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<C>, C> {
        let last_purged_log_id: Option<LogId<C::NodeId>> =
            self.read_meta(keys::META_LAST_PURGED)
                .map_err(|e| e.into_storage(ErrorSubject::Store, ErrorVerb::Read))?;
        let last_log_id = self
            .read_last_log_id()
            .map_err(|e| e.into_storage(ErrorSubject::Logs, ErrorVerb::Read))?;
        Ok(LogState {
            last_log_id: last_log_id.or_else(|| last_purged_log_id.clone()),
            last_purged_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<C::NodeId>) -> StorageResult<(), C> {
        let res = async {
            self.write_meta(keys::META_VOTE, vote)?;
            self.flush("the vote").await
        };
        res.await
            .map_err(|e| e.into_storage(ErrorSubject::Vote, ErrorVerb::Write))
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<C::NodeId>>, C> {
        self.read_meta(keys::META_VOTE)
            .map_err(|e| e.into_storage(ErrorSubject::Vote, ErrorVerb::Read))
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> StorageResult<(), C> {
        // Written without a flush, deliberately: it rides along with the next flush (an append,
        // a vote, a purge, or sled's 500 ms background flush). Losing it in a crash only makes
        // this node re-apply fewer entries at startup and re-learn the commit index from the
        // leader. It never points past durable entries: openraft 0.9 runs `Commit` after the
        // `AppendInputEntries` of the same entries and waits for each append's flush callback
        // before running the next command (`core/raft_core.rs`, `append_to_log`).
        self.write_meta(keys::META_COMMITTED, &committed)
            .map_err(|e| e.into_storage(ErrorSubject::Store, ErrorVerb::Write))
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<C::NodeId>>, C> {
        let committed: Option<Option<LogId<C::NodeId>>> = self
            .read_meta(keys::META_COMMITTED)
            .map_err(|e| e.into_storage(ErrorSubject::Store, ErrorVerb::Read))?;
        Ok(committed.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<C>) -> StorageResult<(), C>
    where
        I: IntoIterator<Item = Entry<C>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry<C>> = entries.into_iter().collect();
        let subject = match entries.first() {
            Some(first) => ErrorSubject::Log(first.log_id.clone()),
            None => ErrorSubject::Logs,
        };

        // One batch: once it is applied the entries are readable (the contract for returning).
        if let Err(e) = self.append_entries(entries).await {
            callback.log_io_completed(Err(e.to_io()));
            return Err(e.into_storage(subject, ErrorVerb::Write));
        }

        // One flush: only now are the entries durable, and only now may openraft count this
        // node towards a quorum. A failed flush is reported through the callback, which makes
        // openraft stop the node.
        match self.flush("appended log entries").await {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(e.to_io())),
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> StorageResult<(), C> {
        tracing::debug!(since = %log_id, "truncate log");
        let raft_log = self.raft_log.clone();
        let since = log_id.index;
        let res = async {
            tokio::task::spawn_blocking(move || Self::remove_since(&raft_log, since))
                .await
                .map_err(JournalError::task)??;
            self.flush("log truncation").await
        };
        res.await
            .map_err(|e| e.into_storage(ErrorSubject::Log(log_id.clone()), ErrorVerb::Delete))
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> StorageResult<(), C> {
        tracing::debug!(upto = %log_id, "purge log");
        let raft_log = self.raft_log.clone();
        let upto = log_id.index;
        let res = async {
            // `last_purged` first, and durable before any entry goes: a crash in between must
            // leave "entries at or below last_purged still present" (harmless, openraft ignores
            // them), never "entries gone but last_purged old" (a hole at the head of the log).
            self.write_meta(keys::META_LAST_PURGED, &log_id)?;
            self.flush("last purged log id").await?;
            // The removal rides along with the next flush: until then a crash only leaves
            // entries at or below `last_purged` behind, which openraft ignores. A flush here
            // would hold up Raft's core (it waits for each purge) once more per purge.
            tokio::task::spawn_blocking(move || Self::remove_upto(&raft_log, upto))
                .await
                .map_err(JournalError::task)??;
            Ok::<(), JournalError>(())
        };
        res.await
            .map_err(|e| e.into_storage(ErrorSubject::Log(log_id.clone()), ErrorVerb::Delete))
    }
}

#[cfg(test)]
mod tests {
    use super::inclusive_bounds;

    #[test]
    fn inclusive_bounds_of_ranges() {
        assert_eq!(inclusive_bounds(&(3..3)), None);
        assert_eq!(inclusive_bounds(&(3..4)), Some((3, 3)));
        assert_eq!(inclusive_bounds(&(3..=3)), Some((3, 3)));
        assert_eq!(inclusive_bounds(&(0..0)), None);
        assert_eq!(inclusive_bounds(&(5..)), Some((5, u64::MAX)));
        assert_eq!(inclusive_bounds(&(..)), Some((0, u64::MAX)));
        assert_eq!(
            inclusive_bounds(&(std::ops::Bound::Included(7), std::ops::Bound::Excluded(2))),
            None
        );
        assert_eq!(
            inclusive_bounds(&(
                std::ops::Bound::Excluded(u64::MAX),
                std::ops::Bound::Unbounded
            )),
            None
        );
    }
}
