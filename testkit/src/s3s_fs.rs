//! `S3sFs`: an S3-compatible store for tests and benchmarks, the `s3s-fs` server (the `s3s-fs`
//! crate's program, installed with `cargo install s3s-fs --features binary`) run as a child
//! process on a free loopback port, keeping its objects as files in a temp dir.
//!
//! The program is `$SLUICE_S3S_FS` if set (scripts/test installs it into
//! target/test-tools/s3s-fs and sets it), else `s3s-fs` on the PATH. It is a Rust server on
//! tokio, so it serves loopback reads far faster than moto's Python server (which bounds a
//! benchmark's figure). Requests are signed (it checks SigV4 against the one key pair it is
//! started with). Without the program the start fails, saying how to install it: a test that
//! needs the store never passes by skipping.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The key pair the server accepts (and `env` gives the clients).
pub const ACCESS_KEY: &str = "sluice-test-key-id";
pub const SECRET_KEY: &str = "sluice-test-secret-key";

/// How long the server may take to listen.
const STARTUP: Duration = Duration::from_secs(30);

/// A running `s3s-fs` server; stopped (and its files removed) when dropped.
pub struct S3sFs {
    child: Child,
    port: u16,
    root: tempfile::TempDir,
}

impl S3sFs {
    /// Starts a server, or fails naming what is missing.
    pub fn start() -> anyhow::Result<S3sFs> {
        let program = std::env::var("SLUICE_S3S_FS").unwrap_or_else(|_| "s3s-fs".into());
        let root = tempfile::tempdir()?;
        // The program takes a port, not port 0: a free one is chosen here and released just
        // before the server binds it (another process could take it in between, rarely).
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut child = Command::new(&program)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root.path())
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| {
                format!(
                    "start {program}, the s3s-fs S3 server (install it with `cargo install \
                     s3s-fs --version 0.14.1 --features binary` and set SLUICE_S3S_FS to it, or \
                     run scripts/test, which does both)"
                )
            })?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + STARTUP;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = child.try_wait()? {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                }
                bail!(
                    "{program} exited ({status}) before listening: {}",
                    stderr.trim()
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{program} did not listen on {addr} within {STARTUP:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Drained from now on, so an error it logs never blocks it on a full pipe.
        if let Some(stderr) = child.stderr.take() {
            crate::moto::drain(stderr);
        }
        Ok(S3sFs { child, port, root })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The environment an S3 client needs to use this server, as `(name, value)` pairs: the
    /// endpoint, plain HTTP, a region, and the server's key pair.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        crate::moto::s3_env(self.endpoint(), ACCESS_KEY, SECRET_KEY)
    }

    /// The server's key pair: (access key id, secret access key).
    pub fn key_pair(&self) -> (&'static str, &'static str) {
        (ACCESS_KEY, SECRET_KEY)
    }

    /// Creates `bucket`: s3s-fs keeps a bucket as a directory of its root.
    pub fn create_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        if bucket.is_empty() || bucket.contains(['/', '\\']) || bucket.starts_with('.') {
            bail!("{bucket:?} is not a bucket name");
        }
        std::fs::create_dir(self.root.path().join(bucket))
            .with_context(|| format!("creating bucket {bucket} on s3s-fs"))
    }
}

impl Drop for S3sFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
