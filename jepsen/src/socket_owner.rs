//! Which local process opened a loopback TCP connection, from `/proc` (Linux): the socket whose
//! local address is the connection's peer and whose remote address is the listener's side is
//! found in `/proc/net/tcp`, and its inode among the open files of the candidate processes.
//!
//! The dispatchers' front proxies use it to tell worker processes apart: a leader hint names
//! one client address for every caller, so per-caller proxies could not stand in front of a
//! dispatcher, but one proxy can ask who is calling.

use std::net::SocketAddr;

/// The pid among `pids` that owns the client end of the loopback connection `peer` → `local`.
pub fn owner(peer: SocketAddr, local: SocketAddr, pids: &[u32]) -> Option<u32> {
    if pids.is_empty() {
        return None;
    }
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|path| {
            let table = std::fs::read_to_string(path).ok()?;
            inode_of(&table, peer, local)
        })?;
    let wanted = format!("socket:[{inode}]");
    pids.iter().copied().find(|pid| {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .map(|target| target.as_os_str() == wanted.as_str())
                .unwrap_or(false)
        })
    })
}

/// `/proc/net/tcp*`'s spelling of an address: the IP as the kernel's 32-bit words in host order
/// (IPv4-mapped for IPv6), and the port, in upper-case hex.
fn proc_addr(addr: SocketAddr, v6: bool) -> String {
    let port = addr.port();
    match (addr, v6) {
        (SocketAddr::V4(a), false) => {
            format!("{:08X}:{port:04X}", u32::from_ne_bytes(a.ip().octets()))
        }
        (a, _) => {
            let ip = match a {
                SocketAddr::V4(a) => a.ip().to_ipv6_mapped(),
                SocketAddr::V6(a) => *a.ip(),
            };
            let words: String = ip
                .octets()
                .chunks(4)
                .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
                .collect();
            format!("{words}:{port:04X}")
        }
    }
}

/// The inode of the socket `local = peer, remote = listener` in one `/proc/net/tcp*` table.
fn inode_of(table: &str, peer: SocketAddr, listener: SocketAddr) -> Option<u64> {
    // The first line is the column header.
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let v6 = fields.get(1)?.len() > 13;
        let matches =
            fields[1] == proc_addr(peer, v6) && fields.get(2)? == &proc_addr(listener, v6);
        matches
            .then(|| fields.get(9)?.parse().ok())
            .flatten()
            .filter(|inode| *inode != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_connection_is_owned_by_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        let me = std::process::id();
        let local = accepted.local_addr().unwrap();
        assert_eq!(owner(peer, local, &[me]), Some(me));
        assert_eq!(owner(peer, local, &[]), None);
        // The server's end is not the caller: swapping the ends finds no socket of a caller.
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(owner(other.local_addr().unwrap(), local, &[me]), None);
        drop(client);
    }
}
