//! A minimal HTTP/1.1 GET for the tests of the metrics listener: one request per connection,
//! the whole response read to the server's close. Blocking (the CLI tests are synchronous);
//! async tests call it on a blocking thread.

use anyhow::Context;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// `GET path` from `addr`; the status code and the body.
pub fn get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .with_context(|| format!("read GET {path} from {addr}"))?;
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status line in {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Like [`get`], from async code (on a blocking thread).
pub async fn get_async(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let (addr, path) = (addr.to_string(), path.to_string());
    tokio::task::spawn_blocking(move || get(&addr, &path)).await?
}
