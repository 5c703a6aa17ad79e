//! The client's side of a raw fetch stream (the protocol is in `raw_frame`): a connection to the
//! worker's port, in TLS when the caller's [`ClientSecurity`] has a CA, that carries one task's
//! `Fetch` stream, opened as a gRPC `Fetch` is: send the handshake (with the caller's token) and
//! the first request, then read batches and send more requests (credits) as they are granted.
//!
//! Requests go through a channel to a small task that writes them, as the gRPC client's request
//! stream does, so the reader never waits on a write. The connection closes when both the batch
//! stream and the request sender are dropped.

use crate::raw_frame::{hello_bytes, request_bytes, Batches, FrameReader};
use sluice_proto::worker::FetchRequest;
use sluice_security::{ClientSecurity, RawStream};
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// As the gRPC channels to workers and dispatchers; it covers the TLS handshake too.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Requests queued for the writer at most (a stream sends one each time half its credits came
/// back, so a few at most are ever in flight).
const QUEUED_REQUESTS: usize = 16;

/// Connects to a worker's port (`host:port`) as `security` says (TLS or not), with
/// `TCP_NODELAY`: a request or the tail of a frame must not wait for the peer's delayed ACK.
/// A certificate the caller cannot verify is an `InvalidData` error.
pub async fn connect(address: &str, security: &ClientSecurity) -> io::Result<RawStream> {
    tokio::time::timeout(CONNECT_TIMEOUT, security.connect_raw(address))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect to {address}: timed out after {CONNECT_TIMEOUT:?}"),
            )
        })?
}

/// Opens the fetch stream `first` names on a connected stream, presenting `token` (the caller's
/// credential, if it has one). Whether the worker serves the task, and whether it accepts the
/// caller, is the first message's answer (a status, as a gRPC `Fetch` would fail).
/// `max_credits` bounds the elements of one batch (see `raw_frame` limits). A `first` request
/// that asks for `shared_memory` maps the region the worker offers, if it can (see
/// `raw_region`).
pub async fn open<S>(
    stream: S,
    token: Option<&[u8]>,
    first: FetchRequest,
    max_credits: u32,
) -> io::Result<(mpsc::Sender<FetchRequest>, Batches)>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, mut write) = tokio::io::split(stream);
    // Flushed after every write: a TLS stream may keep ciphertext buffered until told to.
    write.write_all(&hello_bytes(token, &first)).await?;
    write.flush().await?;
    let (requests_tx, mut requests) = mpsc::channel::<FetchRequest>(QUEUED_REQUESTS);
    tokio::spawn(async move {
        while let Some(request) = requests.recv().await {
            let sent = async {
                write.write_all(&request_bytes(&request)).await?;
                write.flush().await
            };
            if sent.await.is_err() {
                // The worker went away; the reader learns it from the batch stream.
                return;
            }
        }
    });
    let mut frames = FrameReader::new(read, max_credits as usize);
    if first.shared_memory {
        frames = frames.mapping_regions(requests_tx.clone());
    }
    let batches = frames.into_batches();
    Ok((requests_tx, batches))
}
