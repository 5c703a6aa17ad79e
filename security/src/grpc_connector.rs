//! `GrpcConnector`: the connections of a caller's gRPC channels, in TLS or not, which notice a
//! server the caller cannot speak to as configured and say why.
//!
//! tonic's own connector would do the TLS, but a failure it cannot see is what matters here. A
//! server that refuses the caller's certificate says so in an alert after the caller's side of
//! the TLS 1.3 handshake is done, and a TLS server sent plain HTTP/2 answers with a TLS alert
//! that HTTP/2 reads as a malformed frame: either way the connection fails in its background
//! task, and the call on it sees only "transport error" or "operation was canceled", which
//! looks like a server going away and was retried forever. So the connector does the TLS (the
//! server's certificate checked for its role by [`ServerRoleVerifier`](crate::server_role_verifier)),
//! and watches what the connection reads: a rustls error that no retry cures, or, without TLS,
//! a first byte that starts a TLS record (an HTTP/2 server's first frame starts with a zero
//! length byte; a TLS record with 0x15, an alert, or 0x16, a handshake). It records the cause
//! for the server's address in the caller's [`Refusals`], where the caller looks when a call
//! fails, before the connection reports its failure.

use crate::connect_failure::{Misconfigured, Refusals};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::either::Either;

/// Dials `host:port` of an endpoint's URI (no Nagle delay), in TLS when given a connector.
#[derive(Clone)]
pub struct GrpcConnector {
    pub(crate) tls: Option<tokio_rustls::TlsConnector>,
    pub(crate) refusals: Arc<Refusals>,
}

type Io = Either<TcpStream, Box<tokio_rustls::client::TlsStream<TcpStream>>>;

impl tower_service::Service<http::Uri> for GrpcConnector {
    type Response = TokioIo<WatchedStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let addr = uri
                .authority()
                .map(|a| a.as_str().to_string())
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("no address in '{uri}'"),
                    )
                })?;
            let socket = TcpStream::connect(&addr).await?;
            socket.set_nodelay(true)?;
            let io = match &this.tls {
                None => Either::Left(socket),
                Some(tls) => {
                    let host = uri.host().unwrap_or_default();
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    let name =
                        rustls_pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
                            io::Error::new(
                                io::ErrorKind::InvalidInput,
                                format!("server name '{host}': {e}"),
                            )
                        })?;
                    match tls.connect(name, socket).await {
                        Ok(stream) => Either::Right(Box::new(stream)),
                        Err(e) => return Err(this.refusals.note(&addr, e)),
                    }
                }
            };
            Ok(TokioIo::new(WatchedStream {
                io,
                addr,
                refusals: this.refusals,
                first_read: true,
            }))
        })
    }
}

/// A caller's connection that records why it failed, when no retry can cure it.
pub struct WatchedStream {
    io: Io,
    addr: String,
    refusals: Arc<Refusals>,
    /// Whether nothing was read yet.
    first_read: bool,
}

/// Whether a server's first byte starts a TLS record (an alert or a handshake message).
pub fn starts_tls_record(first: u8) -> bool {
    first == 0x15 || first == 0x16
}

impl AsyncRead for WatchedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(this.refusals.note(&this.addr, e))),
            Poll::Ready(Ok(())) if this.first_read && buf.filled().len() > before => {
                this.first_read = false;
                let plain = matches!(this.io, Either::Left(_));
                if plain && starts_tls_record(buf.filled()[before]) {
                    let why = Misconfigured(format!(
                        "the server at {} speaks TLS and this caller does not: pass --tls-ca \
                         with the cluster's CA certificate (or set SLUICE_TLS_CA)",
                        this.addr
                    ));
                    let e = io::Error::new(io::ErrorKind::InvalidData, why);
                    return Poll::Ready(Err(this.refusals.note(&this.addr, e)));
                }
                this.refusals.clear(&this.addr);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for WatchedStream {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_records_and_http2_frames_are_told_apart_by_their_first_byte() {
        // An alert, a ServerHello's record; an HTTP/2 SETTINGS frame's length byte.
        for (first, tls) in [(0x15, true), (0x16, true), (0x00, false), (b'H', false)] {
            assert_eq!(starts_tls_record(first), tls, "{first:#x}");
        }
    }
}
