//! `Azurite`: an Azure Blob Storage emulator for tests, Microsoft's Azurite (`azurite` from npm)
//! run as a child process on a free loopback port, in memory.
//!
//! The program is `$SLUICE_AZURITE_BLOB` if set (scripts/test installs Azurite with npm and sets
//! it), else `azurite-blob` on the PATH. Containers are created with a request signed with the
//! emulator's well-known account key (by Node, which Azurite runs on). Without Azurite the start
//! fails, saying how to install it: a test that needs the emulator never passes by skipping.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};

/// The emulator's account, as Azurite and `object_store` know it.
pub const ACCOUNT: &str = "devstoreaccount1";

/// Creates container `argv[-1]` on the emulator at port `argv[-2]`: a `PUT ?restype=container`
/// signed with the emulator's well-known key (Shared Key). Prints the HTTP status.
const CREATE_CONTAINER: &str = r#"
const crypto = require("crypto"), http = require("http");
const [port, container] = process.argv.slice(-2);
const account = "devstoreaccount1";
const key = Buffer.from("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==", "base64");
const date = new Date().toUTCString(), version = "2021-08-06";
const toSign = ["PUT", "", "", "", "", "", "", "", "", "", "", "",
  `x-ms-date:${date}`, `x-ms-version:${version}`,
  `/${account}/${account}/${container}\nrestype:container`].join("\n");
const signature = crypto.createHmac("sha256", key).update(toSign, "utf8").digest("base64");
const request = http.request({
  host: "127.0.0.1", port, method: "PUT", path: `/${account}/${container}?restype=container`,
  headers: { "x-ms-date": date, "x-ms-version": version, "Content-Length": 0,
             "Authorization": `SharedKey ${account}:${signature}` },
}, (response) => { console.log(response.statusCode); response.resume(); });
request.on("error", (e) => { console.log(`error ${e.message}`); });
request.end();
"#;

/// A running Azurite blob service; stopped when dropped.
pub struct Azurite {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Azurite {
    /// Starts the emulator, or fails naming what is missing.
    pub fn start() -> anyhow::Result<Azurite> {
        let program =
            std::env::var("SLUICE_AZURITE_BLOB").unwrap_or_else(|_| "azurite-blob".into());
        let dir = tempfile::tempdir()?;
        let mut child = Command::new(&program)
            .args([
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                "0",
                "--inMemoryPersistence",
                "--disableTelemetry",
            ])
            // In memory; anything else it writes (a debug log) lands in a temp dir.
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "start {program}, the Azurite blob emulator (install it with `npm install \
                     azurite` and set SLUICE_AZURITE_BLOB to its node_modules/.bin/azurite-blob, \
                     or run scripts/test, which does both)"
                )
            })?;
        let stdout = child.stdout.take().context("Azurite's stdout")?;
        // Its lines until it says where it listens; the rest drained so it never blocks.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(port) = line
                    .split("successfully listens on http://127.0.0.1:")
                    .nth(1)
                    .and_then(|p| p.trim().parse::<u16>().ok())
                {
                    let _ = tx.send(port);
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(port) => Ok(Azurite {
                child,
                port,
                _dir: dir,
            }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("Azurite ({program}) did not say where it listens within 60 s")
            }
        }
    }

    /// `http://127.0.0.1:PORT`, the blob service.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment an Azure client needs to use this emulator, as `(name, value)` pairs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
            ("AZURITE_BLOB_STORAGE_URL", self.endpoint()),
            ("AZURE_STORAGE_ACCOUNT_NAME", ACCOUNT.into()),
        ]
    }

    /// Creates `container` (with `node`, which Azurite needs anyway).
    pub fn create_container(&self, container: &str) -> anyhow::Result<()> {
        let output = Command::new("node")
            .args(["-e", CREATE_CONTAINER, &self.port.to_string(), container])
            .output()
            .context("run node to create an Azurite container")?;
        let status = String::from_utf8_lossy(&output.stdout);
        if status.trim() != "201" {
            bail!(
                "creating container {container} on Azurite: {} {}",
                status.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
