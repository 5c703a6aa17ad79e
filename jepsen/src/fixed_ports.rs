//! Ports for the processes that keep their address across restarts (dispatchers, workers).
//!
//! A port taken with `bind(0)` and released comes from the ephemeral range, where the kernel also
//! draws the local ports of outgoing connections and every later `bind(0)` (the proxies, other
//! programs): between the probe and the process's bind, or while a killed process is down,
//! someone else may take it. So these ports are drawn below the ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`), where the kernel hands out nothing by itself, and
//! each is checked free by binding it once.

use anyhow::Context;
use rand::Rng;
use std::net::{SocketAddr, TcpListener};

/// The lowest port of the range drawn from.
const LOWEST: u16 = 10_000;

/// The first port of the kernel's ephemeral range (32768 if it cannot be read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// `n` distinct free loopback addresses, below the ephemeral range where it leaves room,
/// else from `bind(0)`.
pub fn pick(n: usize) -> anyhow::Result<Vec<SocketAddr>> {
    let top = ephemeral_start();
    let mut rng = rand::rng();
    // Held until all are chosen, so the same port is not drawn twice.
    let mut held: Vec<TcpListener> = Vec::new();
    let mut tries = 0;
    while held.len() < n {
        tries += 1;
        let listener = if top > LOWEST + 1000 && tries < 1000 {
            match TcpListener::bind(("127.0.0.1", rng.random_range(LOWEST..top))) {
                Ok(listener) => listener,
                Err(_) => continue,
            }
        } else {
            TcpListener::bind("127.0.0.1:0").context("probe a free port")?
        };
        held.push(listener);
    }
    held.iter()
        .map(|l| l.local_addr().context("probed port"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picked_ports_are_distinct_free_and_below_the_ephemeral_range() {
        let addrs = pick(6).unwrap();
        let mut ports: Vec<u16> = addrs.iter().map(|a| a.port()).collect();
        ports.sort();
        ports.dedup();
        assert_eq!(ports.len(), 6);
        for addr in addrs {
            assert!(addr.port() < ephemeral_start(), "{addr}");
            TcpListener::bind(addr).expect("still free");
        }
    }
}
