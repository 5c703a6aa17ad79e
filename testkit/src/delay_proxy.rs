//! `DelayProxy`: a TCP forwarder that delays every byte by a fixed time in each direction, as a
//! link with that one-way latency would (a round trip takes twice it), without limiting the
//! bandwidth: bytes are stamped when they arrive and passed on once their time has come, while
//! later bytes keep arriving.
//!
//! Plain threads, no runtime: an accept thread, and per connection and direction a reading and
//! a writing thread, which end when their sockets close.

use anyhow::Context;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// A proxy on `127.0.0.1`, port chosen by the OS; it stops accepting when dropped.
pub struct DelayProxy {
    addr: SocketAddr,
    stopped: Arc<AtomicBool>,
}

impl DelayProxy {
    /// A proxy forwarding to `target`, each direction delayed by `one_way`.
    pub fn start(target: SocketAddr, one_way: Duration) -> anyhow::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").context("bind a delay proxy")?;
        let addr = listener.local_addr()?;
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = stopped.clone();
        std::thread::Builder::new()
            .name(format!("delay proxy {addr}"))
            .spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Ok(client) = client {
                        let _ = connect(client, target, one_way);
                    }
                }
            })
            .context("start a delay proxy thread")?;
        Ok(DelayProxy { addr, stopped })
    }

    /// The address clients dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn connect(client: TcpStream, target: SocketAddr, one_way: Duration) -> std::io::Result<()> {
    let server = TcpStream::connect(target)?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    pump(client.try_clone()?, server.try_clone()?, one_way);
    pump(server, client, one_way);
    Ok(())
}

/// Forwards `from` to `to`, each chunk once `one_way` passed since it arrived.
fn pump(mut from: TcpStream, mut to: TcpStream, one_way: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => return, // dropping `tx` ends the writer
                Ok(n) => {
                    if tx
                        .send((Instant::now() + one_way, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (due, bytes) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
