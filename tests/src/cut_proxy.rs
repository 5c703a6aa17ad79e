//! `CutProxy`: a TCP proxy in front of one server (a worker, for its readers), whose live
//! connections a test can cut at any moment while the server lives on. New connections are
//! always accepted and forwarded, so a client that reconnects after a cut gets through.
//!
//! A cut closes both sides of every connection then open, with whatever bytes were in flight
//! through the proxy lost: what a reader sees when its link to a worker breaks. `cut_after`
//! cuts once the server sent a given number of bytes more, so the cut falls while the server
//! is sending (mid-message, as a rule), and the bytes read past that are dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct CutProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Stops the accept loop (and every connection) when the proxy is dropped.
    stop: CancellationToken,
}

struct Shared {
    /// Where connections go; until it is set, connections are closed at once.
    target: OnceLock<SocketAddr>,
    /// Cancelled by the next cut: every connection open now holds this one. A std mutex: a
    /// swap under it, never held across `.await`.
    generation: Mutex<CancellationToken>,
    live: AtomicUsize,
    opened: AtomicUsize,
    /// Bytes from the server still passed before the armed cut; `usize::MAX` when none is.
    budget: AtomicUsize,
    cuts: AtomicUsize,
}

impl Shared {
    /// Of `n` bytes read from the server, how many pass: fewer when an armed cut falls in them.
    fn pass(&self, n: usize) -> usize {
        let mut passed = n;
        let _ = self
            .budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                if left == usize::MAX {
                    passed = n;
                    return None;
                }
                passed = n.min(left);
                Some(left - passed)
            });
        passed
    }

    /// Cuts every connection open now; returns how many there were.
    fn cut(&self, stop: &CancellationToken) -> usize {
        let live = self.live.load(Ordering::SeqCst);
        let fresh = stop.child_token();
        let old = std::mem::replace(
            &mut *self.generation.lock().expect("proxy lock poisoned"),
            fresh,
        );
        old.cancel();
        self.cuts.fetch_add(1, Ordering::SeqCst);
        live
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl CutProxy {
    /// A proxy on 127.0.0.1 port 0, forwarding nowhere yet (see `forward_to`).
    pub async fn start() -> anyhow::Result<CutProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            target: OnceLock::new(),
            generation: Mutex::new(stop.child_token()),
            live: AtomicUsize::new(0),
            opened: AtomicUsize::new(0),
            budget: AtomicUsize::new(usize::MAX),
            cuts: AtomicUsize::new(0),
        });
        let (accepting, until) = (shared.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = until.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                if let Ok((client, _)) = accepted {
                    tokio::spawn(forward(client, accepting.clone(), until.clone()));
                }
            }
        });
        Ok(CutProxy { addr, shared, stop })
    }

    /// The address clients dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Forwards connections to `target` from now on (set once).
    pub fn forward_to(&self, target: SocketAddr) {
        let _ = self.shared.target.set(target);
    }

    /// Cuts every connection open now; returns how many there were.
    pub fn cut(&self) -> usize {
        self.shared.cut(&self.stop)
    }

    /// Cuts every connection open once the server sent `bytes` more (through any of them).
    pub fn cut_after(&self, bytes: usize) {
        self.shared.budget.store(bytes, Ordering::SeqCst);
    }

    /// Cuts made so far (by `cut`, or armed by `cut_after` and fallen).
    pub fn cuts(&self) -> usize {
        self.shared.cuts.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn live(&self) -> usize {
        self.shared.live.load(Ordering::SeqCst)
    }

    /// Connections forwarded so far.
    pub fn opened(&self) -> usize {
        self.shared.opened.load(Ordering::SeqCst)
    }
}

/// Forwards one connection until either side closes it or a cut.
async fn forward(mut client: TcpStream, shared: Arc<Shared>, stop: CancellationToken) {
    let Some(target) = shared.target.get().copied() else {
        return;
    };
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let cut = shared
        .generation
        .lock()
        .expect("proxy lock poisoned")
        .clone();
    shared.opened.fetch_add(1, Ordering::SeqCst);
    shared.live.fetch_add(1, Ordering::SeqCst);
    let (mut from_client, mut to_client) = client.split();
    let (mut from_server, mut to_server) = server.split();
    let up = tokio::io::copy(&mut from_client, &mut to_server);
    let down = async {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let n = from_server.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            let passed = shared.pass(n);
            to_client.write_all(&buf[..passed]).await?;
            if passed < n {
                // The armed cut falls here: the rest of what was read is lost with it.
                shared.budget.store(usize::MAX, Ordering::SeqCst);
                shared.cut(&stop);
                return Ok(());
            }
        }
    };
    tokio::select! {
        _ = cut.cancelled() => {}
        _ = up => {}
        _ = down => {}
    }
    shared.live.fetch_sub(1, Ordering::SeqCst);
}
