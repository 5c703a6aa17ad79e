//! `SnapshotFile`: the one current snapshot, in a file of its own beside the sled database.
//!
//! A snapshot is megabytes written at once. Inside sled it went through sled's log and its
//! flush, which every Raft append waits behind: each snapshot stalled the log's flushes for as
//! long as it took to write. In its own file it is written and synced beside them.
//!
//! Layout of `SNAPSHOT` (integers little-endian):
//!
//! | field | bytes |
//! |---|---|
//! | magic `SLSNAP01` | 8 |
//! | sequence number of the last built snapshot (ids stay unique across restarts) | 8 |
//! | length of the meta, M | 4 |
//! | codec(`SnapshotMeta`) | M |
//! | length of the data, D | 8 |
//! | the data exactly as shipped to followers: codec((last applied, membership, state)) | D |
//! | CRC-32 of everything before | 4 |
//!
//! Invariant: `SNAPSHOT` is absent or complete and durable. It is written to `SNAPSHOT.tmp`,
//! synced, renamed over `SNAPSHOT`, and the directory synced; a crash leaves at most a stale
//! `SNAPSHOT.tmp`, which the next write replaces. A file that fails its checksum or layout is
//! refused by name: the replica would otherwise start from a state it never had.

use std::fs;
use std::io;
use std::path::Path;
use std::path::PathBuf;

use openraft::SnapshotMeta;

use crate::codec;
use crate::error::JournalError;
use crate::format::write_durably;
use crate::type_config::JournalTypeConfig;

/// Name of the snapshot file inside the data dir.
pub const SNAPSHOT_FILE: &str = "SNAPSHOT";
const MAGIC: &[u8; 8] = b"SLSNAP01";

/// A snapshot as stored: its meta, the bytes openraft ships, and the build sequence number.
pub(crate) struct StoredSnapshot<C: JournalTypeConfig> {
    pub(crate) meta: SnapshotMeta<C::NodeId, C::Node>,
    pub(crate) data: Vec<u8>,
    /// The last sequence number used in a built snapshot's id when this one was written.
    pub(crate) seq: u64,
}

/// The file's content with the meta still encoded: what an upgrade moves without knowing the
/// type config.
pub(crate) struct RawSnapshot {
    pub(crate) seq: u64,
    pub(crate) meta: Vec<u8>,
    pub(crate) data: Vec<u8>,
}

/// The snapshot file of one data dir. Blocking: call from `spawn_blocking` or at startup.
#[derive(Clone, Debug)]
pub(crate) struct SnapshotFile {
    dir: PathBuf,
}

impl SnapshotFile {
    pub(crate) fn new(dir: &Path) -> Self {
        SnapshotFile {
            dir: dir.to_path_buf(),
        }
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_FILE)
    }

    /// Whether a snapshot has been written.
    pub(crate) fn exists(&self) -> Result<bool, JournalError> {
        let path = self.path();
        path.try_exists()
            .map_err(|source| JournalError::Io { path, source })
    }

    /// The current snapshot, `None` if none was ever written.
    pub(crate) fn read<C: JournalTypeConfig>(
        &self,
    ) -> Result<Option<StoredSnapshot<C>>, JournalError> {
        let Some(raw) = self.read_raw()? else {
            return Ok(None);
        };
        let meta = codec::decode(&raw.meta)
            .map_err(|e| JournalError::corrupt(format!("{}: meta: {e}", self.path().display())))?;
        Ok(Some(StoredSnapshot {
            meta,
            data: raw.data,
            seq: raw.seq,
        }))
    }

    /// Makes `stored` the current snapshot, durably (see the module's invariant).
    pub(crate) fn write<C: JournalTypeConfig>(
        &self,
        stored: StoredSnapshot<C>,
    ) -> Result<(), JournalError> {
        self.write_raw(&RawSnapshot {
            seq: stored.seq,
            meta: codec::try_encode(&stored.meta)?,
            data: stored.data,
        })
    }

    pub(crate) fn read_raw(&self) -> Result<Option<RawSnapshot>, JournalError> {
        let path = self.path();
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(JournalError::Io { path, source }),
        };
        decode(&bytes)
            .map(Some)
            .map_err(|reason| JournalError::corrupt(format!("{}: {reason}", path.display())))
    }

    pub(crate) fn write_raw(&self, raw: &RawSnapshot) -> Result<(), JournalError> {
        write_durably(&self.dir, SNAPSHOT_FILE, &encode(raw)?)
    }
}

fn encode(raw: &RawSnapshot) -> Result<Vec<u8>, JournalError> {
    let meta_len = u32::try_from(raw.meta.len())
        .map_err(|_| JournalError::corrupt("snapshot meta over 4 GiB"))?;
    let mut bytes = Vec::with_capacity(8 + 8 + 4 + raw.meta.len() + 8 + raw.data.len() + 4);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&raw.seq.to_le_bytes());
    bytes.extend_from_slice(&meta_len.to_le_bytes());
    bytes.extend_from_slice(&raw.meta);
    bytes.extend_from_slice(&(raw.data.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&raw.data);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    Ok(bytes)
}

fn decode(bytes: &[u8]) -> Result<RawSnapshot, String> {
    let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
        return Err(format!("{} bytes, too short for a snapshot", bytes.len()));
    };
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err("checksum mismatch".into());
    }
    let mut rest = body;
    let magic = take(&mut rest, 8, "magic")?;
    if magic != MAGIC {
        return Err(format!("starts with {magic:?}, not a sluice snapshot"));
    }
    let seq = u64::from_le_bytes(take_array(&mut rest, "sequence number")?);
    let meta_len = u32::from_le_bytes(take_array(&mut rest, "meta length")?);
    let meta = take(&mut rest, meta_len as usize, "meta")?.to_vec();
    let data_len = u64::from_le_bytes(take_array(&mut rest, "data length")?);
    let data_len = usize::try_from(data_len).map_err(|_| "data length overflows".to_string())?;
    let data = take(&mut rest, data_len, "data")?.to_vec();
    if !rest.is_empty() {
        return Err(format!("{} bytes after the data", rest.len()));
    }
    Ok(RawSnapshot { seq, meta, data })
}

/// Splits `n` bytes off the front of `rest`, naming `what` if they are not there.
fn take<'a>(rest: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], String> {
    if rest.len() < n {
        return Err(format!(
            "ends inside the {what} ({} bytes left, {n} needed)",
            rest.len()
        ));
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn take_array<const N: usize>(rest: &mut &[u8], what: &str) -> Result<[u8; N], String> {
    take(rest, N, what)?
        .try_into()
        .map_err(|_| format!("the {what} is not {N} bytes"))
}

#[cfg(test)]
#[path = "snapshot_file_tests.rs"]
mod tests;
