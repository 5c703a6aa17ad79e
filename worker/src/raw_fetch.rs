//! The worker's port, shared by its gRPC service and raw fetch streams (the protocol is
//! `sluice_rpc::raw_frame`: a `Fetch` stream without gRPC, whose frames carry large tensors'
//! bytes straight from their buffers to the socket).
//!
//! `accept` takes every connection off the listener and hands each to a task of its own, which
//! looks at the connection's first bytes without consuming them: the raw protocol's magic makes
//! it a raw fetch stream, served here; anything else (an HTTP/2 client starts with its preface)
//! goes to tonic untouched, through the channel its server reads its connections from. The
//! accept loop itself never waits on a peer.
//!
//! What a stream serves is not decided here: `service::open_fetch` does that for both
//! transports. This module only moves requests in and frames out, and closes the connection
//! without losing the last frame.

use crate::error::WorkerError;
use crate::service::{open_fetch, FetchRequests};
use crate::worker_state::WorkerState;
use futures::stream::{self, BoxStream, StreamExt};
use sluice_proto::worker::FetchRequest;
use sluice_rpc::raw_frame::{self, Frame, MAGIC};
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::debug;

/// How long a new connection may stay silent before it is handed to tonic regardless (HTTP/2
/// and raw clients both speak first, at once).
const SNIFF_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a closed stream's connection waits for the client to close its side, so the last
/// frame is not lost to a reset (see `linger`).
const LINGER: Duration = Duration::from_secs(5);
/// Requests read and not yet taken by the serving task at most. A client sends one each time
/// half its credits came back, so a few at most are ever waiting; more is a misbehaving client.
const QUEUED_REQUESTS: usize = 64;
/// A pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// Connections for the gRPC server, as `serve_with_incoming` takes them.
pub(crate) type GrpcConnections = mpsc::Sender<io::Result<TcpStream>>;

/// Accepts connections until `cancel`, each sorted by its own task (see the module docs).
pub(crate) async fn accept(
    listener: TcpListener,
    grpc: GrpcConnections,
    state: Arc<WorkerState>,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let socket = match accepted {
            Ok((socket, _)) => socket,
            Err(e) => {
                debug!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Without TCP_NODELAY, Nagle held the tail of each message until the peer's delayed
        // ACK (~40 ms a message).
        if let Err(e) = socket.set_nodelay(true) {
            debug!(error = %e, "set TCP_NODELAY");
        }
        tokio::spawn(route(socket, grpc.clone(), state.clone(), cancel.clone()));
    }
}

/// What a connection's first bytes say it is.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// The raw protocol's magic, now consumed.
    Raw,
    /// Anything else, nothing consumed.
    Other,
}

async fn route(
    mut socket: TcpStream,
    grpc: GrpcConnections,
    state: Arc<WorkerState>,
    cancel: CancellationToken,
) {
    let kind = tokio::select! {
        _ = cancel.cancelled() => return,
        kind = tokio::time::timeout(SNIFF_TIMEOUT, sniff(&mut socket)) => kind,
    };
    match kind {
        Ok(Ok(Kind::Raw)) => {
            tokio::select! {
                _ = cancel.cancelled() => {} // cut, as a worker that went away
                _ = serve(socket, state) => {}
            }
        }
        // A silent peer is tonic's to time out, as it was before raw streams existed.
        Ok(Ok(Kind::Other)) | Err(_) => {
            let _ = grpc.send(Ok(socket)).await;
        }
        Ok(Err(e)) => debug!(error = %e, "dropped a connection that is neither gRPC nor raw"),
    }
}

/// Peeks at the first byte. The magic's first byte (no HTTP/2 preface starts with it) commits
/// the connection to the raw protocol: the magic is then read in full, so a peer that sent only
/// part of it is waited for rather than peeked at in a loop, and a near miss is dropped.
async fn sniff(socket: &mut TcpStream) -> io::Result<Kind> {
    let mut head = [0u8; MAGIC.len()];
    let n = socket.peek(&mut head).await?;
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if head[0] != MAGIC[0] {
        return Ok(Kind::Other);
    }
    socket.read_exact(&mut head).await?;
    if head != MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a connection started like the raw fetch magic but is not it",
        ));
    }
    Ok(Kind::Raw)
}

/// Serves one raw fetch stream: requests are read here and passed on to the serving task, and
/// its batches written as frames, until the stream ends; then the connection closes.
async fn serve(socket: TcpStream, state: Arc<WorkerState>) {
    let (read, mut write) = socket.into_split();
    // The read half stays here, not with the serving task, so that this task decides when the
    // connection closes (see `linger`).
    let mut incoming = raw_frame::requests(read);
    let first = incoming.next().await;
    let (forward, queued) = mpsc::channel(QUEUED_REQUESTS);
    let requests = FetchRequests::new(stream::iter(first).chain(ReceiverStream::new(queued)));
    let mut batches = match open_fetch(&state, requests).await {
        Ok(batches) => batches,
        Err(error) => {
            let status: Status = error.into();
            if Frame::status(&status).write_to(&mut write).await.is_ok() {
                linger(write, incoming).await;
            }
            return;
        }
    };
    // Dropped when the client closed its side: the serving task sees its requests end.
    let mut forward = Some(forward);
    loop {
        tokio::select! {
            request = incoming.next(), if forward.is_some() => {
                let Some(Ok(request)) = request else {
                    forward = None;
                    continue;
                };
                let sender = forward.as_ref().expect("checked by the branch condition");
                if let Err(mpsc::error::TrySendError::Full(_)) = sender.try_send(Ok(request)) {
                    let status: Status = WorkerError::TooManyRequests {
                        limit: QUEUED_REQUESTS,
                    }
                    .into();
                    let _ = Frame::status(&status).write_to(&mut write).await;
                    break;
                }
                // A closed channel means the stream is over: its batches say how.
            }
            batch = batches.recv() => {
                let (frame, last) = match batch {
                    Some(Ok(batch)) => match Frame::batch(batch) {
                        Ok(frame) => (frame, false),
                        Err(status) => (Frame::status(&status), true),
                    },
                    Some(Err(status)) => (Frame::status(&status), true),
                    None => break,
                };
                if frame.write_to(&mut write).await.is_err() {
                    return; // the client went away
                }
                if last {
                    break;
                }
            }
        }
    }
    linger(write, incoming).await;
}

/// Closes a connection without losing what was written: sends FIN, then reads until the client
/// closes its side too (or `LINGER` passes). Closing with requests unread instead would send a
/// reset, which can discard the last frames before the client read them.
async fn linger(
    mut write: OwnedWriteHalf,
    mut incoming: BoxStream<'static, Result<FetchRequest, Status>>,
) {
    let _ = write.shutdown().await;
    let _ = tokio::time::timeout(LINGER, async {
        while let Some(Ok(_)) = incoming.next().await {}
    })
    .await;
}

#[cfg(test)]
#[path = "raw_fetch_tests.rs"]
mod tests;
