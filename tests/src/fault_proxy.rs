//! `FaultProxy`: an HTTP/1.1 proxy in front of one server (an object store) that fails some of
//! the requests passing through it: every `fail_every`-th connection is answered `503 Service
//! Unavailable` without reaching the server, and every `cut_every`-th object GET that reaches it
//! has its response cut off after `cut_after` bytes (the connection closed mid-body).
//!
//! Faults are counted per connection, so the client must open one connection per request (for
//! the `object_store` client: `AWS_POOL_MAX_IDLE_PER_HOST=0`); the counts of faults injected are
//! there for a test to check that its faults happened.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Which requests fail.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    /// Every n-th connection is answered 503 (0: none).
    pub fail_every: usize,
    /// Every n-th object GET forwarded has its response cut (0: none).
    pub cut_every: usize,
    /// Response bytes (head included) passed before a cut.
    pub cut_after: usize,
}

pub struct FaultProxy {
    addr: SocketAddr,
    counts: Arc<Counts>,
    stop: CancellationToken,
}

#[derive(Default)]
struct Counts {
    connections: AtomicUsize,
    gets: AtomicUsize,
    failed: AtomicUsize,
    cut: AtomicUsize,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FaultProxy {
    /// A proxy on 127.0.0.1 port 0 in front of `target`.
    pub async fn start(target: SocketAddr, faults: Faults) -> anyhow::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let counts = Arc::new(Counts::default());
        let (accepting, until) = (counts.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = until.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                if let Ok((client, _)) = accepted {
                    let (counts, until) = (accepting.clone(), until.clone());
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = until.cancelled() => {}
                            _ = serve(client, target, faults, counts) => {}
                        }
                    });
                }
            }
        });
        Ok(FaultProxy { addr, counts, stop })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests answered 503.
    pub fn failed(&self) -> usize {
        self.counts.failed.load(Ordering::SeqCst)
    }

    /// Responses cut mid-body.
    pub fn cut(&self) -> usize {
        self.counts.cut.load(Ordering::SeqCst)
    }
}

/// Reads the request's head, then fails it, or forwards the connection (cutting the response
/// when its turn comes).
async fn serve(
    mut client: TcpStream,
    target: SocketAddr,
    faults: Faults,
    counts: Arc<Counts>,
) -> std::io::Result<()> {
    let n = counts.connections.fetch_add(1, Ordering::SeqCst) + 1;
    let mut head = Vec::new();
    let mut buf = [0u8; 8192];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = client.read(&mut buf).await?;
        if read == 0 || head.len() > 1 << 20 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..read]);
    }
    if faults.fail_every > 0 && n.is_multiple_of(faults.fail_every) {
        counts.failed.fetch_add(1, Ordering::SeqCst);
        client
            .write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await?;
        return client.shutdown().await;
    }
    // An object GET: not a listing (`?list-type=`), not a HEAD.
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let object_get = line.starts_with("GET ") && !line.contains('?');
    let cut = object_get && faults.cut_every > 0 && {
        let g = counts.gets.fetch_add(1, Ordering::SeqCst) + 1;
        g.is_multiple_of(faults.cut_every)
    };
    let mut server = TcpStream::connect(target).await?;
    server.write_all(&head).await?;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    };
    let downstream = async move {
        let mut budget = if cut { faults.cut_after } else { usize::MAX };
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let read = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            let pass = read.min(budget);
            if client_write.write_all(&buf[..pass]).await.is_err() {
                break;
            }
            budget -= pass;
            if budget == 0 {
                counts.cut.fetch_add(1, Ordering::SeqCst);
                // Dropping both halves closes the connection mid-body.
                return;
            }
        }
        let _ = client_write.shutdown().await;
    };
    tokio::select! {
        _ = downstream => {}
        _ = async { upstream.await; std::future::pending::<()>().await } => {}
    }
    Ok(())
}
