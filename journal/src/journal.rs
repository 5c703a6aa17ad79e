//! `Journal`: opening (or creating) a data dir and handing out the Raft stores built on it.
//!
//! A data dir holds:
//! - `FORMAT`: one line, `sluice-journal <FORMAT_VERSION>`, written last at creation;
//! - `IDENTITY`: the cluster and node the journal belongs to (see `journal_identity.rs`);
//! - `db/`: the sled database, whose `header` tree repeats the version (see `keys.rs`);
//! - `SNAPSHOT`: the current snapshot, once there is one (see `snapshot_file.rs`).
//!
//! A data dir of the previous format version is upgraded in place at open
//! (`format_upgrade.rs`); older ones are refused.
//!
//! Invariants: a journal is created only in a missing or empty dir, and only when the caller
//! asks for it ([`IfMissing::Create`]): a replica that lost its data dir must not come back
//! with an empty log and no vote by accident. A dir that is not a journal of this format
//! version, or whose `IDENTITY` names another cluster or node, is refused *before* anything in
//! it is touched, with an error naming the offending file. A crash during initialisation
//! leaves a dir without `FORMAT`, which is then refused; it held no data and can be removed by
//! hand.

use std::fs;
use std::io;
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

use crate::error::sled_lock_contended;
use crate::error::JournalError;
use crate::format::format_file_content;
use crate::format::format_file_content_of;
use crate::format::tree_is_empty;
use crate::format::write_durably;
use crate::format::write_format_header;
use crate::format::FORMAT_FILE;
use crate::format::FORMAT_VERSION;
use crate::format_upgrade;
use crate::journal_identity::JournalIdentity;
use crate::journal_identity::IDENTITY_FILE;
use crate::keys;
use crate::log_store::LogStore;
use crate::snapshot_file::SnapshotFile;
use crate::state_machine::ReplicatedState;
use crate::state_machine::StateMachineStore;
use crate::type_config::JournalTypeConfig;

/// Name of the sled database directory inside the data dir.
pub const DB_DIR: &str = "db";
/// A file sled 0.34 always writes into its directory; its absence means `db/` is not a sled db.
const SLED_CONF_FILE: &str = "conf";

/// What [`Journal::open`] does with a data dir that holds no journal (missing or empty).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfMissing {
    /// Refuse with [`JournalError::NoJournal`]: the normal (re)start of a replica.
    Refuse,
    /// Create a new journal recording the identity: the first start of a replica.
    Create,
}

/// An open journal: one sled database and its key spaces. Cheap to clone (sled handles are
/// reference counted); the database closes when the last clone and every store are dropped.
#[derive(Clone)]
pub struct Journal {
    dir: PathBuf,
    identity: JournalIdentity,
    db: sled::Db,
    raft_log: sled::Tree,
    raft_meta: sled::Tree,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Opens the journal of `identity` in `dir`; creates it if `dir` is missing or empty and
    /// `if_missing` is [`IfMissing::Create`], else refuses with [`JournalError::NoJournal`].
    ///
    /// Refuses (with [`JournalError::Format`], naming the file) a path that is not a directory,
    /// a non-empty dir whose `FORMAT` is missing, unreadable or different, a malformed
    /// `IDENTITY`, and a dir whose `db/` is missing, cannot be opened by sled, or lacks the
    /// matching header key; refuses (with [`JournalError::IdentityMismatch`]) a journal whose
    /// `IDENTITY` is not `identity`, whatever `if_missing` says.
    ///
    /// A journal without `IDENTITY` was created before identities were recorded: if it holds
    /// Raft state (log, vote or snapshot) it is this replica's, and adopts `identity` (the
    /// file is written and a warning logged); if it holds none, it is treated as an empty dir.
    ///
    /// Blocking: it does file I/O and may wait up to 2 s for sled's lock (see `LOCK_WAIT`);
    /// call it at startup or from `spawn_blocking`. A lock still held after that is a
    /// retryable [`JournalError::Sled`].
    pub fn open(
        dir: &Path,
        identity: &JournalIdentity,
        if_missing: IfMissing,
    ) -> Result<Journal, JournalError> {
        match fs::metadata(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Self::create(dir, identity, if_missing, "does not exist")
            }
            Err(e) => {
                return Err(JournalError::Io {
                    path: dir.to_path_buf(),
                    source: e,
                })
            }
            Ok(m) if !m.is_dir() => return Err(format_err(dir, dir, "is not a directory")),
            Ok(_) => {}
        }
        let mut listing = fs::read_dir(dir).map_err(|e| JournalError::Io {
            path: dir.to_path_buf(),
            source: e,
        })?;
        if listing.next().is_none() {
            return Self::create(dir, identity, if_missing, "is empty");
        }

        let version = check_format_file(dir)?;
        let recorded = read_identity(dir)?;
        if let Some(found) = recorded.as_ref().filter(|found| *found != identity) {
            return Err(JournalError::IdentityMismatch {
                dir: dir.to_path_buf(),
                path: dir.join(IDENTITY_FILE),
                found: found.clone(),
                expected: identity.clone(),
            });
        }

        let db_path = dir.join(DB_DIR);
        // Without this check sled would happily create a fresh database in a missing `db/`.
        if !db_path.join(SLED_CONF_FILE).is_file() {
            return Err(format_err(
                dir,
                &db_path,
                "is missing or is not a sled database",
            ));
        }
        let db = open_sled(dir, &db_path)?;
        check_header(dir, &db_path, &db, version)?;
        format_upgrade::finish(dir, &db, version)?;
        if recorded.is_none() {
            adopt_identity(dir, &db, identity, if_missing)?;
        }
        tracing::info!(dir = %dir.display(), %identity, "opened journal");
        Self::from_db(dir, db, identity)
    }

    /// Initialises a missing or empty dir, if `if_missing` allows it (`state` says which it
    /// is): sled db with its header (flushed), then `IDENTITY`, then `FORMAT` (each written to
    /// a temp file, synced, renamed, dir synced), so `FORMAT` exists only once everything
    /// behind it is durable.
    fn create(
        dir: &Path,
        identity: &JournalIdentity,
        if_missing: IfMissing,
        state: &str,
    ) -> Result<Journal, JournalError> {
        if if_missing == IfMissing::Refuse {
            return Err(JournalError::NoJournal {
                dir: dir.to_path_buf(),
                reason: state.to_string(),
            });
        }
        fs::create_dir_all(dir).map_err(|e| JournalError::Io {
            path: dir.to_path_buf(),
            source: e,
        })?;
        let db_path = dir.join(DB_DIR);
        let db = sled_config(&db_path)
            .open()
            .map_err(|e| JournalError::sled(format!("creating {}", db_path.display()), e))?;
        write_format_header(&db)?;
        db.flush().map_err(|e| {
            JournalError::sled(format!("flushing new journal {}", db_path.display()), e)
        })?;

        write_durably(dir, IDENTITY_FILE, identity.to_file_content().as_bytes())?;
        write_durably(dir, FORMAT_FILE, format_file_content().as_bytes())?;
        tracing::info!(
            dir = %dir.display(),
            version = FORMAT_VERSION,
            %identity,
            "created journal"
        );
        Self::from_db(dir, db, identity)
    }

    fn from_db(
        dir: &Path,
        db: sled::Db,
        identity: &JournalIdentity,
    ) -> Result<Journal, JournalError> {
        let tree = |name: &str| {
            db.open_tree(name)
                .map_err(|e| JournalError::sled(format!("opening tree {name}"), e))
        };
        Ok(Journal {
            dir: dir.to_path_buf(),
            identity: identity.clone(),
            raft_log: tree(keys::TREE_RAFT_LOG)?,
            raft_meta: tree(keys::TREE_RAFT_META)?,
            db,
        })
    }

    /// The data dir this journal lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster and node this journal belongs to.
    pub fn identity(&self) -> &JournalIdentity {
        &self.identity
    }

    /// The Raft log store (log entries, vote, committed, last purged).
    pub fn log_store<C: JournalTypeConfig>(&self) -> LogStore<C> {
        LogStore::new(
            self.db.clone(),
            self.raft_log.clone(),
            self.raft_meta.clone(),
        )
    }

    /// The Raft state machine, loaded from the persisted snapshot if there is one.
    ///
    /// Call once per open journal: each call builds its own in-memory state. openraft then
    /// re-applies committed log entries after the snapshot (`StorageHelper::get_initial_state`
    /// in `Raft::new`).
    pub fn state_machine<C, S>(&self) -> Result<StateMachineStore<C, S>, JournalError>
    where
        C: JournalTypeConfig,
        S: ReplicatedState<C>,
    {
        StateMachineStore::open(SnapshotFile::new(&self.dir))
    }
}

fn format_err(dir: &Path, path: &Path, reason: impl Into<String>) -> JournalError {
    JournalError::Format {
        dir: dir.to_path_buf(),
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Checks `FORMAT` and returns its version: this build's, or the one it upgrades from.
fn check_format_file(dir: &Path) -> Result<u32, JournalError> {
    let path = dir.join(FORMAT_FILE);
    let content = match fs::read(&path) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(format_err(dir, &path, "is missing"))
        }
        Err(e) => return Err(format_err(dir, &path, format!("is unreadable: {e}"))),
    };
    if content == format_file_content_of(format_upgrade::UPGRADES_FROM).as_bytes() {
        return Ok(format_upgrade::UPGRADES_FROM);
    }
    let expected = format_file_content();
    if content != expected.as_bytes() {
        let shown: String = String::from_utf8_lossy(&content).chars().take(64).collect();
        return Err(format_err(
            dir,
            &path,
            format!("has content {shown:?}, expected {expected:?}"),
        ));
    }
    Ok(FORMAT_VERSION)
}

/// The identity recorded in `dir`, `None` if the journal predates identity files.
fn read_identity(dir: &Path) -> Result<Option<JournalIdentity>, JournalError> {
    let path = dir.join(IDENTITY_FILE);
    let content = match fs::read(&path) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format_err(dir, &path, format!("is unreadable: {e}"))),
    };
    JournalIdentity::from_file_content(&content)
        .map(Some)
        .map_err(|reason| format_err(dir, &path, reason))
}

/// Records `identity` in a journal created before identities existed. One with Raft state is
/// this replica's journal from an earlier build and keeps serving; one without any is no
/// different from an empty dir, so it needs the caller's consent to become a journal.
fn adopt_identity(
    dir: &Path,
    db: &sled::Db,
    identity: &JournalIdentity,
    if_missing: IfMissing,
) -> Result<(), JournalError> {
    let mut has_state = SnapshotFile::new(dir).exists()?;
    for name in [keys::TREE_RAFT_LOG, keys::TREE_RAFT_META] {
        has_state |= !tree_is_empty(db, name)?;
    }
    if !has_state && if_missing == IfMissing::Refuse {
        return Err(JournalError::NoJournal {
            dir: dir.to_path_buf(),
            reason: format!("holds a journal without {IDENTITY_FILE} and without Raft state"),
        });
    }
    write_durably(dir, IDENTITY_FILE, identity.to_file_content().as_bytes())?;
    tracing::warn!(
        dir = %dir.display(),
        %identity,
        has_state,
        "journal had no identity; recorded this replica's"
    );
    Ok(())
}

/// How long `open` waits for sled's file lock to be released.
///
/// sled releases the lock when its last internal handle goes, and its background I/O threads
/// hold handles for a few milliseconds after the last `Db` is dropped. An in-process restart
/// (tests, `TestCluster`) or a predecessor process that is still exiting would otherwise see a
/// spurious "could not acquire lock".
const LOCK_WAIT: Duration = Duration::from_secs(2);
const LOCK_RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// Sled's page cache; its default (1 GiB) let a replica's memory grow with every entry it
/// wrote until the cache was full. The journal's reads from sled are the recent log entries
/// replication sends (the snapshot is a file of its own), read right after they were written.
/// Over 100,000 short jobs, 64 MiB let the leader grow to 74 MiB, still climbing; 16 MiB kept
/// it level at about 50 MiB, 9 MiB of it log entries in the cache (a heap profile); 4 MiB
/// took it 5 to 13 MiB lower, with the same heartbeat latency under 1,000 workers
/// and 10,000 clients.
const SLED_CACHE_BYTES: u64 = 4 * 1024 * 1024;

fn sled_config(db_path: &Path) -> sled::Config {
    sled::Config::new()
        .path(db_path)
        .cache_capacity(SLED_CACHE_BYTES)
}

fn open_sled(dir: &Path, db_path: &Path) -> Result<sled::Db, JournalError> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match sled_config(db_path).open() {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(ref io))
                if sled_lock_contended(io) && Instant::now() < deadline =>
            {
                std::thread::sleep(LOCK_RETRY_INTERVAL);
            }
            Err(e) => return Err(open_error(dir, db_path, e)),
        }
    }
}

fn open_error(dir: &Path, db_path: &Path, e: sled::Error) -> JournalError {
    match e {
        // A held lock (or a transient I/O error) is not a format problem: keep it a sled error
        // so that `is_retryable()` says so.
        sled::Error::Io(ref io)
            if sled_lock_contended(io)
                || matches!(
                    io.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::TimedOut
                ) =>
        {
            JournalError::sled(format!("opening {}", db_path.display()), e)
        }
        other => format_err(dir, db_path, format!("cannot be opened by sled: {other}")),
    }
}

/// Checks the header's version against `FORMAT`'s: the same, or this build's while an upgrade
/// from `FORMAT`'s is unfinished (`format_upgrade.rs` updates the header first).
fn check_header(
    dir: &Path,
    db_path: &Path,
    db: &sled::Db,
    format: u32,
) -> Result<(), JournalError> {
    // `open_tree` would create a missing tree; look it up among the existing ones instead.
    let has_header = db
        .tree_names()
        .iter()
        .any(|n| n.as_ref() == keys::TREE_HEADER.as_bytes());
    if !has_header {
        return Err(format_err(dir, db_path, "has no format header"));
    }
    let header = db
        .open_tree(keys::TREE_HEADER)
        .map_err(|e| JournalError::sled("opening the header tree", e))?;
    let value = header
        .get(keys::HEADER_FORMAT)
        .map_err(|e| JournalError::sled("reading the format header", e))?;
    let Some(value) = value else {
        return Err(format_err(dir, db_path, "has no format header"));
    };
    let version = <[u8; 4]>::try_from(value.as_ref()).map(u32::from_be_bytes);
    match version {
        Ok(v) if v == format || v == FORMAT_VERSION => Ok(()),
        Ok(v) => Err(format_err(
            dir,
            db_path,
            format!("has format version {v}, this build reads {FORMAT_VERSION}"),
        )),
        Err(_) => Err(format_err(dir, db_path, "has a malformed format header")),
    }
}
