//! The worker's port, shared by its gRPC service and raw fetch streams (the protocol is
//! `sluice_rpc::raw_frame`: a `Fetch` stream without gRPC, whose frames carry large tensors'
//! bytes straight from their buffers to the socket), in TLS when the worker has a certificate.
//!
//! [`serve_port`] takes the connections off `sluice_security::incoming` (TLS handshakes done,
//! each in its own task) and hands each to a task of its own, which reads the connection's first
//! byte: the raw protocol's magic makes it a raw fetch stream, served here; anything else (an
//! HTTP/2 client starts with its preface) goes to tonic as a [`Sniffed`] stream that gives that
//! byte back first, through the channel its server reads its connections from. A byte is read,
//! not peeked, so plain and TLS connections take the same path. Neither the accept loop nor
//! tonic ever waits on a peer that says nothing.
//!
//! Credentials: tonic's service sits behind the authenticator's interceptor, and each handler
//! checks the caller's role (`service`). A raw stream's handshake carries its token after the
//! magic; it is authenticated here, with the connection's client certificate when it has no
//! token, and the caller must hold the client role before a request is read. A refusal is a
//! status frame, logged, and the connection closes with nothing served.
//!
//! What a stream serves is not decided here: `service::open_fetch` does that for both
//! transports. This module only moves requests in and frames out, and closes the connection
//! without losing the last frame. To a reader on this machine that asks, it offers a shared
//! memory region of the stream's own, and once the reader mapped it, frames place large parts
//! there rather than on the socket (see `sluice_rpc::raw_region`; `--no-shared-memory` turns
//! it off).

use crate::error::WorkerError;
use crate::service::{open_fetch, FetchRequests, WorkerService};
use crate::worker_state::WorkerState;
use futures::stream::{self, BoxStream, StreamExt};
use sluice_proto::worker::worker_server::WorkerServer;
use sluice_proto::worker::FetchRequest;
use sluice_rpc::raw_frame::{self, Frame, MAGIC};
use sluice_rpc::raw_region::RegionWriter;
use sluice_security::{
    Authenticator, ClientCerts, ConnInfo, Identity, Role, SecureStream, ServerSecurity,
};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf, WriteHalf};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::Status;
use tracing::{debug, warn};

/// How long a new connection may stay silent before it is handed to tonic regardless (HTTP/2
/// and raw clients both speak first, at once). A raw client's whole handshake (magic and
/// token) must arrive within it too.
const SNIFF_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a closed stream's connection waits for the client to close its side, so the last
/// frame is not lost to a reset (see `linger`).
const LINGER: Duration = Duration::from_secs(5);
/// Requests read and not yet taken by the serving task at most. A client sends one each time
/// half its credits came back, so a few at most are ever waiting; more is a misbehaving client.
const QUEUED_REQUESTS: usize = 64;
/// Connections sorted and not yet taken by tonic at most.
const GRPC_BACKLOG: usize = 64;
/// The RPC name a raw fetch stream is authorized as: it is the gRPC `Fetch` on another transport.
const RAW_RPC: &str = "Fetch";

/// Connections for the gRPC server, as `serve_with_incoming` takes them.
type GrpcConnections = mpsc::Sender<io::Result<Sniffed>>;

/// Serves the worker's port until `cancel`: tonic's `Worker` service behind `security`'s
/// authenticator, and raw fetch streams, on the connections of `listener` (in TLS when
/// `security` has a certificate). The tasks that serve go into `tasks`.
pub(crate) fn serve_port(
    listener: TcpListener,
    security: &ServerSecurity,
    state: Arc<WorkerState>,
    rpc: sluice_ops::RpcMetricsLayer,
    cancel: CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), WorkerError> {
    let tls = security.tls_config(ClientCerts::Optional)?;
    let authenticator = security.authenticator();
    let (grpc_tx, grpc_rx) = mpsc::channel(GRPC_BACKLOG);
    let connections = sluice_security::incoming(listener, tls);
    let port = Port {
        grpc: grpc_tx,
        state: state.clone(),
        authenticator: authenticator.clone(),
        cancel: cancel.clone(),
    };
    tasks.spawn(port.accept(connections));
    let service = InterceptedService::new(
        WorkerServer::new(WorkerService::new(state)).max_encoding_message_size(usize::MAX),
        authenticator.interceptor(),
    );
    let server = tonic::transport::Server::builder()
        .layer(rpc)
        .add_service(service)
        .serve_with_incoming_shutdown(ReceiverStream::new(grpc_rx), cancel.cancelled_owned());
    tasks.spawn(async move {
        if let Err(e) = server.await {
            warn!(error = %e, "worker server stopped");
        }
    });
    Ok(())
}

/// What every connection's task needs.
#[derive(Clone)]
struct Port {
    grpc: GrpcConnections,
    state: Arc<WorkerState>,
    authenticator: Authenticator,
    cancel: CancellationToken,
}

impl Port {
    /// Takes connections until `cancel`, each sorted by its own task (see the module docs).
    async fn accept(
        self,
        connections: impl futures::Stream<Item = io::Result<SecureStream>> + Send + 'static,
    ) {
        let mut connections = Box::pin(connections);
        loop {
            let next = tokio::select! {
                _ = self.cancel.cancelled() => return,
                next = connections.next() => next,
            };
            match next {
                Some(Ok(connection)) => {
                    tokio::spawn(self.clone().route(connection));
                }
                Some(Err(e)) => debug!(error = %e, "accept failed"),
                None => return,
            }
        }
    }

    async fn route(self, mut connection: SecureStream) {
        let first = tokio::select! {
            _ = self.cancel.cancelled() => return,
            first = tokio::time::timeout(SNIFF_TIMEOUT, connection.read_u8()) => first,
        };
        let head = match first {
            // A silent peer is tonic's to time out, as it was before raw streams existed.
            Err(_) => None,
            Ok(Ok(byte)) if byte == MAGIC[0] => {
                let cancel = self.cancel.clone();
                tokio::select! {
                    _ = cancel.cancelled() => {} // cut, as a worker that went away
                    _ = self.raw(connection) => {}
                }
                return;
            }
            Ok(Ok(byte)) => Some(byte),
            Ok(Err(e)) => {
                debug!(error = %e, "a connection closed before it said anything");
                return;
            }
        };
        let _ = self.grpc.send(Ok(Sniffed { head, connection })).await;
    }

    /// A connection whose first byte was the magic's: the rest of the handshake, the caller's
    /// credential, then the stream.
    async fn raw(self, mut connection: SecureStream) {
        let remote = connection.info().remote;
        let handshake = tokio::time::timeout(
            SNIFF_TIMEOUT,
            handshake(&mut connection, &self.authenticator),
        )
        .await;
        let refusal = match handshake {
            Err(_) => {
                debug!(?remote, "a raw fetch handshake timed out");
                return;
            }
            Ok(Err(Handshake::Dropped(why))) => {
                debug!(
                    ?remote,
                    "dropped a connection that is neither gRPC nor raw: {why}"
                );
                return;
            }
            Ok(Err(Handshake::Refused(error))) => error,
            Ok(Ok(identity)) => {
                debug!(?remote, caller = %identity, "raw fetch stream");
                return serve(connection, self.state).await;
            }
        };
        warn!(?remote, reason = %refusal, "refused a raw fetch stream");
        let status: Status = refusal.into();
        let (read, mut write) = tokio::io::split(connection);
        if Frame::status(&status).write_to(&mut write).await.is_ok() {
            linger(write, raw_frame::requests(read)).await;
        }
    }
}

/// Why a raw handshake did not lead to a stream.
enum Handshake {
    /// Not this protocol at all: closed without a word.
    Dropped(String),
    /// This protocol, refused: the caller is told why in a status frame.
    Refused(WorkerError),
}

/// Reads the rest of the magic and the token (the magic's first byte is read), and admits the
/// caller if its credential holds the client role.
async fn handshake(
    connection: &mut SecureStream,
    authenticator: &Authenticator,
) -> Result<Identity, Handshake> {
    let mut rest = [0u8; MAGIC.len() - 1];
    connection
        .read_exact(&mut rest)
        .await
        .map_err(|e| Handshake::Dropped(e.to_string()))?;
    let version = MAGIC.len() - 2;
    if rest[..version] != MAGIC[1..=version] {
        return Err(Handshake::Dropped(
            "it started like the raw fetch magic but is not it".into(),
        ));
    }
    if rest[version] != MAGIC[MAGIC.len() - 1] {
        return Err(Handshake::Refused(WorkerError::RawVersion {
            got: rest[version],
            spoken: MAGIC[MAGIC.len() - 1],
        }));
    }
    let token = raw_frame::read_token(connection)
        .await
        .map_err(|status| Handshake::Refused(WorkerError::Reader(status)))?;
    admit(authenticator, token.as_deref(), connection.info()).map_err(Handshake::Refused)
}

/// The caller a raw stream's credential names, if it may read elements (as `Fetch` requires).
fn admit(
    authenticator: &Authenticator,
    token: Option<&[u8]>,
    conn: &ConnInfo,
) -> Result<Identity, WorkerError> {
    let identity = authenticator
        .authenticate(token, Some(conn))
        .map_err(|failure| WorkerError::Unauthenticated(failure.message().to_string()))?;
    if !identity.may(&[Role::Client]) {
        return Err(WorkerError::PermissionDenied(format!(
            "{identity} may not call {RAW_RPC}: it needs the client role"
        )));
    }
    Ok(identity)
}

/// A connection for tonic, whose first byte (read to sort it) comes back first.
pub(crate) struct Sniffed {
    head: Option<u8>,
    connection: SecureStream,
}

impl AsyncRead for Sniffed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() > 0 {
            if let Some(byte) = this.head.take() {
                buf.put_slice(&[byte]);
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut this.connection).poll_read(cx, buf)
    }
}

impl AsyncWrite for Sniffed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().connection).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().connection).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.connection.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().connection).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().connection).poll_shutdown(cx)
    }
}

/// tonic puts the connection's `ConnInfo` (address, client certificate) in every request.
impl tonic::transport::server::Connected for Sniffed {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.connection.info().clone()
    }
}

/// Serves one raw fetch stream: requests are read here and passed on to the serving task, and
/// its batches written as frames, until the stream ends; then the connection closes.
async fn serve(connection: SecureStream, state: Arc<WorkerState>) {
    let same_host = connection.info().same_host;
    let (read, mut write) = tokio::io::split(connection);
    // The read half stays here, not with the serving task, so that this task decides when the
    // connection closes (see `linger`).
    let mut incoming = raw_frame::requests(read);
    // A caller that shakes hands and then says nothing would hold the connection for good.
    let first = match tokio::time::timeout(SNIFF_TIMEOUT, incoming.next()).await {
        Ok(first) => first,
        Err(_) => {
            debug!("a raw fetch stream sent no request in time; closed");
            return;
        }
    };
    let wants_region = matches!(&first, Some(Ok(request)) if request.shared_memory);
    let (forward, queued) = mpsc::channel(QUEUED_REQUESTS);
    let requests = match first {
        Some(first) => {
            FetchRequests::new(stream::iter(Some(first)).chain(ReceiverStream::new(queued)))
        }
        // The client closed its side before its first request. Nothing is forwarded then:
        // `forward` lives until the stream ends, so a stream waiting on it would never open.
        None => FetchRequests::new(stream::empty()),
    };
    let mut batches = match open_fetch(&state, requests, same_host).await {
        Ok(batches) => batches,
        Err(error) => {
            let status: Status = error.into();
            if Frame::status(&status).write_to(&mut write).await.is_ok() {
                linger(write, incoming).await;
            }
            return;
        }
    };
    let mut region = offer_region(&state, same_host && wants_region);
    if let Some(region) = &region {
        if Frame::offer(region).write_to(&mut write).await.is_err() {
            return;
        }
    }
    // Set once the reader mapped the region: payloads go into it from then on.
    let mut mapped = false;
    // Dropped when the client closed its side: the serving task sees its requests end.
    let mut forward = Some(forward);
    loop {
        tokio::select! {
            request = incoming.next(), if forward.is_some() => {
                let Some(Ok(request)) = request else {
                    forward = None;
                    continue;
                };
                if request.region_mapped {
                    mapped = region.is_some();
                    continue; // the transport's own, not the stream's
                }
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
                    Some(Ok(batch)) => match Frame::batch(batch, region.as_mut().filter(|_| mapped)) {
                        Ok(frame) => (frame, false),
                        Err(status) => (Frame::status(&status), true),
                    },
                    Some(Err(status)) => (Frame::status(&status), true),
                    None => break,
                };
                if frame.write_to(&mut write).await.is_err() {
                    return; // the client went away
                }
                if frame.placed_bytes() > 0 {
                    state.stats.record_shared(frame.placed_bytes());
                }
                if last {
                    break;
                }
            }
        }
    }
    linger(write, incoming).await;
}

/// A region for a reader on this machine that asked for one (`wanted`), if the worker shares
/// memory with local readers and can make one (see `sluice_rpc::raw_region`).
fn offer_region(state: &WorkerState, wanted: bool) -> Option<RegionWriter> {
    if !wanted || !state.shares_memory() {
        return None;
    }
    RegionWriter::create()
        .inspect_err(|e| debug!(error = %e, "no shared memory region for a local reader"))
        .ok()
}

/// Closes a connection without losing what was written: sends FIN, then reads until the client
/// closes its side too (or `LINGER` passes). Closing with requests unread instead would send a
/// reset, which can discard the last frames before the client read them.
async fn linger(
    mut write: WriteHalf<SecureStream>,
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

#[cfg(test)]
#[path = "port_security_tests.rs"]
mod port_security_tests;

#[cfg(test)]
#[path = "raw_fetch_fuzz_tests.rs"]
mod fuzz_tests;

#[cfg(test)]
#[path = "reader_resend_tests.rs"]
mod reader_resend_tests;

#[cfg(test)]
#[path = "admission_tests.rs"]
mod admission_tests;
