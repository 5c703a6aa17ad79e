//! Upgrading a data dir of the previous format version in place, at open: a rolling upgrade
//! restarts each replica on its own journal, so the new build must read the old one.
//!
//! From version 4 to 5 the snapshot moves out of sled's `snapshot` tree into the `SNAPSHOT`
//! file. The steps, each durable before the next:
//!
//! 1. the tree's snapshot (if any) is written to `SNAPSHOT`;
//! 2. the sled header says 5;
//! 3. `FORMAT` says 5;
//! 4. the tree is dropped.
//!
//! A crash anywhere leaves a dir this repeats or finishes: while `FORMAT` says 4, the tree is
//! intact and step 1 rewrites the same file (the header may already say 5, which the header
//! check allows); once `FORMAT` says 5 only step 4 may be left, and every open does it. An
//! older build never misreads an upgraded dir: it refuses version 5 by name.

use std::path::Path;

use crate::error::JournalError;
use crate::format::format_file_content_of;
use crate::format::tree_is_empty;
use crate::format::write_durably;
use crate::format::write_format_header;
use crate::format::FORMAT_FILE;
use crate::format::FORMAT_VERSION;
use crate::keys;
use crate::snapshot_file::RawSnapshot;
use crate::snapshot_file::SnapshotFile;

/// The one older version this build upgrades.
pub(crate) const UPGRADES_FROM: u32 = 4;

/// Tree `snapshot` of version 4: keys `meta` (codec(`SnapshotMeta`)), `data` (the bytes
/// shipped to followers) and `seq` (raw big-endian `u64`, the last snapshot sequence number).
const V4_TREE_SNAPSHOT: &str = "snapshot";
const V4_SNAPSHOT_META: &[u8] = b"meta";
const V4_SNAPSHOT_DATA: &[u8] = b"data";
const V4_SNAPSHOT_SEQ: &[u8] = b"seq";

/// Brings a checked journal of `version` (this build's or [`UPGRADES_FROM`]) to this build's
/// format, or finishes an upgrade a crash interrupted.
pub(crate) fn finish(dir: &Path, db: &sled::Db, version: u32) -> Result<(), JournalError> {
    if version == UPGRADES_FROM {
        move_snapshot_to_file(dir, db)?;
        write_format_header(db)?;
        db.flush()
            .map_err(|e| JournalError::sled("flushing the format header", e))?;
        write_durably(
            dir,
            FORMAT_FILE,
            format_file_content_of(FORMAT_VERSION).as_bytes(),
        )?;
        tracing::warn!(
            dir = %dir.display(),
            from = UPGRADES_FROM,
            to = FORMAT_VERSION,
            "upgraded the journal's format"
        );
    }
    let has_old_tree = db
        .tree_names()
        .iter()
        .any(|n| n.as_ref() == V4_TREE_SNAPSHOT.as_bytes());
    if has_old_tree {
        db.drop_tree(V4_TREE_SNAPSHOT)
            .map_err(|e| JournalError::sled("dropping the version 4 snapshot tree", e))?;
        db.flush()
            .map_err(|e| JournalError::sled("flushing the dropped snapshot tree", e))?;
    }
    Ok(())
}

/// Step 1: the version 4 snapshot, if any, into `SNAPSHOT`, its bytes unchanged (the file
/// holds the meta in the same codec encoding the tree did).
fn move_snapshot_to_file(dir: &Path, db: &sled::Db) -> Result<(), JournalError> {
    if tree_is_empty(db, V4_TREE_SNAPSHOT)? {
        return Ok(());
    }
    let tree = db
        .open_tree(V4_TREE_SNAPSHOT)
        .map_err(|e| JournalError::sled("opening the version 4 snapshot tree", e))?;
    let get = |key: &[u8], what: &str| {
        tree.get(key)
            .map_err(|e| JournalError::sled(format!("reading snapshot/{what}"), e))
    };
    let Some(meta) = get(V4_SNAPSHOT_META, "meta")? else {
        return Ok(());
    };
    let data = get(V4_SNAPSHOT_DATA, "data")?
        .ok_or_else(|| JournalError::corrupt("the version 4 snapshot has meta but no data"))?;
    let seq = match get(V4_SNAPSHOT_SEQ, "seq")? {
        Some(v) => keys::be_u64("snapshot/seq", &v)?,
        None => 0,
    };
    SnapshotFile::new(dir).write_raw(&RawSnapshot {
        seq,
        meta: meta.to_vec(),
        data: data.to_vec(),
    })
}
