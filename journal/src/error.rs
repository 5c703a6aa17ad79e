//! `JournalError`: the one error type of the journal, and its mapping onto openraft's
//! `StorageError`.
//!
//! Every failure names what it was touching (a path, a key space, a log index) so an operator
//! can find the file. openraft treats any `StorageError` as fatal for the node, which is the
//! right reaction to a disk that lies; `is_retryable()` exists for the callers that open the
//! journal (e.g. a restarting dispatcher whose predecessor still holds the sled lock).

use std::io;
use std::path::PathBuf;

use openraft::AnyError;
use openraft::ErrorSubject;
use openraft::ErrorVerb;
use openraft::NodeId;
use openraft::StorageError;
use openraft::StorageIOError;

use crate::journal_identity::JournalIdentity;

/// Errors of the journal crate.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A file-system operation outside sled failed (the data dir, the `FORMAT` and `IDENTITY`
    /// files).
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// sled reported an error; `context` says what the journal was doing.
    #[error("sled error while {context}: {source}")]
    Sled {
        context: String,
        #[source]
        source: sled::Error,
    },

    /// The data dir is not a journal this build can open. `path` names the offending file.
    #[error("data dir {dir} is not a sluice journal: {path} {reason}")]
    Format {
        dir: PathBuf,
        path: PathBuf,
        reason: String,
    },

    /// The data dir holds no journal, and the caller did not ask for one to be created.
    /// `reason` says what is there instead (nothing, or a journal that never had any Raft
    /// state nor an identity).
    #[error("data dir {dir} holds no journal: it {reason}")]
    NoJournal { dir: PathBuf, reason: String },

    /// The journal belongs to another cluster or another node; `path` is its identity file.
    #[error("data dir {dir} belongs to {found} (recorded in {path}), not to {expected}")]
    IdentityMismatch {
        dir: PathBuf,
        path: PathBuf,
        found: JournalIdentity,
        expected: JournalIdentity,
    },

    /// An identity the caller asked for is not valid (e.g. a cluster id with a space).
    #[error("invalid journal identity: {reason}")]
    InvalidIdentity { reason: String },

    /// A value could not be encoded or decoded by the versioned codec.
    #[error("codec error: {reason}")]
    Codec { reason: String },

    /// Bytes on disk decode but violate an invariant of the journal (a key that is not a log
    /// index, an entry stored under the wrong index, a snapshot without data).
    #[error("corrupt journal: {what}")]
    Corrupt { what: String },

    /// The in-memory state lock was poisoned: a `ReplicatedState::apply` panicked while
    /// mutating it, so the state can no longer be trusted.
    #[error("replicated state lock poisoned: a previous apply panicked")]
    StatePoisoned,

    /// A blocking task that ran sled work off the async executor panicked or was cancelled.
    #[error("blocking journal task failed: {reason}")]
    Task { reason: String },
}

impl JournalError {
    /// Whether retrying the same operation later may succeed without operator action.
    ///
    /// Exhaustive on purpose: a new variant must decide.
    pub fn is_retryable(&self) -> bool {
        match self {
            JournalError::Io { source, .. } => io_kind_is_transient(source.kind()),
            JournalError::Sled { source, .. } => match source {
                sled::Error::Io(e) => io_kind_is_transient(e.kind()) || sled_lock_contended(e),
                sled::Error::CollectionNotFound(_)
                | sled::Error::Unsupported(_)
                | sled::Error::ReportableBug(_)
                | sled::Error::Corruption { .. } => false,
            },
            JournalError::Format { .. } => false,
            JournalError::NoJournal { .. } => false,
            JournalError::IdentityMismatch { .. } => false,
            JournalError::InvalidIdentity { .. } => false,
            JournalError::Codec { .. } => false,
            JournalError::Corrupt { .. } => false,
            JournalError::StatePoisoned => false,
            JournalError::Task { .. } => false,
        }
    }

    pub(crate) fn sled(context: impl Into<String>, source: sled::Error) -> Self {
        JournalError::Sled {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn corrupt(what: impl Into<String>) -> Self {
        JournalError::Corrupt { what: what.into() }
    }

    pub(crate) fn task(err: tokio::task::JoinError) -> Self {
        JournalError::Task {
            reason: err.to_string(),
        }
    }

    /// Wraps the error for openraft, recording what was being read or written.
    pub(crate) fn into_storage<NID: NodeId>(
        self,
        subject: ErrorSubject<NID>,
        verb: ErrorVerb,
    ) -> StorageError<NID> {
        StorageIOError::new(subject, verb, AnyError::new(&self)).into()
    }

    /// The error as an `io::Error`, for openraft's `LogFlushed` callback.
    pub(crate) fn to_io(&self) -> io::Error {
        io::Error::other(self.to_string())
    }
}

fn io_kind_is_transient(kind: io::ErrorKind) -> bool {
    matches!(
        kind,
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Whether sled failed to take its exclusive lock on the database, e.g. because a predecessor
/// process (or another `Journal` in this one) still has it open. sled 0.34.7 reports this as
/// an `ErrorKind::Other` error whose message starts with "could not acquire lock"
/// (`config.rs`), so the message is the only signal.
pub(crate) fn sled_lock_contended(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Other && e.to_string().starts_with("could not acquire lock")
}
