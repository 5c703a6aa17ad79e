//! Blobs: the large tensors of definitions, kept outside the Raft log.
//!
//! A definition travels through the log to every replica and lives in the state machine (and
//! its snapshots), so it is bounded (`--max-definition-size`). The data of a large constant
//! (`from_tensor_slices` of an in-memory array) is instead uploaded as a content-addressed blob
//! (`PutBlob`), and the definition names it by its SHA-256 (see
//! `sluice_element::blob_tensors`); the log carries the digest, never the bytes.
//!
//! Each replica keeps blobs as files, `data_dir/blobs/<hex digest>`: written to a temporary
//! name, hashed as they arrive, fsynced, checked against their digest and only then renamed
//! into place, so a file under a digest's name always holds that digest's bytes. Disk and
//! hashing run on threads of their own ([`spawn_io`]), never on an async runtime nor on its
//! blocking pool: a transfer lasts as long as its peer reads, and the Raft runtime's two
//! blocking threads are the journal's (a follower whose log appends waited behind a 1 GiB push
//! missed its heartbeats). Uploads are limited in number ([`MAX_CONCURRENT_UPLOADS`]), reads
//! too ([`MAX_CONCURRENT_READS`]), and the store in size (`--max-blob-store-size`).
//!
//! The leader acknowledges an upload once a majority of the voters hold the blob: it pushes
//! the file to every other member over a connection of its own (`PushBlob`), and answers when
//! enough have it; the rest go on in the background. Any leader elected later was in that
//! majority or can fetch from a replica that was: a replica missing a blob fetches it from a
//! peer (`FetchBlob`), verified, when it is asked for it (registration, `GetBlob`) and, for the
//! blobs registered definitions name, in the background ([`Blobs::maintain`]), so one that was
//! down catches up after it restarts.
//!
//! A blob lives as long as a registered definition names it: the live set is read from the
//! applied state (`DispatcherState::live_blobs`), and each replica deletes the blob files not
//! in it once they are older than a grace period (`--blob-gc-grace`), which covers the time
//! between an upload and the registration that names it. Files being written have temporary
//! names and are never collected until they are older than the grace period too.

use crate::error::DispatcherError;
use crate::raft_network::PeerNetwork;
use crate::raft_types::{NodeInfo, Raft, StateHandle};
use crate::state::Rejection;
use futures::{Stream, StreamExt};
use prost::bytes::Bytes;
use sha2::{Digest, Sha256};
use sluice_element::blob_tensors::{hex, BlobDigest};
use sluice_proto::raft::raft_peer_client::RaftPeerClient;
use sluice_proto::raft::{BlobPart, FetchBlobRequest};
use sluice_types::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

/// The most bytes one chunk of a blob carries, in every direction.
pub const CHUNK_BYTES: usize = 1 << 20;

/// The largest blob: 2 GiB, the limit tf.data's graphs put on one constant.
pub const MAX_BLOB_BYTES: u64 = 2 << 30;

/// The most uploads (from clients or pushed by the leader) a replica writes at once; more wait.
pub const MAX_CONCURRENT_UPLOADS: usize = 4;

/// The most blob reads (for `GetBlob` and peers' `FetchBlob`) a replica serves at once; more
/// wait for one to end.
pub const MAX_CONCURRENT_READS: usize = 16;

/// Runs `work` on a thread of its own; the receiver gets its result (an error if the thread
/// could not start).
fn spawn_io<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> tokio::sync::oneshot::Receiver<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let started = std::thread::Builder::new()
        .name("blob-io".into())
        .spawn(move || {
            let _ = tx.send(work());
        });
    if let Err(e) = started {
        tracing::warn!("cannot start a thread for blob I/O: {e}");
    }
    rx
}

/// Sends blob `file` (`len` bytes) from `offset` on into `tx`, in chunks, holding `_permit`
/// (one of [`MAX_CONCURRENT_READS`]) until done or the receiver is gone.
fn read_chunks(
    mut file: std::fs::File,
    offset: u64,
    len: u64,
    tx: &mpsc::Sender<std::io::Result<Bytes>>,
    _permit: tokio::sync::OwnedSemaphorePermit,
) {
    if let Err(e) = file.seek(SeekFrom::Start(offset)) {
        let _ = tx.blocking_send(Err(e));
        return;
    }
    let mut left = len - offset;
    // Nothing left still makes one (empty) chunk, so a reply always names the length.
    if left == 0 {
        let _ = tx.blocking_send(Ok(Bytes::new()));
    }
    while left > 0 {
        let mut buf = vec![0u8; (left as usize).min(CHUNK_BYTES)];
        if let Err(e) = file.read_exact(&mut buf) {
            let _ = tx.blocking_send(Err(e));
            return;
        }
        left -= buf.len() as u64;
        if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
            return;
        }
    }
}

/// How long a peer transfer may take per byte at the least (10 MiB/s) beyond a fixed minute.
fn transfer_timeout(len: u64) -> Duration {
    Duration::from_secs(60 + len / (10 << 20))
}

/// The blob store of one replica and the transfers between replicas.
#[derive(Clone)]
pub struct Blobs {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// Distinguishes the temporary files of concurrent writes.
    seq: AtomicU64,
    uploads: Semaphore,
    reads: Arc<Semaphore>,
    max_store_bytes: u64,
    grace: Duration,
    raft: Raft,
    network: PeerNetwork,
}

/// Where a blob's bytes come from while it is written.
pub type Chunks = std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, tonic::Status>> + Send>>;

/// A peer's `FetchBlob` stream of a blob's parts.
type Parts = futures::stream::BoxStream<'static, Result<BlobPart, tonic::Status>>;

/// How many times one fetch from a peer is resumed after its stream broke.
const MAX_PEER_RESUMES: u32 = 8;

/// The data of `parts`, a blob of `len` bytes from `received` on; when the stream breaks with a
/// status worth retrying, `open(offset)` asks the peer again from the bytes received so far, at
/// most `MAX_PEER_RESUMES` times, so a broken transfer of a large blob does not start over. A
/// resumed stream that names another length is an error (the writer checks the whole digest).
fn resuming<F, Fut>(open: F, parts: Parts, received: u64, len: u64) -> Chunks
where
    F: Fn(u64) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Parts, tonic::Status>> + Send,
{
    struct State<F> {
        open: F,
        parts: Option<Parts>,
        received: u64,
        resumes: u32,
    }
    let state = State {
        open,
        parts: Some(parts),
        received,
        resumes: 0,
    };
    Box::pin(futures::stream::unfold(
        state,
        move |mut state| async move {
            loop {
                let parts = state.parts.as_mut()?;
                let status = match parts.next().await {
                    None => return None,
                    Some(Ok(part)) if part.total_len != len => {
                        state.parts = None;
                        let error = tonic::Status::failed_precondition(format!(
                            "the peer's blob is {} bytes, not {len}",
                            part.total_len
                        ));
                        return Some((Err(error), state));
                    }
                    Some(Ok(part)) => {
                        state.received += part.data.len() as u64;
                        return Some((Ok(part.data), state));
                    }
                    Some(Err(status)) => status,
                };
                if state.resumes >= MAX_PEER_RESUMES || !sluice_rpc::is_retryable_status(&status) {
                    state.parts = None;
                    return Some((Err(status), state));
                }
                state.resumes += 1;
                tracing::debug!(
                    received = state.received,
                    resumes = state.resumes,
                    "a peer's blob stream broke ({}); resuming",
                    status.message()
                );
                match (state.open)(state.received).await {
                    Ok(parts) => state.parts = Some(parts),
                    Err(status) => {
                        state.parts = None;
                        return Some((Err(status), state));
                    }
                }
            }
        },
    ))
}

impl Blobs {
    /// The store under `data_dir/blobs` (created if missing); temporary files a previous run
    /// left are removed.
    pub fn open(
        data_dir: &Path,
        max_store_bytes: u64,
        grace: Duration,
        raft: Raft,
        network: PeerNetwork,
    ) -> Result<Blobs, DispatcherError> {
        let dir = data_dir.join("blobs");
        let startup = |e: std::io::Error| {
            DispatcherError::Startup(format!("blob directory {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(&dir).map_err(startup)?;
        for entry in std::fs::read_dir(&dir).map_err(startup)?.flatten() {
            if entry.file_name().to_string_lossy().ends_with(".tmp") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(Blobs {
            inner: Arc::new(Inner {
                dir,
                seq: AtomicU64::new(0),
                uploads: Semaphore::new(MAX_CONCURRENT_UPLOADS),
                reads: Arc::new(Semaphore::new(MAX_CONCURRENT_READS)),
                max_store_bytes,
                grace,
                raft,
                network,
            }),
        })
    }

    /// The file of blob `digest`.
    pub fn path(&self, digest: &BlobDigest) -> PathBuf {
        self.inner.dir.join(hex(digest))
    }

    /// The length of blob `digest` if this replica holds it.
    pub fn len_of(&self, digest: &BlobDigest) -> Option<u64> {
        std::fs::metadata(self.path(digest)).ok().map(|m| m.len())
    }

    /// Whether this replica holds blob `digest` of `len` bytes; if so, its file counts as new
    /// again for collection, so an upload of a blob held already gets the whole grace period
    /// before the registration that names it.
    pub fn holds_fresh(&self, digest: &BlobDigest, len: u64) -> bool {
        if self.len_of(digest) != Some(len) {
            return false;
        }
        if let Ok(file) = std::fs::File::options()
            .append(true)
            .open(self.path(digest))
        {
            let _ = file.set_modified(SystemTime::now());
        }
        true
    }

    /// Checks an upload's announced length before a byte of it is written.
    pub fn check_len(&self, digest: &BlobDigest, len: u64) -> Result<(), DispatcherError> {
        if len > MAX_BLOB_BYTES {
            return Err(DispatcherError::InvalidArgument(format!(
                "blob {} is {len} bytes, more than the largest tensor a definition may hold \
                 outside it, {MAX_BLOB_BYTES} bytes (2 GiB, as a constant in a tf.data graph)",
                hex(digest)
            )));
        }
        Ok(())
    }

    /// Writes blob `digest` of `len` bytes from `chunks` (the first of which may be given
    /// apart, `first`), hashing as it goes; the blob is in place only if every byte arrived
    /// and they hash to `digest`. Disk and hashing run on a blocking thread.
    pub async fn write(
        &self,
        digest: BlobDigest,
        len: u64,
        first: Bytes,
        mut chunks: Chunks,
    ) -> Result<(), DispatcherError> {
        self.check_len(&digest, len)?;
        let _permit = self
            .inner
            .uploads
            .acquire()
            .await
            .map_err(|_| DispatcherError::RaftStopped("the dispatcher is stopping".into()))?;
        if self.len_of(&digest) == Some(len) {
            return Ok(());
        }
        let used = self.stored_bytes();
        if used.saturating_add(len) > self.inner.max_store_bytes {
            return Err(Rejection::ResourceExhausted(format!(
                "blob {} of {len} bytes does not fit in this dispatcher's blob store: {used} of \
                 its {} bytes are used (--max-blob-store-size)",
                hex(&digest),
                self.inner.max_store_bytes
            ))
            .into());
        }
        let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        let temp = self.inner.dir.join(format!("{}.{seq}.tmp", hex(&digest)));
        let target = self.path(&digest);
        let (tx, mut rx) = mpsc::channel::<Bytes>(4);
        let writer = spawn_io(move || {
            let result = write_file(&temp, &target, &digest, len, &mut rx);
            if result.is_err() {
                let _ = std::fs::remove_file(&temp);
            }
            result
        });
        let mut sent = 0u64;
        let mut failure = None;
        let mut next: Option<Result<Bytes, tonic::Status>> = Some(Ok(first));
        while let Some(chunk) = next {
            match chunk {
                Ok(data) => {
                    sent += data.len() as u64;
                    if sent > len {
                        failure = Some(DispatcherError::InvalidArgument(format!(
                            "blob {} was announced as {len} bytes, and more arrived",
                            hex(&digest)
                        )));
                        break;
                    }
                    if !data.is_empty() && tx.send(data).await.is_err() {
                        break;
                    }
                }
                Err(status) => {
                    failure = Some(DispatcherError::QuorumUnavailable(format!(
                        "the upload of blob {} broke off after {sent} of its {len} bytes: {}",
                        hex(&digest),
                        status.message()
                    )));
                    break;
                }
            }
            if sent == len {
                break;
            }
            next = chunks.next().await;
        }
        drop(tx);
        let written = writer.await.map_err(|_| {
            DispatcherError::QuorumUnavailable("the thread writing the blob did not start".into())
        })?;
        if let Some(failure) = failure {
            return Err(failure);
        }
        written
    }

    /// The bytes of all blob files this replica holds.
    fn stored_bytes(&self) -> u64 {
        let Ok(entries) = std::fs::read_dir(&self.inner.dir) else {
            return 0;
        };
        entries
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    /// Blob `digest` from `offset` on, in chunks (at least one), read on a blocking thread;
    /// `NotFound` if this replica does not hold it.
    pub fn read(
        &self,
        digest: &BlobDigest,
        offset: u64,
    ) -> Result<(u64, mpsc::Receiver<std::io::Result<Bytes>>), DispatcherError> {
        let path = self.path(digest);
        let file = std::fs::File::open(&path).map_err(|_| not_held(digest))?;
        let len = file.metadata().map_err(|_| not_held(digest))?.len();
        if offset > len {
            return Err(DispatcherError::InvalidArgument(format!(
                "offset {offset} is past the end of blob {}, {len} bytes",
                hex(digest)
            )));
        }
        let (tx, rx) = mpsc::channel(4);
        let reads = self.inner.reads.clone();
        // A read beyond the bound starts when one ends; the caller's stream waits meanwhile.
        tokio::spawn(async move {
            let Ok(permit) = reads.acquire_owned().await else {
                return;
            };
            spawn_io(move || read_chunks(file, offset, len, &tx, permit));
        });
        Ok((len, rx))
    }

    /// The other members of the cluster (voters and learners) with their addresses, and how
    /// many voters there are and whether this replica is one.
    fn members(&self) -> (Vec<(NodeId, NodeInfo, bool)>, usize, bool) {
        let metrics = self.inner.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let local = self.inner.network.local();
        let others = membership
            .nodes()
            .filter(|(id, _)| **id != local)
            .map(|(id, node)| (*id, node.clone(), voters.contains(id)))
            .collect();
        (others, voters.len(), voters.contains(&local))
    }

    /// Pushes blob `digest` (held here) to every other member; returns once a majority of the
    /// voters hold it (this replica counts), with how many replicas hold it then. The pushes
    /// still under way go on in the background.
    pub async fn replicate(&self, digest: BlobDigest) -> Result<u32, DispatcherError> {
        let (others, voters, local_votes) = self.members();
        let need = voters / 2 + 1;
        let mut held = usize::from(local_votes);
        let mut holders = 1u32;
        if held >= need {
            // Learners still get it, in the background.
            for (id, node, _) in others {
                let blobs = self.clone();
                tokio::spawn(blobs.push_to(id, node, digest));
            }
            return Ok(holders);
        }
        let (tx, mut rx) = mpsc::channel(others.len().max(1));
        let pushes = others.len();
        for (id, node, voter) in others {
            let blobs = self.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let result = blobs.push_to(id, node, digest).await;
                let _ = tx.send((id, voter, result)).await;
            });
        }
        drop(tx);
        let mut failures = Vec::new();
        for _ in 0..pushes {
            let Some((id, voter, result)) = rx.recv().await else {
                break;
            };
            match result {
                Ok(()) => {
                    holders += 1;
                    held += usize::from(voter);
                    if held >= need {
                        return Ok(holders);
                    }
                }
                Err(e) => failures.push(format!("replica {id}: {e}")),
            }
        }
        Err(DispatcherError::QuorumUnavailable(format!(
            "blob {} reached {held} of the {voters} voters, not a majority: {}",
            hex(&digest),
            failures.join("; ")
        )))
    }

    /// Sends blob `digest` to `target`, which answers at once if it holds it already.
    fn push_to(
        self,
        target: NodeId,
        node: NodeInfo,
        digest: BlobDigest,
    ) -> futures::future::BoxFuture<'static, Result<(), String>> {
        Box::pin(async move {
            let channel = self.inner.network.blob_channel(target, &node)?;
            let (len, rx) = self.read(&digest, 0).map_err(|e| e.to_string())?;
            // Every part names the blob (the peer reads the first); an unreadable file ends the
            // stream short of the length, which the peer refuses as incomplete.
            let parts = tokio_stream::StreamExt::map_while(
                tokio_stream::wrappers::ReceiverStream::new(rx),
                move |chunk| {
                    chunk.ok().map(|data| BlobPart {
                        digest: digest.to_vec(),
                        total_len: len,
                        data,
                    })
                },
            );
            let mut request = tonic::Request::new(parts);
            request.set_timeout(transfer_timeout(len));
            let mut client = RaftPeerClient::new(channel)
                .max_decoding_message_size(2 * CHUNK_BYTES)
                .max_encoding_message_size(2 * CHUNK_BYTES);
            client
                .push_blob(request)
                .await
                .map(|_| ())
                .map_err(|s| format!("{}: {}", s.code(), s.message()))
        })
    }

    /// Makes sure this replica holds blob `digest` (of `len` bytes, when known): fetched,
    /// verified, from the first other member that has it, if not held here.
    pub async fn ensure_local(
        &self,
        digest: &BlobDigest,
        len: Option<u64>,
    ) -> Result<u64, DispatcherError> {
        if let Some(held) = self.len_of(digest) {
            return match len {
                Some(len) if len != held => Err(Rejection::FailedPrecondition(format!(
                    "blob {} is {held} bytes, not the {len} bytes the definition names",
                    hex(digest)
                ))
                .into()),
                _ => Ok(held),
            };
        }
        let (others, _, _) = self.members();
        let mut failures = Vec::new();
        for (id, node, _) in others {
            match self.fetch_from(id, &node, digest).await {
                Ok(()) => {
                    return self
                        .len_of(digest)
                        .ok_or_else(|| not_held(digest))
                        .and_then(|held| match len {
                            Some(len) if len != held => {
                                Err(Rejection::FailedPrecondition(format!(
                                    "blob {} is {held} bytes, not the {len} bytes the \
                                     definition names",
                                    hex(digest)
                                ))
                                .into())
                            }
                            _ => Ok(held),
                        })
                }
                Err(e) => failures.push(format!("replica {id}: {e}")),
            }
        }
        tracing::debug!(digest = %hex(digest), "no replica has the blob: {}", failures.join("; "));
        Err(Rejection::FailedPrecondition(format!(
            "no dispatcher replica holds blob {}{}: upload it (PutBlob) before registering a \
             definition that names it",
            hex(digest),
            len.map(|l| format!(" ({l} bytes)")).unwrap_or_default()
        ))
        .into())
    }

    /// Fetches blob `digest` from `target` into this store. A stream that breaks on the way
    /// (the peer restarted, a link cut) is asked again from where it broke (`resuming`).
    async fn fetch_from(
        &self,
        target: NodeId,
        node: &NodeInfo,
        digest: &BlobDigest,
    ) -> Result<(), String> {
        let channel = self.inner.network.blob_channel(target, node)?;
        let client = RaftPeerClient::new(channel)
            .max_decoding_message_size(2 * CHUNK_BYTES)
            .max_encoding_message_size(2 * CHUNK_BYTES);
        let wanted = digest.to_vec();
        let open = move |offset: u64| {
            let mut client = client.clone();
            let mut request = tonic::Request::new(FetchBlobRequest {
                digest: wanted.clone(),
                offset,
            });
            request.set_timeout(transfer_timeout(MAX_BLOB_BYTES));
            async move {
                let parts = client.fetch_blob(request).await?.into_inner();
                Ok(parts.boxed())
            }
        };
        let mut parts = open(0)
            .await
            .map_err(|s: tonic::Status| format!("{}: {}", s.code(), s.message()))?;
        let first = parts
            .next()
            .await
            .transpose()
            .map_err(|s| format!("{}: {}", s.code(), s.message()))?
            .ok_or_else(|| "the peer sent no part".to_string())?;
        let len = first.total_len;
        let rest = resuming(open, parts, first.data.len() as u64, len);
        self.write(*digest, len, first.data, rest)
            .await
            .map_err(|e| e.to_string())
    }

    /// Until `shutdown`: every `interval`, deletes the blob files no registered definition
    /// names (older than the grace period) and fetches the named ones this replica lacks.
    pub async fn maintain(
        self,
        state: StateHandle,
        interval: Duration,
        shutdown: CancellationToken,
    ) {
        // Each live definition's blobs, decoded once (see `live_blobs_cached`).
        let mut known = BTreeMap::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let live = {
                let applied = state.read().expect("state lock poisoned");
                applied.state.live_blobs_cached(&mut known)
            };
            let store = self.clone();
            let keep = live.clone();
            let _ = spawn_io(move || store.collect(&keep)).await;
            for digest in live {
                if self.len_of(&digest).is_none() {
                    if let Err(e) = self.ensure_local(&digest, None).await {
                        tracing::debug!(digest = %hex(&digest), "blob not fetched yet: {e}");
                    }
                }
            }
        }
    }

    /// Deletes the files of blobs not in `live`, and leftover temporary files, older than the
    /// grace period; returns how many were deleted.
    pub fn collect(&self, live: &BTreeSet<BlobDigest>) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.inner.dir) else {
            return 0;
        };
        let now = SystemTime::now();
        let mut deleted = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let collectable = match parse_hex(&name) {
                Some(digest) => !live.contains(&digest),
                None => name.ends_with(".tmp"),
            };
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age >= self.inner.grace);
            if collectable && old && std::fs::remove_file(entry.path()).is_ok() {
                tracing::info!(blob = %name, "deleted a blob no registered definition names");
                deleted += 1;
            }
        }
        deleted
    }
}

fn write_file(
    temp: &Path,
    target: &Path,
    digest: &BlobDigest,
    len: u64,
    chunks: &mut mpsc::Receiver<Bytes>,
) -> Result<(), DispatcherError> {
    let io = |e: std::io::Error| {
        DispatcherError::QuorumUnavailable(format!(
            "blob {} could not be written to {}: {e}",
            hex(digest),
            temp.display()
        ))
    };
    let mut file = std::fs::File::create(temp).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    while let Some(chunk) = chunks.blocking_recv() {
        hasher.update(&chunk);
        file.write_all(&chunk).map_err(io)?;
        written += chunk.len() as u64;
    }
    if written != len {
        return Err(DispatcherError::InvalidArgument(format!(
            "the upload of blob {} ended after {written} of its {len} bytes",
            hex(digest)
        )));
    }
    let actual: BlobDigest = hasher.finalize().into();
    if actual != *digest {
        return Err(DispatcherError::InvalidArgument(format!(
            "the {len} bytes uploaded as blob {} hash to {}: a blob is named by the SHA-256 of \
             its bytes",
            hex(digest),
            hex(&actual)
        )));
    }
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(temp, target).map_err(io)?;
    if let Some(dir) = target.parent() {
        if let Ok(dir) = std::fs::File::open(dir) {
            let _ = dir.sync_all();
        }
    }
    Ok(())
}

fn not_held(digest: &BlobDigest) -> DispatcherError {
    Rejection::NotFound(format!(
        "this dispatcher does not hold blob {}",
        hex(digest)
    ))
    .into()
}

/// The digest a blob file's name spells, if it is one.
fn parse_hex(name: &str) -> Option<BlobDigest> {
    if name.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(name.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A peer serving `data` in parts of `part` bytes, whose streams break (`Unavailable`, or
    /// `broken` as given) after `cuts[i]` parts on the `i`-th request; records each request's
    /// offset.
    struct Peer {
        data: Vec<u8>,
        part: usize,
        cuts: Vec<usize>,
        broken: tonic::Code,
        offsets: Mutex<Vec<u64>>,
    }

    impl Peer {
        fn open(self: &Arc<Self>, offset: u64) -> Parts {
            let mut offsets = self.offsets.lock().unwrap();
            let attempt = offsets.len();
            offsets.push(offset);
            let total_len = self.data.len() as u64;
            let mut parts: Vec<Result<BlobPart, tonic::Status>> = self.data[offset as usize..]
                .chunks(self.part)
                .map(|chunk| {
                    Ok(BlobPart {
                        digest: Vec::new(),
                        data: Bytes::copy_from_slice(chunk),
                        total_len,
                    })
                })
                .collect();
            if let Some(&cut) = self.cuts.get(attempt) {
                parts.truncate(cut);
                parts.push(Err(tonic::Status::new(self.broken, "the stream broke")));
            }
            futures::stream::iter(parts).boxed()
        }
    }

    /// Reads a blob through `resuming` as `fetch_from` does: the first part, then the rest.
    async fn fetch(peer: &Arc<Peer>) -> (Vec<u8>, Option<tonic::Status>) {
        let mut parts = peer.open(0);
        let first = parts.next().await.unwrap().unwrap();
        let mut got = first.data.to_vec();
        let opener = peer.clone();
        let open = move |offset| {
            let parts = opener.open(offset);
            async move { Ok(parts) }
        };
        let mut rest = resuming(open, parts, got.len() as u64, first.total_len);
        while let Some(chunk) = rest.next().await {
            match chunk {
                Ok(data) => got.extend_from_slice(&data),
                Err(status) => return (got, Some(status)),
            }
        }
        (got, None)
    }

    fn peer(cuts: Vec<usize>, broken: tonic::Code) -> Arc<Peer> {
        Arc::new(Peer {
            data: (0..10_000u32).map(|i| (i % 251) as u8).collect(),
            part: 1000,
            cuts,
            broken,
            offsets: Mutex::new(Vec::new()),
        })
    }

    #[tokio::test]
    async fn a_broken_peer_stream_resumes_where_it_broke() {
        /// A peer whose streams break after `cuts` parts with `broken`: the offsets asked for,
        /// and whether the whole blob arrives.
        struct Case {
            name: &'static str,
            cuts: Vec<usize>,
            broken: tonic::Code,
            offsets: Vec<u64>,
            whole: bool,
        }
        let unavailable = tonic::Code::Unavailable;
        let cases = [
            Case {
                name: "never broken",
                cuts: vec![],
                broken: unavailable,
                offsets: vec![0],
                whole: true,
            },
            Case {
                name: "broken twice",
                cuts: vec![3, 2],
                broken: unavailable,
                offsets: vec![0, 3000, 5000],
                whole: true,
            },
            Case {
                name: "broken before its first part resumes at once",
                cuts: vec![4, 0],
                broken: unavailable,
                offsets: vec![0, 4000, 4000],
                whole: true,
            },
            Case {
                name: "a refusal is not retried",
                cuts: vec![3],
                broken: tonic::Code::PermissionDenied,
                offsets: vec![0],
                whole: false,
            },
            Case {
                name: "at most MAX_PEER_RESUMES resumes",
                cuts: vec![1; MAX_PEER_RESUMES as usize + 2],
                broken: unavailable,
                offsets: (0..=MAX_PEER_RESUMES as u64).map(|i| i * 1000).collect(),
                whole: false,
            },
        ];
        for Case {
            name,
            cuts,
            broken,
            offsets,
            whole,
        } in cases
        {
            let peer = peer(cuts, broken);
            let (got, error) = fetch(&peer).await;
            assert_eq!(*peer.offsets.lock().unwrap(), offsets, "{name}");
            if whole {
                assert_eq!(got, peer.data, "{name}");
                assert!(error.is_none(), "{name}: {error:?}");
            } else {
                assert_eq!(got, peer.data[..got.len()], "{name}: a prefix");
                assert_eq!(error.map(|e| e.code()), Some(broken), "{name}");
            }
        }
    }

    #[tokio::test]
    async fn a_resumed_stream_of_another_length_is_an_error() {
        let peer = peer(vec![2], tonic::Code::Unavailable);
        let mut parts = peer.open(0);
        let first = parts.next().await.unwrap().unwrap();
        let other = peer.clone();
        let open = move |offset| {
            // The peer now holds a blob of another length under the digest.
            let parts = other
                .open(offset)
                .map(|part| {
                    part.map(|mut part| {
                        part.total_len += 1;
                        part
                    })
                })
                .boxed();
            async move { Ok(parts) }
        };
        let mut rest = resuming(open, parts, 1000, first.total_len);
        let mut errors = Vec::new();
        while let Some(chunk) = rest.next().await {
            if let Err(status) = chunk {
                errors.push(status.code());
            }
        }
        assert_eq!(errors, [tonic::Code::FailedPrecondition]);
    }
}
