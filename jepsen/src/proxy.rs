//! `Proxy`: one in-process TCP proxy in front of one address, whose connections the nemesis can
//! cut (see `proxy_net` and `worker_net` for where they stand).
//!
//! A proxy may tell its callers apart (a `Classifier` names the caller of each accepted
//! connection); each caller has its own mode, and callers without one pass. Modes: `pass`
//! forwards; `blackhole` accepts, reads and drops (a silent partition); `reset` closes at once
//! with a TCP reset; `drop-requests` and `drop-replies` forward one direction and silently drop
//! the other (a one-way partition of a connection that only one side opens).
//!
//! A mode change also cuts live connections: tonic keeps one HTTP/2 connection per peer open, so
//! a partition that only refused new connections would never take effect. A live connection
//! becomes a blackhole, is reset, or starts dropping one direction; a connection that lost bytes
//! is reset when its caller's mode returns to pass (its byte stream is broken), so callers
//! reconnect cleanly.

use crate::schedule::LinkMode;
use anyhow::Context;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Names the caller of an accepted connection from its `(peer, local)` addresses.
pub type Classifier = Arc<dyn Fn(SocketAddr, SocketAddr) -> String + Send + Sync>;

/// The caller name of a proxy that does not tell callers apart.
pub const ANY_CALLER: &str = "";

/// Each caller's mode; a caller not listed passes.
type Modes = BTreeMap<String, LinkMode>;

fn mode_of(modes: &Modes, caller: &str) -> LinkMode {
    modes.get(caller).copied().unwrap_or(LinkMode::Pass)
}

/// One listener forwarding to one target.
pub struct Proxy {
    addr: SocketAddr,
    modes: watch::Sender<Modes>,
}

impl Proxy {
    /// Binds a proxy to `target` on a free loopback port; it runs until `cancel`.
    pub async fn start(
        target: SocketAddr,
        classifier: Option<Classifier>,
        cancel: CancellationToken,
    ) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind a proxy")?;
        let addr = listener.local_addr()?;
        let (modes, modes_rx) = watch::channel(Modes::new());
        tokio::spawn(accept_loop(listener, target, classifier, modes_rx, cancel));
        Ok(Proxy { addr, modes })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets `caller`'s mode (`ANY_CALLER` for a proxy without a classifier).
    pub fn set(&self, caller: &str, mode: LinkMode) {
        self.modes.send_if_modified(|modes| {
            let before = mode_of(modes, caller);
            if mode == LinkMode::Pass {
                modes.remove(caller);
            } else {
                modes.insert(caller.to_string(), mode);
            }
            before != mode
        });
    }

    /// Every caller back to pass.
    pub fn heal(&self) {
        self.modes.send_if_modified(|modes| {
            let changed = !modes.is_empty();
            modes.clear();
            changed
        });
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    classifier: Option<Classifier>,
    modes: watch::Receiver<Modes>,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let caller = match (&classifier, stream.local_addr()) {
            (Some(classify), Ok(local)) => classify(peer, local),
            _ => ANY_CALLER.to_string(),
        };
        let modes = modes.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = serve(stream, target, caller, modes) => {}
            }
        });
    }
}

/// One accepted connection, until it closes or its caller's mode cuts it.
async fn serve(
    mut client: TcpStream,
    target: SocketAddr,
    caller: String,
    mut modes: watch::Receiver<Modes>,
) {
    let current = mode_of(&modes.borrow_and_update(), &caller);
    match current {
        LinkMode::Reset => return reset(client),
        LinkMode::Blackhole => return blackhole(client, &caller, modes).await,
        LinkMode::Pass | LinkMode::DropRequests | LinkMode::DropReplies => {}
    }
    let connect = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(target)).await;
    let Ok(Ok(mut server)) = connect else {
        // The target is down: refuse, as the target itself would.
        return reset(client);
    };
    let _ = server.set_nodelay(true);
    let next = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let requests = pump(
            client_read,
            server_write,
            &caller,
            &modes,
            LinkMode::DropRequests,
        );
        let replies = pump(
            server_read,
            client_write,
            &caller,
            &modes,
            LinkMode::DropReplies,
        );
        let mut watch = modes.clone();
        let cut = cut_when(&mut watch, &caller, current != LinkMode::Pass);
        tokio::select! {
            _ = requests => return,
            _ = replies => return,
            next = cut => next,
        }
    };
    debug!(%target, %caller, mode = ?next, "cutting a live connection");
    match next {
        LinkMode::Blackhole => {
            drop(server);
            blackhole(client, &caller, modes).await;
        }
        _ => {
            reset(server);
            reset(client);
        }
    }
}

/// Copies `from` to `to`, dropping what it reads while `caller`'s mode is `dropping`. Ends at
/// end of stream or on an error of either side.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    caller: &str,
    modes: &watch::Receiver<Modes>,
    dropping: LinkMode,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if mode_of(&modes.borrow(), caller) == dropping {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Waits until `caller`'s mode makes a live connection end: reset or blackhole, or pass after
/// bytes were dropped (`broken`). Returns that mode (reset for a broken stream).
async fn cut_when(modes: &mut watch::Receiver<Modes>, caller: &str, mut broken: bool) -> LinkMode {
    loop {
        if modes.changed().await.is_err() {
            return LinkMode::Reset;
        }
        match mode_of(&modes.borrow_and_update(), caller) {
            LinkMode::Pass if broken => return LinkMode::Reset,
            LinkMode::Pass => {}
            LinkMode::DropRequests | LinkMode::DropReplies => broken = true,
            cut @ (LinkMode::Reset | LinkMode::Blackhole) => return cut,
        }
    }
}

/// Reads and drops until `caller`'s mode changes, then closes with a reset.
async fn blackhole(mut client: TcpStream, caller: &str, mut modes: watch::Receiver<Modes>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = client.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            changed = modes.changed() => {
                let still = mode_of(&modes.borrow_and_update(), caller) == LinkMode::Blackhole;
                if changed.is_err() || !still {
                    return reset(client);
                }
            }
        }
    }
}

/// Closes with a TCP reset (linger 0) instead of a clean FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
pub(crate) mod tests;
