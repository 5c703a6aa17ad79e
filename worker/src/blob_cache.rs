//! The blobs a worker's definitions name (their large tensors, see
//! `sluice_element::blob_tensors`), fetched from the dispatcher once and cached on disk.
//!
//! A definition arrives with each large tensor's data replaced by a digest; before the
//! pipeline is built, [`resolve`] puts the bytes back. Each blob is fetched once per machine
//! (`GetBlob`, resumed where it broke off) and kept in a directory under the system's temporary
//! directory, named by its digest, written under a temporary name and renamed into place; a
//! later task of any dataset that names the same blob reads the file. Fetches in one process
//! go one at a time, so two tasks starting together fetch a blob once.
//!
//! Every read, cached or fetched, is checked against the digest (a cached file that does not
//! match is fetched again), so a file left half-written or changed by anyone is never used. A
//! file this process already checked and that is unchanged since (the same inode, length and
//! change time; see `Checked`) is read without hashing it again, so the epochs of a dataset
//! with a large array do not each hash it: a file read every epoch is hashed about once a
//! minute, after a read renews its modification time.
//!
//! The cache holds at most [`MAX_CACHE_BYTES`]: after each write the least recently used blobs
//! (by their files' modification time, which a read renews once it is a minute old) are
//! deleted until the rest fit.
//!
//! A cached blob is mapped, not read: its bytes are the kernel's page cache, shared by every
//! task and worker process on the machine that names the blob, and a task's start neither
//! copies them nor faults in fresh memory for them (a 48 MiB array took 20 to 40 ms to read).
//! The cache's files are never written in place, so a mapping stays what it was checked to be:
//! a blob is written under a temporary name and renamed into place, and eviction unlinks, both
//! of which leave existing mappings intact. (Truncating a mapped file would kill the worker
//! with `SIGBUS`; nothing in Sluice does, and only the worker's user may write the files.)
//!
//! Memory: a resolved tensor is held whole in the definition, and the pipeline's source shares
//! those bytes while it runs.

use bytes::Bytes;
use sluice_element::blob_tensors::{self, BlobDigest};
use sluice_element::{pb, DatasetError};
use sluice_rpc::DispatcherClient;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tokio::sync::Mutex;

/// The most bytes the cache keeps.
pub const MAX_CACHE_BYTES: u64 = 4 << 30;

/// One fetch at a time in this process.
static FETCHING: Mutex<()> = Mutex::const_new(());

/// Distinguishes the temporary files of this process.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// The cache directory.
fn cache_dir() -> PathBuf {
    std::env::temp_dir().join("sluice-blob-cache")
}

/// Fills the tensors of `def` whose data is in blobs, from the cache or the dispatcher.
pub async fn resolve(client: &DispatcherClient, def: &mut pb::DatasetDef) -> Result<(), String> {
    let named = blob_tensors::digests(def).map_err(|e| e.to_string())?;
    if named.is_empty() {
        return Ok(());
    }
    let mut blobs = BTreeMap::new();
    for (digest, len) in named {
        blobs.insert(digest, blob(client, &digest, len).await?);
    }
    // Tensors naming the same blob share its bytes.
    blob_tensors::fill(def, &mut |d, _| {
        blobs
            .get(d)
            .cloned()
            .ok_or_else(|| DatasetError::invalid("a blob was not fetched"))
    })
    .map_err(|e| e.to_string())
}

/// Blob `digest` of `len` bytes: the cached file if it holds those bytes, else fetched (and
/// cached).
async fn blob(client: &DispatcherClient, digest: &BlobDigest, len: u64) -> Result<Bytes, String> {
    let path = cache_dir().join(blob_tensors::hex(digest));
    let _one_at_a_time = FETCHING.lock().await;
    let (cached, d) = (path.clone(), *digest);
    let found =
        tokio::task::spawn_blocking(move || read_cached(&cached, &d, len, SystemTime::now()))
            .await
            .map_err(|e| e.to_string())?;
    if let Some(data) = found {
        return Ok(data);
    }
    let data = client
        .get_blob(digest, len)
        .await
        .map_err(|e| format!("fetching blob {}: {e}", blob_tensors::hex(digest)))?;
    let written = data.clone();
    // The cache is an optimisation: a directory that cannot be written only costs a fetch.
    let _ = tokio::task::spawn_blocking(move || {
        let dir = cache_dir();
        std::fs::create_dir_all(&dir)?;
        let temp = dir.join(format!(
            ".{}.{}.{}.tmp",
            path.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&temp, &written)?;
        std::fs::rename(&temp, &path).inspect_err(|_| {
            let _ = std::fs::remove_file(&temp);
        })?;
        evict(&dir, MAX_CACHE_BYTES);
        Ok::<_, std::io::Error>(())
    })
    .await;
    Ok(data)
}

/// A cached file's identity when this process checked its bytes against their digest: its
/// device, inode, length and change time. The kernel sets the change time on every write (and
/// every change of the file's times or permissions), and no call can set it back, so a file
/// with the same identity holds the bytes that were checked; but it sets it from a clock that
/// may only move once a tick (a few milliseconds), so an identity is recorded only once its
/// change time is `SETTLED` old: a write after that cannot keep it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Checked {
    dev: u64,
    ino: u64,
    len: u64,
    ctime: (i64, i64),
}

impl Checked {
    fn of(meta: &std::fs::Metadata) -> Checked {
        use std::os::unix::fs::MetadataExt;
        Checked {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether the change time is at least `SETTLED` before `now`.
    fn settled(&self, now: SystemTime) -> bool {
        let (secs, nanos) = self.ctime;
        let changed = u64::try_from(secs)
            .ok()
            .zip(u32::try_from(nanos).ok())
            .and_then(|(s, n)| SystemTime::UNIX_EPOCH.checked_add(Duration::new(s, n)));
        changed.is_some_and(|changed| now.duration_since(changed).is_ok_and(|age| age >= SETTLED))
    }
}

/// How old a cached file's change time must be for its identity to be recorded (see `Checked`).
const SETTLED: Duration = Duration::from_secs(1);

/// A cached file's modification time is renewed on a read (for `evict`) only once it is this
/// old: renewing it changes the change time, and a file read every epoch would never settle.
const RENEW_AFTER: Duration = Duration::from_secs(60);

/// The cached files this process checked, by digest: a later task naming the same blob (each
/// epoch of a dataset is a new task) reads the file again but hashes it only if it changed.
static CHECKED: std::sync::Mutex<BTreeMap<BlobDigest, Checked>> =
    std::sync::Mutex::new(BTreeMap::new());

/// The cached file of blob `digest`, if it holds its `len` bytes, at `now`, mapped (see the
/// module's comment). The bytes are hashed unless this process checked the same file before
/// (see `Checked`).
fn read_cached(
    path: &std::path::Path,
    digest: &BlobDigest,
    len: u64,
    now: SystemTime,
) -> Option<Bytes> {
    let file = std::fs::File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    let before = Checked::of(&meta);
    if before.len != len {
        return None;
    }
    let data = sluice_shm::map_file(&file, usize::try_from(len).ok()?).ok()?;
    // Unchanged since it was checked.
    let known = CHECKED.lock().ok()?.get(digest) == Some(&before);
    if data.len() as u64 != len || !(known || hash_matches(&data, digest)) {
        return None;
    }
    let renew_at = meta
        .modified()
        .ok()
        .and_then(|used| used.checked_add(RENEW_AFTER));
    if renew_at.is_none_or(|at| at <= now) {
        // Recently used: the last to be evicted.
        if let Ok(touch) = std::fs::File::options().append(true).open(path) {
            let _ = touch.set_modified(now);
        }
    } else if before.settled(now) {
        if let Ok(mut checked) = CHECKED.lock() {
            checked.insert(*digest, before);
        }
    }
    Some(data)
}

/// Whether `data` hashes to `digest`.
fn hash_matches(data: &[u8], digest: &BlobDigest) -> bool {
    #[cfg(test)]
    tests::HASHED.fetch_add(1, Ordering::Relaxed);
    blob_tensors::digest(data) == *digest
}

/// Deletes the least recently used blob files of `dir` until the rest hold at most `max` bytes.
fn evict(dir: &std::path::Path, max: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = files.iter().map(|(_, len, _)| len).sum();
    files.sort();
    for (_, len, path) in files {
        if total <= max {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Blobs hashed by `hash_matches` in this process (nextest runs each test in its own).
    pub(super) static HASHED: AtomicUsize = AtomicUsize::new(0);

    /// Waits until the file system's change times have moved past `path`'s (they may move once
    /// a tick), so a write now gives it a change time of its own.
    fn past_change_time_of(path: &std::path::Path) {
        let before = Checked::of(&std::fs::metadata(path).unwrap()).ctime;
        let probe = path.with_extension("probe");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            std::fs::write(&probe, b"probe").unwrap();
            if Checked::of(&std::fs::metadata(&probe).unwrap()).ctime > before {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the clock did not move"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_cached_file_is_hashed_until_it_settles_and_again_once_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![7u8; 100_000];
        let digest = blob_tensors::digest(&data);
        let path = dir.path().join(blob_tensors::hex(&digest));
        std::fs::write(&path, &data).unwrap();
        let hashed = || HASHED.load(Ordering::Relaxed);
        let read = |now: SystemTime| read_cached(&path, &digest, 100_000, now);
        let now = SystemTime::now();
        let later = |secs: u64| now + Duration::from_secs(secs);

        // Just written: checked, not recorded (a write in the same tick could keep its identity).
        assert_eq!(read(now).as_deref(), Some(&data[..]));
        assert_eq!(hashed(), 1);
        // Two seconds on: checked again, and recorded.
        assert_eq!(read(later(2)).as_deref(), Some(&data[..]));
        assert_eq!(hashed(), 2);
        // From then on, unchanged: read without hashing.
        assert_eq!(read(later(3)).as_deref(), Some(&data[..]));
        assert_eq!(read(later(4)).as_deref(), Some(&data[..]));
        assert_eq!(hashed(), 2);
        // The wrong length is refused without reading it.
        assert_eq!(read_cached(&path, &digest, 99_999, later(4)), None);
        assert_eq!(hashed(), 2);

        // Changed in place, same length: hashed again, and refused.
        past_change_time_of(&path);
        let mut changed = data.clone();
        changed[50_000] = 8;
        std::fs::write(&path, &changed).unwrap();
        assert_eq!(read(later(5)), None);
        assert_eq!(hashed(), 3);
        // Put back: hashed again (its change time moved on), and used.
        std::fs::write(&path, &data).unwrap();
        assert_eq!(read(later(6)).as_deref(), Some(&data[..]));
        assert_eq!(hashed(), 4);
        // Replaced by another file with the same bytes (a new inode): hashed again.
        let other = dir.path().join("other");
        std::fs::write(&other, &data).unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert_eq!(read(later(7)).as_deref(), Some(&data[..]));
        assert_eq!(hashed(), 5);
        // A minute on, the read renews the file's modification time for eviction (and so its
        // change time: checked again next time).
        assert_eq!(read(later(120)).as_deref(), Some(&data[..]));
        let renewed = std::fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(renewed, later(120));
        // A missing file is no blob.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read(later(121)), None);
    }

    #[test]
    fn eviction_deletes_the_least_recently_used_until_the_rest_fit() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        for (name, age) in [("old", 30), ("middle", 20), ("new", 10)] {
            let path = dir.path().join(name);
            std::fs::write(&path, vec![0u8; 100]).unwrap();
            let file = std::fs::File::options().append(true).open(&path).unwrap();
            file.set_modified(now - Duration::from_secs(age)).unwrap();
        }
        evict(dir.path(), 250);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["middle", "new"]);
        evict(dir.path(), 1000);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
