//! Every key space of the journal's sled database, in one place.
//!
//! Each key space is a sled `Tree`. Values are codec-encoded ([`crate::codec`]) unless said
//! otherwise. A new key space or key is added here, with its doc line, and nowhere else.

use crate::error::JournalError;

/// Tree `header`: identifies the database as a sluice journal. Key [`HEADER_FORMAT`].
pub const TREE_HEADER: &str = "header";
/// `header` / `format`: the on-disk format version as a raw big-endian `u32`
/// (`FORMAT_VERSION` in `journal.rs`); raw so that it stays readable whatever the codec becomes.
pub const HEADER_FORMAT: &[u8] = b"format";

/// Tree `raft_log`: key = log index as 8-byte big-endian `u64` (lexicographic order = numeric
/// order), value = codec(`openraft::Entry<C>`). Written by append, truncate, purge.
pub const TREE_RAFT_LOG: &str = "raft_log";

/// Tree `raft_meta`: Raft's small durable values, one key each.
pub const TREE_RAFT_META: &str = "raft_meta";
/// `raft_meta` / `vote`: codec(`Vote<NodeId>`), the last vote saved by `save_vote`.
pub const META_VOTE: &[u8] = b"vote";
/// `raft_meta` / `committed`: codec(`Option<LogId<NodeId>>`), the last committed log id
/// (written without a flush, see `LogStore::save_committed`).
pub const META_COMMITTED: &[u8] = b"committed";
/// `raft_meta` / `last_purged`: codec(`LogId<NodeId>`), the greatest purged log id; written
/// before the purged entries are deleted.
pub const META_LAST_PURGED: &[u8] = b"last_purged";

// (Version 4 kept the snapshot in a tree `snapshot`; `format_upgrade.rs` moves it out.)

/// The `raft_log` key of a log index.
pub fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The log index stored under a `raft_log` key.
pub fn log_index(key: &[u8]) -> Result<u64, JournalError> {
    let bytes: [u8; 8] = key.try_into().map_err(|_| {
        JournalError::corrupt(format!("raft_log key of {} bytes, expected 8", key.len()))
    })?;
    Ok(u64::from_be_bytes(bytes))
}

/// Decodes a raw big-endian `u64` value (`snapshot` / `seq`).
pub fn be_u64(what: &str, value: &[u8]) -> Result<u64, JournalError> {
    let bytes: [u8; 8] = value.try_into().map_err(|_| {
        JournalError::corrupt(format!("{what} of {} bytes, expected 8", value.len()))
    })?;
    Ok(u64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys_sort_numerically() {
        let mut keys: Vec<[u8; 8]> = [300u64, 2, 1 << 40, 0, 255, 256]
            .iter()
            .map(|i| log_key(*i))
            .collect();
        keys.sort();
        let back: Vec<u64> = keys.iter().map(|k| log_index(k).unwrap()).collect();
        assert_eq!(back, vec![0, 2, 255, 256, 300, 1 << 40]);
    }

    #[test]
    fn bad_key_length_is_corruption() {
        assert!(log_index(b"short").is_err());
        assert!(be_u64("seq", b"123456789").is_err());
    }
}
