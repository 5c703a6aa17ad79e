//! `sluice-journal`: every byte Sluice keeps on disk.
//!
//! The dispatcher's Raft log and vote live in one sled database per node and its snapshot in a
//! file beside it, behind openraft's storage-v2 traits: [`LogStore`] implements `RaftLogStorage`, and
//! [`StateMachineStore`] implements `RaftStateMachine` over any pure [`ReplicatedState`].
//! Every persisted value (and every Raft RPC payload, via [`codec`]) is a version byte plus
//! bincode. The data dir carries a format version and the identity of its cluster and node,
//! both checked before anything is touched; a journal is only created when the caller asks.
//! The crate knows nothing of the dispatcher's state; it passes `openraft::testing::Suite`.
//!
//! Layout:
//! - `journal.rs`: [`Journal`], opening/creating a data dir, the `FORMAT` file and header check.
//! - `format.rs`: the format version, `FORMAT`'s content, the header, durable file writes.
//! - `journal_identity.rs`: [`JournalIdentity`], the cluster and node a journal belongs to
//!   (the `IDENTITY` file).
//! - `keys.rs`: the key spaces (sled trees) and their keys, one doc line each.
//! - `codec.rs`: [`codec::encode`] / [`codec::decode`], the versioned value codec.
//! - `log_store.rs`: [`LogStore`], log entries, vote, committed, purge and truncate.
//! - `state_machine.rs`: [`StateMachineStore`], [`ReplicatedState`], [`AppliedState`],
//!   snapshots.
//! - `snapshot_file.rs`: the `SNAPSHOT` file, the one current snapshot beside the database.
//! - `format_upgrade.rs`: upgrading a data dir of the previous format version at open.
//! - `type_config.rs`: [`JournalTypeConfig`], the bounds the journal puts on a type config.
//! - `error.rs`: [`JournalError`] and its mapping to openraft's `StorageError`.
//! - tests: `suite_tests.rs` (openraft's conformance suite), `journal_tests.rs` (restart,
//!   format checks, snapshot install), `identity_tests.rs` (creation only when asked, identity
//!   checks), `test_support.rs` (a toy type config and key-value state).

pub mod codec;
mod error;
mod format;
mod format_upgrade;
mod journal;
mod journal_identity;
mod keys;
mod log_store;
mod snapshot_file;
mod state_machine;
mod type_config;

#[cfg(test)]
mod format_upgrade_tests;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod identity_tests;
#[cfg(test)]
mod journal_tests;
#[cfg(test)]
mod suite_tests;
#[cfg(test)]
mod test_support;

pub use error::JournalError;
pub use format::format_file_content;
pub use format::FORMAT_FILE;
pub use format::FORMAT_VERSION;
pub use journal::IfMissing;
pub use journal::Journal;
pub use journal::DB_DIR;
pub use journal_identity::JournalIdentity;
pub use journal_identity::IDENTITY_FILE;
pub use log_store::{LogStore, MAX_APPEND_BYTES};
pub use snapshot_file::SNAPSHOT_FILE;
pub use state_machine::AppliedState;
pub use state_machine::ReplicatedState;
pub use state_machine::StateHandle;
pub use state_machine::StateMachineStore;
pub use type_config::JournalTypeConfig;
