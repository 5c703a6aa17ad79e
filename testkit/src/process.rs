//! Running the real `sluice` binary: spawn a server, wait for its `READY <role> <address>` line
//! (a dispatcher's goes on with `peer=<peer address>`, and a node started with
//! `--metrics-listen` names its metrics listener as `metrics=<address>`), SIGSTOP and SIGCONT
//! it, SIGKILL it, restart it with the same arguments (less a dispatcher's first-start flags).

use anyhow::Context;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A `sluice` server process; killed when dropped.
pub struct SluiceProcess {
    bin: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    /// The address from the READY line (a dispatcher's client API).
    pub addr: String,
    /// A dispatcher's Raft peer address (`peer=` on its READY line); `None` for other roles.
    pub peer_addr: Option<String>,
    /// The metrics listener's address (`metrics=` on its READY line), if it has one.
    pub metrics_addr: Option<String>,
}

/// What a READY line announces.
struct Ready {
    addr: String,
    peer_addr: Option<String>,
    metrics_addr: Option<String>,
}

impl SluiceProcess {
    /// Starts `sluice <args>` and waits (up to `timeout`) for its READY line.
    pub fn spawn(bin: &Path, args: &[&str], timeout: Duration) -> anyhow::Result<SluiceProcess> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (child, ready) = start(bin, &args, timeout)?;
        Ok(SluiceProcess {
            bin: bin.to_path_buf(),
            args,
            child: Some(child),
            addr: ready.addr,
            peer_addr: ready.peer_addr,
            metrics_addr: ready.metrics_addr,
        })
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// How the process ended, once it has (reaped here); `None` while it runs or after
    /// [`SluiceProcess::kill`].
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGSTOP: the process stops answering, its ports still accept connections (a long GC
    /// or swap pause, a stalled VM).
    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal("STOP")
    }

    /// SIGCONT after [`SluiceProcess::pause`].
    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, name: &str) -> anyhow::Result<()> {
        let pid = self.pid().context("the process is not running")?;
        let status = Command::new("kill")
            .args(["-s", name, &pid.to_string()])
            .status()
            .context("run kill")?;
        anyhow::ensure!(status.success(), "kill -s {name} {pid} failed");
        Ok(())
    }

    /// SIGKILL, no goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again with the same arguments, except a dispatcher's first-start
    /// flags (`--init`, `--join`): a restarted replica must find its own journal.
    pub fn restart(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.kill();
        self.args.retain(|a| a != "--init" && a != "--join");
        let (child, ready) = start(&self.bin, &self.args, timeout)?;
        self.child = Some(child);
        self.addr = ready.addr;
        self.peer_addr = ready.peer_addr;
        self.metrics_addr = ready.metrics_addr;
        Ok(())
    }
}

impl Drop for SluiceProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn start(bin: &Path, args: &[String], timeout: Duration) -> anyhow::Result<(Child, Ready)> {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawn {} {}", bin.display(), args.join(" ")))?;
    let stdout = child.stdout.take().context("child stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.strip_prefix("READY ") {
                let _ = tx.send(rest.to_string());
            }
        }
    });
    match rx.recv_timeout(timeout) {
        Ok(ready) => {
            let mut fields = ready.split_whitespace().skip(1);
            let addr = fields
                .next()
                .context("READY line without an address")?
                .to_string();
            let extra: Vec<&str> = fields.collect();
            let field = |key: &str| {
                extra
                    .iter()
                    .find_map(|f| f.strip_prefix(key))
                    .map(str::to_string)
            };
            let peer_addr = field("peer=");
            let metrics_addr = field("metrics=");
            Ok((
                child,
                Ready {
                    addr,
                    peer_addr,
                    metrics_addr,
                },
            ))
        }
        Err(_) => {
            let _ = child.kill();
            let status = child.wait().ok();
            anyhow::bail!(
                "{} {} printed no READY line within {timeout:?} (exit: {status:?})",
                bin.display(),
                args.join(" ")
            )
        }
    }
}

/// Runs `sluice <args>` to completion; returns (exit success, stdout, stderr).
pub fn run(bin: &Path, args: &[&str], timeout: Duration) -> anyhow::Result<(bool, String, String)> {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawn {} {}", bin.display(), args.join(" ")))?;
    let (tx, rx) = mpsc::channel();
    let mut stdout = child.stdout.take().context("stdout")?;
    let mut stderr = child.stderr.take().context("stderr")?;
    std::thread::spawn(move || {
        let mut out = String::new();
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
        let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
        let _ = tx.send((out, err));
    });
    match rx.recv_timeout(timeout) {
        Ok((out, err)) => {
            let status = child.wait()?;
            Ok((status.success(), out, err))
        }
        Err(_) => {
            let _ = child.kill();
            anyhow::bail!(
                "{} {} did not finish within {timeout:?}",
                bin.display(),
                args.join(" ")
            )
        }
    }
}
