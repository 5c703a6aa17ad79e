//! The accepted connections of a listener, in TLS or not: what every Sluice server (dispatcher
//! client API, Raft peer listener, worker) serves tonic and the raw fetch stream on.
//!
//! Handshakes run in their own tasks under a deadline, so a client that connects and says
//! nothing (or dribbles its handshake) holds neither the accept loop nor other clients. A
//! handshake that fails is logged and its connection dropped. A verified client certificate is
//! read once, into the connection's [`ConnInfo`], which tonic hands every request on the
//! connection (`request.extensions()`).

use crate::cert_identity::{cert_hosts, cert_identity};
use crate::role::Identity;
use futures::Stream;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tracing::{debug, warn};

/// A TLS handshake must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A pause after a failed `accept` (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
/// Accepted connections waiting for the server to take them.
const BACKLOG: usize = 128;

/// What a server knows about a connection: where it comes from and whom its certificate names.
#[derive(Clone, Debug, Default)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    /// Whether the caller runs on this machine: it connected over loopback, or from the address
    /// it reached this server at.
    pub same_host: bool,
    /// The identity of a verified client certificate with a role, if one was presented.
    pub cert_identity: Option<Identity>,
    /// The hosts that certificate names (its subject alternative names): where its holder may
    /// serve, as the CA decided.
    pub cert_hosts: Vec<String>,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// The ALPN protocol agreed on, if any.
    pub alpn: Option<Vec<u8>>,
}

/// An accepted connection, in TLS or not, and what is known about its caller.
pub struct SecureStream {
    io: Either<TcpStream, Box<tokio_rustls::server::TlsStream<TcpStream>>>,
    info: ConnInfo,
}

impl SecureStream {
    pub fn info(&self) -> &ConnInfo {
        &self.info
    }
}

/// Turns a bound listener into a stream of connections (TLS handshakes done) for tonic's
/// `serve_with_incoming` or a server's own accept loop.
///
/// The stream owns the listener: the port is closed the moment the stream is dropped (a
/// server that stops can be started again on the same port at once). Accepting happens as the
/// stream is polled; each TLS handshake runs in a task of its own, whose connection the stream
/// yields when it is done.
pub fn incoming(listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) -> Incoming {
    let (handshaken_tx, handshaken) = mpsc::channel(BACKLOG);
    Incoming {
        listener,
        acceptor: tls.map(TlsAcceptor::from),
        handshaken,
        handshaken_tx,
        backoff: None,
    }
}

/// See [`incoming`].
pub struct Incoming {
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    /// Connections whose TLS handshake has finished.
    handshaken: mpsc::Receiver<SecureStream>,
    handshaken_tx: mpsc::Sender<SecureStream>,
    /// A pause after a failed accept (out of descriptors and the like), so that polling does
    /// not spin while the condition lasts.
    backoff: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Stream for Incoming {
    type Item = io::Result<SecureStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Poll::Ready(Some(stream)) = this.handshaken.poll_recv(cx) {
            return Poll::Ready(Some(Ok(stream)));
        }
        if let Some(backoff) = &mut this.backoff {
            if backoff.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.backoff = None;
        }
        loop {
            let (socket, remote) = match this.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(accepted)) => accepted,
                Poll::Ready(Err(e)) => {
                    debug!(error = %e, "accept failed");
                    this.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                    return Poll::Ready(Some(Err(e)));
                }
            };
            let _ = socket.set_nodelay(true);
            let info = ConnInfo {
                remote: Some(remote),
                same_host: socket
                    .local_addr()
                    .is_ok_and(|local| same_host(local, remote)),
                ..ConnInfo::default()
            };
            let Some(acceptor) = this.acceptor.clone() else {
                let io = Either::Left(socket);
                return Poll::Ready(Some(Ok(SecureStream { io, info })));
            };
            tokio::spawn(handshake(
                acceptor,
                socket,
                info,
                this.handshaken_tx.clone(),
            ));
        }
    }
}

/// Whether a connection from `remote` to `local` stays on this machine.
fn same_host(local: SocketAddr, remote: SocketAddr) -> bool {
    let remote = remote.ip().to_canonical();
    remote.is_loopback() || remote == local.ip().to_canonical()
}

/// Runs one TLS handshake under its deadline and hands the connection to the stream; a failed
/// handshake is logged and its connection dropped.
async fn handshake(
    acceptor: TlsAcceptor,
    socket: TcpStream,
    mut info: ConnInfo,
    done: mpsc::Sender<SecureStream>,
) {
    let remote = info.remote;
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            warn!(?remote, error = %e, "TLS handshake refused");
            return;
        }
        Err(_) => {
            warn!(?remote, "TLS handshake timed out");
            return;
        }
    };
    let (_, session) = stream.get_ref();
    info.tls = true;
    info.alpn = session.alpn_protocol().map(<[u8]>::to_vec);
    if let Some(leaf) = session.peer_certificates().and_then(|c| c.first()) {
        match cert_identity(leaf) {
            Ok(identity) => info.cert_identity = Some(identity),
            Err(why) => warn!(?remote, "{why}"),
        }
        info.cert_hosts = cert_hosts(leaf);
    }
    let io = Either::Right(Box::new(stream));
    // The stream may be gone (the server stopped): the connection is dropped with it.
    let _ = done.send(SecureStream { io, info }).await;
}

impl AsyncRead for SecureStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for SecureStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for SecureStream {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_is_on_this_host_over_loopback_or_from_the_address_it_reached() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        let cases = [
            ("127.0.0.1:5000", "127.0.0.1:40000", true),
            ("127.0.0.1:5000", "127.0.0.2:40000", true),
            ("[::1]:5000", "[::1]:40000", true),
            ("[::ffff:127.0.0.1]:5000", "[::ffff:127.0.0.1]:40000", true),
            ("10.0.0.5:5000", "10.0.0.5:40000", true),
            ("[::ffff:10.0.0.5]:5000", "10.0.0.5:40000", true),
            ("10.0.0.5:5000", "10.0.0.6:40000", false),
            ("[2001:db8::1]:5000", "[2001:db8::2]:40000", false),
        ];
        for (local, remote, want) in cases {
            assert_eq!(
                same_host(at(local), at(remote)),
                want,
                "{local} <- {remote}"
            );
        }
    }
}
