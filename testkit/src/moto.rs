//! `MotoServer`: an S3-compatible store for tests, moto's server (the `moto[server]` package
//! from PyPI) run as a child process on a free loopback port.
//!
//! The interpreter is `$SLUICE_MOTO_PYTHON` if set (scripts/test installs moto into a virtual
//! environment of its own and sets it), else `python3`. Without moto the start fails, saying
//! how to install it: a test that needs the store never passes by skipping.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};

use anyhow::{bail, Context};

/// Starts moto's threaded server on port 0, prints the port, and stops when stdin closes (so a
/// test that dies leaves no server behind).
const SCRIPT: &str = r#"
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print("PORT", server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"#;

/// A running moto server; stopped when dropped.
pub struct MotoServer {
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
}

impl MotoServer {
    /// Starts a server, or fails naming what is missing.
    pub fn start() -> anyhow::Result<MotoServer> {
        let python = std::env::var("SLUICE_MOTO_PYTHON").unwrap_or_else(|_| "python3".into());
        let mut child = Command::new(&python)
            .args(["-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {python} for the moto S3 server"))?;
        let stdout = child.stdout.take().context("moto's stdout")?;
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let port = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse::<u16>().ok());
        let Some(port) = port else {
            let _ = child.kill();
            let output = child.wait_with_output()?;
            bail!(
                "the moto S3 server did not start with {python} (install it with \
                 `pip install 'moto[server]'` and set SLUICE_MOTO_PYTHON to that Python, or run \
                 scripts/test, which does both): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        };
        // Drained from now on: the server logs requests, and would block on a full pipe.
        drain(stdout);
        if let Some(stderr) = child.stderr.take() {
            drain(stderr);
        }
        let stdin = child.stdin.take();
        Ok(MotoServer { child, stdin, port })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The environment an S3 client needs to use this server, as `(name, value)` pairs: the
    /// endpoint, plain HTTP, a region, and moto's accepted test credentials.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        s3_env(self.endpoint(), "testing-key-id", "testing-secret-key")
    }

    /// Creates `bucket` (moto answers S3's CreateBucket with a plain PUT of the bucket).
    pub fn create_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut status = String::new();
        BufReader::new(stream).read_line(&mut status)?;
        if !status.contains(" 200 ") {
            bail!("creating bucket {bucket} on moto: {}", status.trim());
        }
        Ok(())
    }
}

/// Reads `from` to its end on a thread of its own, discarding what it reads.
pub(crate) fn drain(mut from: impl std::io::Read + Send + 'static) {
    std::thread::spawn(move || std::io::copy(&mut from, &mut std::io::sink()));
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        // Closing stdin stops it; a kill makes sure.
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What an S3 client needs to use a local S3 server at `endpoint` (plain HTTP, a region) with
/// the key pair `key_id` and `secret`, as `(name, value)` pairs.
pub(crate) fn s3_env(endpoint: String, key_id: &str, secret: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT", endpoint),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID", key_id.into()),
        ("AWS_SECRET_ACCESS_KEY", secret.into()),
        // Never the instance metadata service: off EC2 it only times out.
        ("AWS_EC2_METADATA_DISABLED", "true".into()),
    ]
}
