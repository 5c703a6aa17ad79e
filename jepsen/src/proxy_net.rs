//! `ProxyNet`: one `Proxy` per directed Raft link i→j. Node i is started with
//! `--raft-routes j=PROXY(i→j)`, so every connection i opens to j passes through it (the replies
//! of j travel back on the same connection), and a partition is a set of links cut.

use crate::proxy::{Proxy, ANY_CALLER};
use crate::schedule::LinkMode;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use tokio_util::sync::CancellationToken;

/// A directed link: connections node `from` opens to node `to`.
pub type Link = (u64, u64);

/// Every directed Raft link's proxy.
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
                if from != to {
                    let proxy = Proxy::start(target, None, cancel.clone()).await?;
                    links.insert((from, to), proxy);
                }
            }
        }
        Ok(ProxyNet { links, cancel })
    }

    /// `--raft-routes` of node `from`: `j=PROXY(from→j)` for every other node.
    pub fn routes_of(&self, from: u64) -> String {
        self.links
            .iter()
            .filter(|((f, _), _)| *f == from)
            .map(|((_, to), p)| format!("{to}={}", p.addr()))
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
            proxy.set(ANY_CALLER, want);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::tests::{echo, roundtrip, unanswered};
    use std::time::Duration;
    use tokio::net::TcpStream;

    #[tokio::test]
    async fn partitions_cut_live_connections_and_heal() {
        let nodes: BTreeMap<u64, SocketAddr> = [(1, echo().await), (2, echo().await)].into();
        let net = ProxyNet::start(&nodes).await.unwrap();
        let addr = net.links[&(1, 2)].addr();
        let mut live = TcpStream::connect(addr).await.unwrap();
        assert_eq!(roundtrip(&mut live).await.unwrap(), b"ping");

        // blackhole: the live connection goes silent
        net.set(&[(1, 2)], LinkMode::Blackhole);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(unanswered(&mut live).await);

        // reset: new connections are refused or closed
        net.set(&[(1, 2)], LinkMode::Reset);
        let mut fresh = TcpStream::connect(addr).await.unwrap();
        assert!(unanswered(&mut fresh).await);

        // the other direction was never cut
        let mut back = TcpStream::connect(net.links[&(2, 1)].addr()).await.unwrap();
        assert_eq!(roundtrip(&mut back).await.unwrap(), b"ping");

        net.heal();
        let mut healed = TcpStream::connect(addr).await.unwrap();
        assert_eq!(roundtrip(&mut healed).await.unwrap(), b"ping");
    }
}
