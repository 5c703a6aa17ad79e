//! Listing and reading objects in object stores (S3 and S3-compatible stores, GCS, Azure Blob
//! Storage, HTTPS servers) through Apache Arrow's `object_store` client, for the files sources'
//! URLs (see `ObjectUrl`).
//!
//! Configuration and credentials come only from the process that lists or reads (the client's
//! for a pattern it expands, each worker's for the objects it reads): its environment, in the
//! variables the client reads (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT` (an S3-compatible store), `AWS_ALLOW_HTTP`;
//! `GOOGLE_*`; `AZURE_*`), and over it the per-store settings a worker or dispatcher was given
//! (`objstore_config`; in any other process, the file `$SLUICE_OBJECT_STORE_CONFIG` names). They
//! never travel in a definition, and errors name the URL, never a
//! credential: a store's error text has the values of the credential variables and of the
//! settings' secrets masked before it is shown.
//!
//! The client is asynchronous; the executor's readers are iterators on threads. One small
//! runtime of this module's own runs every request; a caller blocks on a channel (never on
//! `block_on`, so a caller that is itself on a runtime's thread, such as a client registering a
//! dataset, does not panic).
//!
//! Reading streams the object: a task of the runtime requests the object and forwards its body
//! in chunks through a bounded channel, at most `READ_AHEAD_CHUNKS` ahead of the reader (the
//! read-ahead). The stream may be started before its reader's turn (`start`; a files source
//! starts the next files' while it reads one, see `files::file_elements_started`), and the
//! reader takes the store's first answer when it begins (`Started::wait`). A request the store fails with a transient error (5xx, a dropped connection) is
//! retried by the client, with backoff; a body cut off part way is resumed by the client with a
//! ranged request from the first byte not yet delivered, pinned to the object's ETag. Should the
//! client give up on a body, the task resumes it the same way (at most `MAX_RESUMES` times
//! without progress), from the first byte not yet forwarded. Either way the reader sees every
//! byte once, in order, and no record twice.

use std::collections::HashMap;
use std::future::Future;
use std::io::{self, Read};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload};
use sluice_element::DatasetError;

use crate::object_url::{ObjectUrl, Scheme};
use crate::objstore_config::{current_settings, ObjectStoreSettings};

/// Chunks of a body (as the connection delivers them, typically 16 to 64 KiB) forwarded ahead
/// of the reader.
const READ_AHEAD_CHUNKS: usize = 64;

/// Times in a row a body may be cut off (no byte arriving between two cuts) before the read
/// fails.
const MAX_RESUMES: u32 = 10;

/// The runtime every request runs on: two threads, enough to keep many streams' requests in
/// flight (they wait on the network, not the CPU).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-objstore")
            .enable_all()
            .build()
            .expect("the object-store runtime starts")
    })
}

/// Runs `f` on the runtime and waits for its result (on a channel: see the module's doc).
fn run<T: Send + 'static>(f: impl Future<Output = T> + Send + 'static) -> T {
    let (tx, rx) = flume::bounded(1);
    runtime().spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv().expect("an object-store task ends with a result")
}

/// The stores built so far, by scheme and bucket (or host), and the generation of the settings
/// they were built with.
type Stores = Mutex<(u64, HashMap<(Scheme, String), Arc<dyn ObjectStore>>)>;

/// The store a URL's objects are in, one per scheme and bucket (or host), built on first use
/// from the environment and the per-store settings (built again after the settings change); an
/// error names `shown` (the URL or pattern as the user wrote it).
fn store(url: &ObjectUrl, shown: &str) -> Result<Arc<dyn ObjectStore>, DatasetError> {
    static STORES: OnceLock<Stores> = OnceLock::new();
    let stores = STORES.get_or_init(Default::default);
    let (settings, generation) = current_settings().map_err(|message| DatasetError::Io {
        path: shown.to_string(),
        kind: io::ErrorKind::InvalidInput,
        message,
    })?;
    let key = (url.scheme, url.bucket.clone());
    {
        let mut stores = stores.lock().expect("not poisoned");
        if stores.0 != generation {
            *stores = (generation, HashMap::new());
        }
        if let Some(store) = stores.1.get(&key) {
            return Ok(store.clone());
        }
    }
    let store = build_store(url, shown, &settings)?;
    let mut stores = stores.lock().expect("not poisoned");
    if stores.0 == generation {
        stores.1.entry(key).or_insert(store.clone());
    }
    Ok(store)
}

fn build_store(
    url: &ObjectUrl,
    shown: &str,
    settings: &ObjectStoreSettings,
) -> Result<Arc<dyn ObjectStore>, DatasetError> {
    use std::str::FromStr;
    let failed = |e: object_store::Error| store_error(shown, Access::Configure, e);
    let options = settings.options_for(url.scheme, &url.bucket);
    // The keys were checked when the settings were loaded (a key that did not parse would be
    // refused here too, by name).
    Ok(match url.scheme {
        Scheme::S3 => {
            let mut builder =
                object_store::aws::AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
            let mut configured_credentials = false;
            for (key, value) in options {
                use object_store::aws::AmazonS3ConfigKey as K;
                let key = K::from_str(&key).map_err(failed)?;
                configured_credentials |= matches!(
                    key,
                    K::AccessKeyId
                        | K::SecretAccessKey
                        | K::SkipSignature
                        | K::WebIdentityTokenFile
                        | K::ContainerCredentialsRelativeUri
                        | K::ContainerCredentialsFullUri
                );
                builder = builder.with_config(key, value);
            }
            if !configured_credentials {
                check_aws_credentials(shown)?;
            }
            Arc::new(builder.build().map_err(failed)?)
        }
        Scheme::Gcs => {
            let mut builder = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(&url.bucket);
            for (key, value) in options {
                let key = object_store::gcp::GoogleConfigKey::from_str(&key).map_err(failed)?;
                builder = builder.with_config(key, value);
            }
            Arc::new(builder.build().map_err(failed)?)
        }
        Scheme::Azure => {
            let mut builder = object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_container_name(&url.bucket);
            for (key, value) in options {
                let key = object_store::azure::AzureConfigKey::from_str(&key).map_err(failed)?;
                builder = builder.with_config(key, value);
            }
            Arc::new(builder.build().map_err(failed)?)
        }
        Scheme::Https | Scheme::Http => {
            let mut client = ClientOptions::new().with_allow_http(url.scheme == Scheme::Http);
            for (key, value) in options {
                let key = object_store::ClientConfigKey::from_str(&key).map_err(failed)?;
                client = client.with_config(key, value);
            }
            Arc::new(
                object_store::http::HttpBuilder::new()
                    .with_url(format!("{}{}", url.scheme.prefix(), url.bucket))
                    .with_client_options(client)
                    .build()
                    .map_err(failed)?,
            )
        }
    })
}

/// Refuses early, naming the URL, when neither the store's settings nor the environment give S3
/// a way to sign a request: no keys, no web identity, no container credentials, and the
/// instance metadata service turned off (`AWS_EC2_METADATA_DISABLED=true`, as AWS's own tools
/// read it). Otherwise the client would try the instance metadata service, which off EC2 only
/// times out.
fn check_aws_credentials(url: &str) -> Result<(), DatasetError> {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let on = |name: &str| std::env::var(name).is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    let any_source = set("AWS_ACCESS_KEY_ID")
        || set("AWS_SECRET_ACCESS_KEY")
        || set("AWS_WEB_IDENTITY_TOKEN_FILE")
        || set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        || set("AWS_CONTAINER_CREDENTIALS_FULL_URI")
        || on("AWS_SKIP_SIGNATURE");
    if any_source || !on("AWS_EC2_METADATA_DISABLED") {
        return Ok(());
    }
    Err(DatasetError::Io {
        path: url.to_string(),
        kind: io::ErrorKind::PermissionDenied,
        message: "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the \
                  environment of each process that reads it (every worker, and the client that \
                  expands a pattern), or access_key_id and secret_access_key in the store's \
                  entry of a worker's --object-store-config"
            .into(),
    })
}

/// What was being done when a store failed, for the error's words.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Configure,
    List,
    Read,
}

/// A store's error as a `DatasetError::Io` naming `url`, with any credential masked.
fn store_error(url: &str, access: Access, e: object_store::Error) -> DatasetError {
    use object_store::Error as E;
    // S3 answers a listing of a missing bucket 404 NoSuchBucket, which the client reports as a
    // generic error with the answer's text.
    let no_bucket = matches!(&e, E::Generic { .. }) && e.to_string().contains("NoSuchBucket");
    let (kind, message) = match &e {
        _ if no_bucket => (
            io::ErrorKind::NotFound,
            "no such bucket (the store answered NoSuchBucket)".to_string(),
        ),
        E::NotFound { .. } if access == Access::List => (
            io::ErrorKind::NotFound,
            "no such bucket (the store answered not found)".to_string(),
        ),
        E::NotFound { .. } => (
            io::ErrorKind::NotFound,
            "no such object or bucket (the store answered not found)".to_string(),
        ),
        E::PermissionDenied { .. } => (
            io::ErrorKind::PermissionDenied,
            format!("the store denied access: {}", masked(&e.to_string())),
        ),
        E::Unauthenticated { .. } => (
            io::ErrorKind::PermissionDenied,
            format!(
                "the store did not accept the credentials: {}",
                masked(&e.to_string())
            ),
        ),
        E::Precondition { .. } => (
            io::ErrorKind::Other,
            "the object changed while it was being read".to_string(),
        ),
        _ if access == Access::Configure => (
            io::ErrorKind::InvalidInput,
            format!(
                "the store's configuration (from the environment and the store's settings) is \
                 not usable: {}",
                masked(&e.to_string())
            ),
        ),
        _ => (io::ErrorKind::Other, masked(&e.to_string())),
    };
    DatasetError::Io {
        path: url.to_string(),
        kind,
        message,
    }
}

/// `text` with the value of every credential-like environment variable, and every secret of the
/// per-store settings, replaced by `***`.
fn masked(text: &str) -> String {
    let mut out = text.to_string();
    if let Ok((settings, _)) = current_settings() {
        for secret in settings.secrets() {
            out = out.replace(secret.as_str(), "***");
        }
    }
    for (name, value) in std::env::vars() {
        let name = name.to_ascii_uppercase();
        let secret = ["SECRET", "TOKEN", "KEY", "PASSWORD", "SAS", "CREDENTIAL"]
            .iter()
            .any(|w| name.contains(w));
        if secret && value.len() >= 4 {
            out = out.replace(&value, "***");
        }
    }
    out
}

fn location(url: &ObjectUrl) -> Result<StorePath, DatasetError> {
    StorePath::parse(&url.key).map_err(|e| {
        DatasetError::invalid(format!(
            "invalid object URL '{url}': {}",
            masked(&e.to_string())
        ))
    })
}

/// The keys below `prefix` for which `keep` holds, at most `limit` of them (an error past it
/// names `pattern`). Listing a bucket that does not exist is an error naming `pattern`.
pub(crate) fn list(
    pattern: &str,
    prefix: &ObjectUrl,
    keep: impl Fn(&str) -> bool + Send + 'static,
    limit: usize,
) -> Result<Vec<String>, DatasetError> {
    let store = store(prefix, pattern)?;
    let location = location(prefix)?;
    let pattern = pattern.to_string();
    run(async move {
        let prefix = (!location.as_ref().is_empty()).then_some(&location);
        let mut listing = store.list(prefix);
        let mut keys = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| store_error(&pattern, Access::List, e))?;
            let key = meta.location.as_ref();
            if !keep(key) {
                continue;
            }
            if keys.len() == limit {
                return Err(DatasetError::invalid(format!(
                    "file pattern '{pattern}' matches more than {limit} files, the limit"
                )));
            }
            keys.push(key.to_string());
        }
        Ok(keys)
    })
}

/// Whether the object `url` exists (`false` when the store says not found).
pub(crate) fn exists(url: &ObjectUrl) -> Result<bool, DatasetError> {
    let shown = url.to_string();
    let store = store(url, &shown)?;
    let location = location(url)?;
    run(async move {
        let head = GetOptions {
            head: true,
            ..GetOptions::default()
        };
        match store.get_opts(&location, head).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_error(&shown, Access::Read, e)),
        }
    })
}

/// Writes `data` as the object `url` (replacing it): for tests, benchmarks and data generation.
pub fn write_object(url: &str, data: impl Into<Bytes>) -> Result<(), DatasetError> {
    let shown = url;
    let url = ObjectUrl::parse(url)?;
    let data = data.into();
    let store = store(&url, shown)?;
    let location = location(&url)?;
    let shown = shown.to_string();
    run(async move {
        store
            .put(&location, PutPayload::from_bytes(data))
            .await
            .map(|_| ())
            .map_err(|e| store_error(&shown, Access::Read, e))
    })
}

/// One message of a body's stream to its reader.
enum Chunk {
    Data(Bytes),
    End,
    Failed(DatasetError),
}

/// A streamed object, read as `Read` (see the module's doc). Opening waits for the store's
/// answer (`Started::wait`), so a missing object is an error of the open.
pub(crate) struct ObjectReader {
    chunks: flume::Receiver<Chunk>,
    current: Bytes,
    done: bool,
}

/// An object whose stream was started (its request sent, its body forwarded as it arrives) but
/// whose first answer has not been taken yet: a file read ahead of its turn. Dropping it stops
/// the stream.
pub(crate) struct Started {
    chunks: flume::Receiver<Chunk>,
    shown: String,
}

/// Starts streaming the object `url` (as named to the user: `shown`) without waiting for the
/// store's answer: `Started::wait` takes it.
pub(crate) fn start(url: &ObjectUrl, shown: &str) -> Result<Started, DatasetError> {
    let store = store(url, shown)?;
    let location = location(url)?;
    let (tx, rx) = flume::bounded(READ_AHEAD_CHUNKS);
    runtime().spawn(pump(store, location, shown.to_string(), tx));
    Ok(Started {
        chunks: rx,
        shown: shown.to_string(),
    })
}

impl Started {
    /// Waits for the store's first answer: the object's first bytes, or the error that makes
    /// it unreadable (a missing object), as `open`'s error.
    pub(crate) fn wait(self) -> Result<ObjectReader, DatasetError> {
        let mut reader = ObjectReader {
            chunks: self.chunks,
            current: Bytes::new(),
            done: false,
        };
        // The first message comes after the store answered: an error is the open's.
        match reader.chunks.recv() {
            Ok(Chunk::Data(b)) => reader.current = b,
            Ok(Chunk::End) => reader.done = true,
            Ok(Chunk::Failed(e)) => return Err(e),
            Err(_) => return Err(stopped(&self.shown)),
        }
        Ok(reader)
    }
}

fn stopped(url: &str) -> DatasetError {
    DatasetError::Io {
        path: url.to_string(),
        kind: io::ErrorKind::Other,
        message: "the object's stream stopped without an error".into(),
    }
}

/// Requests the object and forwards its body to `tx`, resuming a cut-off body from the first
/// byte not yet forwarded; ends when the reader is dropped.
async fn pump(
    store: Arc<dyn ObjectStore>,
    location: StorePath,
    url: String,
    tx: flume::Sender<Chunk>,
) {
    let mut offset = 0u64;
    // The object's size and ETag, from the first answer: a resumed request must read the same
    // version (`if_match`) up to the same end.
    let mut pinned: Option<(u64, Option<String>)> = None;
    let mut cuts = 0u32;
    loop {
        let options = GetOptions {
            range: (offset > 0).then_some(GetRange::Offset(offset)),
            if_match: pinned.as_ref().and_then(|(_, etag)| etag.clone()),
            ..GetOptions::default()
        };
        let answer = match store.get_opts(&location, options).await {
            Ok(answer) => answer,
            Err(e) => {
                // The client already retried a transient failure; a resumed request that still
                // fails ends the read too.
                let _ = tx
                    .send_async(Chunk::Failed(store_error(&url, Access::Read, e)))
                    .await;
                return;
            }
        };
        let size = pinned
            .get_or_insert((answer.meta.size, answer.meta.e_tag.clone()))
            .0;
        let mut body = answer.into_stream();
        let mut cut = None;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(bytes) if bytes.is_empty() => {}
                Ok(bytes) => {
                    offset += bytes.len() as u64;
                    cuts = 0;
                    if tx.send_async(Chunk::Data(bytes)).await.is_err() {
                        return; // the reader is gone
                    }
                }
                Err(e) => {
                    cut = Some(e);
                    break;
                }
            }
        }
        if offset >= size {
            let _ = tx.send_async(Chunk::End).await;
            return;
        }
        cuts += 1;
        if cuts > MAX_RESUMES {
            let why = match cut {
                Some(e) => store_error(&url, Access::Read, e),
                None => DatasetError::Io {
                    path: url.clone(),
                    kind: io::ErrorKind::UnexpectedEof,
                    message: format!("the store ended the object at byte {offset} of {size}"),
                },
            };
            let _ = tx.send_async(Chunk::Failed(why)).await;
            return;
        }
        tracing::debug!(url, offset, size, cuts, "object body cut off; resuming");
        tokio::time::sleep(Duration::from_millis(50 << cuts.min(6))).await;
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.done {
                return Ok(0);
            }
            match self.chunks.recv() {
                Ok(Chunk::Data(b)) => self.current = b,
                Ok(Chunk::End) => self.done = true,
                Ok(Chunk::Failed(e)) => {
                    self.done = true;
                    let message = match e {
                        DatasetError::Io { message, .. } => message,
                        other => other.to_string(),
                    };
                    return Err(io::Error::other(message));
                }
                Err(_) => {
                    self.done = true;
                    return Err(io::Error::other("the object's stream stopped"));
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_mask_the_secrets_of_the_settings() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "tok-5e3c7a91").unwrap();
        let path = dir.path().join("stores.json");
        std::fs::write(
            &path,
            r#"{"stores": {"s3://b": {"endpoint": {"file": "token"},
                                     "secret_access_key": "inline-4d2f8b"}}}"#,
        )
        .unwrap();
        crate::load_object_store_settings(&path).unwrap();
        // A client's error may quote a request's URL (the endpoint) or what it sent.
        let source = "error sending request for url (http://host/tok-5e3c7a91/b/k) with \
                      inline-4d2f8b";
        for access in [Access::Configure, Access::List, Access::Read] {
            let e = object_store::Error::Generic {
                store: "S3",
                source: source.into(),
            };
            let DatasetError::Io { path, message, .. } = store_error("s3://b/k", access, e) else {
                panic!("an I/O error");
            };
            assert_eq!(path, "s3://b/k");
            assert!(!message.contains("tok-5e3c7a91"), "{message}");
            assert!(!message.contains("inline-4d2f8b"), "{message}");
            assert!(message.contains("http://host/***/b/k"), "{message}");
        }
    }
}
