//! `PlainConnector`: the plain-TCP connections of a caller without TLS, which notice a server
//! that answers in TLS.
//!
//! Without it, plain HTTP/2 sent to a TLS listener draws a TLS alert, which HTTP/2 reads as a
//! malformed frame: "h2 protocol error", indistinguishable from a broken connection, so the
//! caller retried forever. The first byte a server sends tells: an HTTP/2 server's first frame
//! (its SETTINGS, a few bytes long) starts with a zero length byte, a TLS record with its
//! content type, 0x15 (an alert) or 0x16 (a handshake). On such a byte the connection fails
//! with a [`Misconfigured`] error naming the server and the missing flag.

use crate::connect_failure::Misconfigured;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Dials `host:port` of the endpoint's URI over plain TCP (no Nagle delay), watching the first
/// byte the server sends.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainConnector;

impl tower_service::Service<http::Uri> for PlainConnector {
    type Response = TokioIo<TlsSniffer>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let addr = uri.authority().map(|a| a.as_str().to_string());
        Box::pin(async move {
            let addr = addr.ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("no address in '{uri}'"))
            })?;
            let socket = TcpStream::connect(&addr).await?;
            socket.set_nodelay(true)?;
            Ok(TokioIo::new(TlsSniffer {
                socket,
                addr,
                checked: false,
            }))
        })
    }
}

/// A plain-TCP connection that fails at the server's first byte if it starts a TLS record.
#[derive(Debug)]
pub struct TlsSniffer {
    socket: TcpStream,
    addr: String,
    /// Whether the first byte was looked at.
    checked: bool,
}

/// Whether a server's first byte starts a TLS record (an alert or a handshake message).
pub fn starts_tls_record(first: u8) -> bool {
    first == 0x15 || first == 0x16
}

impl AsyncRead for TlsSniffer {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.socket).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            if !this.checked && buf.filled().len() > before {
                this.checked = true;
                if starts_tls_record(buf.filled()[before]) {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        Misconfigured(format!(
                            "the server at {} speaks TLS and this caller does not: pass \
                             --tls-ca with the cluster's CA certificate (or set SLUICE_TLS_CA)",
                            this.addr
                        )),
                    )));
                }
            }
        }
        polled
    }
}

impl AsyncWrite for TlsSniffer {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().socket).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().socket).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_shutdown(cx)
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
