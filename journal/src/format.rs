//! The data dir's format: its version, which the `FORMAT` file and the database's header both
//! record, and the helpers that creating, opening and upgrading a journal share.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::error::JournalError;
use crate::keys;

/// On-disk format version, written at creation and required at open. It covers the encoding of
/// what the journal stores for its state machine too (log entry payloads, snapshots): a build
/// that changes those bumps it, so an older data dir is refused by name instead of misread.
/// Version 4: a member carries two addresses, its client API and its Raft peer listener.
/// Version 5: the snapshot is the `SNAPSHOT` file, no longer a sled tree.
pub const FORMAT_VERSION: u32 = 5;
/// Name of the format file inside the data dir.
pub const FORMAT_FILE: &str = "FORMAT";

/// The exact content of a valid `FORMAT` file.
pub fn format_file_content() -> String {
    format_file_content_of(FORMAT_VERSION)
}

pub(crate) fn format_file_content_of(version: u32) -> String {
    format!("sluice-journal {version}\n")
}

/// Records this build's format version in the database's header (not flushed).
pub(crate) fn write_format_header(db: &sled::Db) -> Result<(), JournalError> {
    db.open_tree(keys::TREE_HEADER)
        .map_err(|e| JournalError::sled("opening the header tree", e))?
        .insert(keys::HEADER_FORMAT, &FORMAT_VERSION.to_be_bytes())
        .map_err(|e| JournalError::sled("writing the format header", e))?;
    Ok(())
}

/// Whether tree `name` is missing or empty; never creates it.
pub(crate) fn tree_is_empty(db: &sled::Db, name: &str) -> Result<bool, JournalError> {
    if !db
        .tree_names()
        .iter()
        .any(|n| n.as_ref() == name.as_bytes())
    {
        return Ok(true);
    }
    let tree = db
        .open_tree(name)
        .map_err(|e| JournalError::sled(format!("opening tree {name}"), e))?;
    Ok(tree.is_empty())
}

/// Writes `name` in `dir` so that it is either absent or complete and durable: a temp file,
/// synced, renamed, and the dir synced.
pub(crate) fn write_durably(dir: &Path, name: &str, content: &[u8]) -> Result<(), JournalError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| JournalError::Io { path, source }
    };
    let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(content).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    // Make the rename itself durable.
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    Ok(())
}
