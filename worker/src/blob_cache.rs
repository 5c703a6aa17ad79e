//! The blobs a worker's definitions name (their large tensors, see
//! `sluice_element::blob_tensors`), fetched from the dispatcher once and cached on disk.
//!
//! A definition arrives with each large tensor's data replaced by a digest; before the
//! pipeline is built, [`resolve`] puts the bytes back. Each blob is fetched once per machine
//! (`GetBlob`, resumed where it broke off) and kept in a directory under the system's temporary
//! directory, named by its digest, written under a temporary name and renamed into place; a
//! later task of any dataset that names the same blob reads the file. Every read, cached or
//! fetched, is checked against the digest (a cached file that does not match is fetched again),
//! so a file left half-written or changed by anyone is never used. Fetches in one process go
//! one at a time, so two tasks starting together fetch a blob once.
//!
//! The cache holds at most [`MAX_CACHE_BYTES`]: after each write the least recently used blobs
//! (by their files' modification time, which a read renews) are deleted until the rest fit.
//!
//! Memory: a resolved tensor is held whole in the definition, and the pipeline's source holds
//! its own copy while it runs; the cache saves the network, not memory.

use bytes::Bytes;
use sluice_element::blob_tensors::{self, BlobDigest};
use sluice_element::{pb, DatasetError};
use sluice_rpc::DispatcherClient;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
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
    // A blob named once moves into its tensor without a copy; one named by several tensors is
    // copied into each.
    let mut uses = BTreeMap::<BlobDigest, usize>::new();
    blob_tensors::visit(def, &mut |t| {
        if let Ok(d) = blob_tensors::digest_from(&t.blob_digest) {
            *uses.entry(d).or_default() += 1;
        }
    });
    blob_tensors::fill(def, &mut |d, _| {
        let left = uses.entry(*d).or_default();
        *left = left.saturating_sub(1);
        let data = match *left {
            0 => blobs.remove(d),
            _ => blobs.get(d).cloned(),
        };
        data.ok_or_else(|| DatasetError::invalid("a blob was not fetched"))
    })
    .map_err(|e| e.to_string())
}

/// Blob `digest` of `len` bytes: the cached file if it holds those bytes, else fetched (and
/// cached).
async fn blob(client: &DispatcherClient, digest: &BlobDigest, len: u64) -> Result<Bytes, String> {
    let path = cache_dir().join(blob_tensors::hex(digest));
    let _one_at_a_time = FETCHING.lock().await;
    let (cached, d) = (path.clone(), *digest);
    let found = tokio::task::spawn_blocking(move || {
        let data = std::fs::read(&cached).ok()?;
        let valid = data.len() as u64 == len && blob_tensors::digest(&data) == d;
        if valid {
            // Recently used: the last to be evicted.
            if let Ok(file) = std::fs::File::options().append(true).open(&cached) {
                let _ = file.set_modified(std::time::SystemTime::now());
            }
        }
        valid.then(|| Bytes::from(data))
    })
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
    use std::time::{Duration, SystemTime};

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
