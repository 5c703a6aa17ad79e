//! `TcpProxy`: a TCP forwarder in front of one port, which a test turns into a blackhole and
//! back, to cut a process off the network without stopping it.
//!
//! A blackhole accepts connections and reads what arrives, and forwards nothing either way: a
//! silent partition, in which the peer's port looks alive and nothing is answered. Turning it on
//! also silences live connections (tonic keeps one HTTP/2 connection per peer open, so a
//! partition that only refused new ones would never take effect). A connection that lost bytes
//! is closed once the proxy passes again, since its streams are cut mid-message; the peers then
//! reconnect cleanly.
//!
//! Plain threads, no runtime, so the synchronous CLI tests and the async bench use it alike: an
//! accept thread, and two pumping threads per connection, which end when their sockets close.
//! The target may be set after the proxy is bound, for a process that must be told the proxy's
//! address before it binds its own port; until then connections are closed at once.

use anyhow::Context;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long the proxy waits to connect to its target.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

struct Shared {
    /// A std mutex: held only to read or set the address.
    target: Mutex<Option<SocketAddr>>,
    blackhole: AtomicBool,
    /// Set when the proxy is dropped: the accept thread ends.
    stopped: AtomicBool,
}

/// A proxy on `127.0.0.1`, port chosen by the OS; it stops accepting when dropped.
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl TcpProxy {
    /// A proxy whose target is set later ([`TcpProxy::set_target`]).
    pub fn bind() -> anyhow::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").context("bind a proxy")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: Mutex::new(None),
            blackhole: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        let accepting = shared.clone();
        std::thread::Builder::new()
            .name(format!("proxy {addr}"))
            .spawn(move || accept_loop(listener, accepting))
            .context("start a proxy thread")?;
        Ok(TcpProxy { addr, shared })
    }

    /// A proxy forwarding to `target` (`host:port`).
    pub fn to(target: &str) -> anyhow::Result<TcpProxy> {
        let proxy = Self::bind()?;
        proxy.set_target(target)?;
        Ok(proxy)
    }

    /// The proxy's address, what the proxied process's callers dial.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Forwards new connections to `target` (`host:port`).
    pub fn set_target(&self, target: &str) -> anyhow::Result<()> {
        let target: SocketAddr = target
            .parse()
            .with_context(|| format!("proxy target '{target}' is not an IP address and port"))?;
        *self.shared.target.lock().expect("proxy lock poisoned") = Some(target);
        Ok(())
    }

    /// Silences every connection, live and new (`true`), or lets traffic through again.
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.store(on, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Wakes the accept thread, which sees `stopped` and ends.
        let _ = TcpStream::connect_timeout(&self.addr, CONNECT_TIMEOUT);
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = incoming else { continue };
        let _ = client.set_nodelay(true);
        if shared.blackhole.load(Ordering::SeqCst) {
            // Accepted and never answered; closed once the proxy passes again.
            spawn_pump(client, None, shared.clone());
            continue;
        }
        let target = *shared.target.lock().expect("proxy lock poisoned");
        let Some(upstream) =
            target.and_then(|t| TcpStream::connect_timeout(&t, CONNECT_TIMEOUT).ok())
        else {
            continue;
        };
        let _ = upstream.set_nodelay(true);
        let (Ok(client_reader), Ok(upstream_reader)) = (client.try_clone(), upstream.try_clone())
        else {
            continue;
        };
        spawn_pump(client_reader, Some(upstream), shared.clone());
        spawn_pump(upstream_reader, Some(client), shared.clone());
    }
}

fn spawn_pump(from: TcpStream, to: Option<TcpStream>, shared: Arc<Shared>) {
    let _ = std::thread::Builder::new()
        .name("proxy pump".into())
        .spawn(move || pump(from, to, &shared));
}

/// Copies `from` to `to` (reads and drops while blackholed); a connection that dropped bytes,
/// or one accepted while blackholed (no `to`), is closed when traffic passes again.
fn pump(mut from: TcpStream, mut to: Option<TcpStream>, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut dropped = false;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if shared.blackhole.load(Ordering::SeqCst) {
            dropped = true;
            continue;
        }
        if dropped {
            break;
        }
        let Some(writer) = to.as_mut() else { break };
        if writer.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    if let Some(to) = to {
        let _ = to.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    /// An echo server on port 0: each line comes back.
    fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut writer = stream.try_clone().expect("clone");
                    for line in std::io::BufReader::new(stream).lines() {
                        let Ok(line) = line else { return };
                        if writeln!(writer, "{line}").is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn ask(stream: &mut TcpStream, line: &str) -> std::io::Result<String> {
        writeln!(stream, "{line}")?;
        let mut answer = String::new();
        std::io::BufReader::new(stream.try_clone()?).read_line(&mut answer)?;
        Ok(answer.trim_end().to_string())
    }

    #[test]
    fn a_blackhole_silences_a_live_connection_which_closes_when_traffic_passes_again() {
        let proxy = TcpProxy::to(&echo().to_string()).expect("a proxy");
        let mut live = TcpStream::connect(proxy.addr()).expect("connect");
        live.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("a read timeout");
        assert_eq!(ask(&mut live, "one").expect("an echo"), "one");

        proxy.blackhole(true);
        assert!(ask(&mut live, "two").is_err(), "nothing comes back");
        let mut new = TcpStream::connect(proxy.addr()).expect("a blackhole accepts");
        new.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("a read timeout");
        assert!(ask(&mut new, "three").is_err(), "nothing comes back");

        proxy.blackhole(false);
        // The live connection lost bytes: its next message closes it, and a new one is clean.
        live.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        assert!(matches!(ask(&mut live, "four").as_deref(), Ok("") | Err(_)));
        let mut fresh = TcpStream::connect(proxy.addr()).expect("connect");
        fresh
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        assert_eq!(ask(&mut fresh, "five").expect("an echo"), "five");
    }
}
