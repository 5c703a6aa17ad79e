//! `ProxyNet`: one in-process TCP proxy per directed Raft link i→j. Node i is started with
//! `--raft-routes j=PROXY(i→j)`, so every connection i opens to j passes through it (the replies
//! of j travel back on the same connection).
//!
//! Modes: `pass` forwards; `blackhole` accepts, reads and drops (a silent partition);
//! `reset` closes at once with a TCP reset. A mode change also cuts live connections: tonic
//! keeps one HTTP/2 connection per peer open, so a partition that only refused new connections
//! would never take effect. A live connection becomes a blackhole or is reset, and after a heal
//! every connection opened during the partition is closed, so nodes reconnect cleanly.

use crate::schedule::LinkMode;
use anyhow::Context;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// A directed link: connections node `from` opens to node `to`.
pub type Link = (u64, u64);

struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<LinkMode>,
}

/// Every directed link's proxy.
pub struct ProxyNet {
    links: BTreeMap<Link, Proxy>,
    cancel: CancellationToken,
}

impl ProxyNet {
    /// Binds a proxy for every directed link between `nodes` (id → real peer address).
    pub async fn start(nodes: &BTreeMap<u64, SocketAddr>) -> anyhow::Result<ProxyNet> {
        let cancel = CancellationToken::new();
        let mut links = BTreeMap::new();
        for &from in nodes.keys() {
            for (&to, &target) in nodes {
                if from == to {
                    continue;
                }
                let listener = TcpListener::bind("127.0.0.1:0")
                    .await
                    .context("bind a link proxy")?;
                let addr = listener.local_addr()?;
                let (mode, mode_rx) = watch::channel(LinkMode::Pass);
                tokio::spawn(accept_loop(listener, target, mode_rx, cancel.clone()));
                links.insert((from, to), Proxy { addr, mode });
            }
        }
        Ok(ProxyNet { links, cancel })
    }

    /// `--raft-routes` of node `from`: `j=PROXY(from→j)` for every other node.
    pub fn routes_of(&self, from: u64) -> String {
        self.links
            .iter()
            .filter(|((f, _), _)| *f == from)
            .map(|((_, to), p)| format!("{to}={}", p.addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Sets every listed link to `mode`, and every other link to pass.
    pub fn set(&self, cut: &[Link], mode: LinkMode) {
        for (link, proxy) in &self.links {
            let want = if cut.contains(link) {
                mode
            } else {
                LinkMode::Pass
            };
            proxy.mode.send_if_modified(|m| {
                let changed = *m != want;
                *m = want;
                changed
            });
        }
    }

    /// Every link back to pass.
    pub fn heal(&self) {
        self.set(&[], LinkMode::Pass);
    }

    pub fn links(&self) -> impl Iterator<Item = Link> + '_ {
        self.links.keys().copied()
    }
}

impl Drop for ProxyNet {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    mode: watch::Receiver<LinkMode>,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let mode = mode.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = serve(stream, target, mode) => {}
            }
        });
    }
}

/// One accepted connection, until it closes or the link's mode changes.
async fn serve(mut client: TcpStream, target: SocketAddr, mut mode: watch::Receiver<LinkMode>) {
    let current = *mode.borrow_and_update();
    match current {
        LinkMode::Reset => return reset(client),
        LinkMode::Blackhole => return blackhole(client, mode).await,
        LinkMode::Pass => {}
    }
    let connect = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(target)).await;
    let Ok(Ok(mut server)) = connect else {
        // The peer is down: refuse, as the peer itself would.
        return reset(client);
    };
    let _ = server.set_nodelay(true);
    let next = loop {
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = *mode.borrow_and_update();
                if now != LinkMode::Pass {
                    break now;
                }
            }
        }
    };
    debug!(%target, mode = ?next, "cutting a live connection");
    if next == LinkMode::Reset {
        reset(server);
        reset(client);
    } else {
        drop(server);
        blackhole(client, mode).await;
    }
}

/// Reads and drops until the link's mode changes, then closes with a reset.
async fn blackhole(mut client: TcpStream, mut mode: watch::Receiver<LinkMode>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = client.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            changed = mode.changed() => {
                if changed.is_err() || *mode.borrow_and_update() != LinkMode::Blackhole {
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
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// An echo server; returns its address.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut buf))
            .await
            .map_err(|_| std::io::Error::other("timed out"))??;
        Ok(buf.to_vec())
    }

    #[tokio::test]
    async fn partitions_cut_live_connections_and_heal() {
        let nodes: BTreeMap<u64, SocketAddr> = [(1, echo().await), (2, echo().await)].into();
        let net = ProxyNet::start(&nodes).await.unwrap();
        let addr = net.links[&(1, 2)].addr;
        let mut live = TcpStream::connect(addr).await.unwrap();
        assert_eq!(roundtrip(&mut live).await.unwrap(), b"ping");

        // blackhole: the live connection goes silent
        net.set(&[(1, 2)], LinkMode::Blackhole);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(roundtrip(&mut live).await.is_err());

        // reset: new connections are refused or closed
        net.set(&[(1, 2)], LinkMode::Reset);
        let mut fresh = TcpStream::connect(addr).await.unwrap();
        assert!(roundtrip(&mut fresh).await.is_err());

        // the other direction was never cut
        let mut back = TcpStream::connect(net.links[&(2, 1)].addr).await.unwrap();
        assert_eq!(roundtrip(&mut back).await.unwrap(), b"ping");

        net.heal();
        let mut healed = TcpStream::connect(addr).await.unwrap();
        assert_eq!(roundtrip(&mut healed).await.unwrap(), b"ping");
    }
}
