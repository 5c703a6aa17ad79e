//! Multi-process tests of the `sluice` binary: dispatchers, workers and readers as separate
//! processes on loopback, driven only through the command line, as a user drives them.

mod bad_input;
mod data_dir_identity;
mod data_roots;
mod deploy_manifests;
mod exactly_once;
mod failover;
mod infinite_epochs;
mod membership;
mod memory;
mod object_store;
mod observability;
mod parse_example;
mod pipeline_limits;
mod python_workers;
mod reader_state;
mod reading;
mod security;
mod silent_leader;
mod single_dispatcher;
mod static_sharding;
mod target_workers;
mod worker_budgets;
mod worker_security;

use sluice_tests::process::{run, SluiceProcess};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");
pub const STARTUP: Duration = Duration::from_secs(30);

pub fn bin() -> &'static Path {
    Path::new(BIN)
}

/// `sluice <args>` to completion within a minute: (success, stdout, stderr).
pub fn sluice(args: &[&str]) -> (bool, String, String) {
    run(bin(), args, Duration::from_secs(60)).expect("sluice ran")
}

/// Parses JSON lines.
pub fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

pub fn sorted_ints(values: &[serde_json::Value]) -> Vec<i64> {
    let mut out: Vec<i64> = values
        .iter()
        .map(|v| v.as_i64().expect("an integer"))
        .collect();
    out.sort_unstable();
    out
}

/// Starts a new one-node dispatcher (`--init`) with its data dir under `dir`, and `extra`
/// arguments.
pub fn dispatcher(dir: &std::path::Path, extra: &[&str]) -> SluiceProcess {
    let data_dir = dir.join("dispatcher");
    let mut args = vec![
        "dispatcher",
        "--init",
        "--data-dir",
        data_dir.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    SluiceProcess::spawn(bin(), &args, STARTUP).expect("dispatcher started")
}

/// Starts workers registered with `dispatcher`.
pub fn workers(dispatcher: &str, n: usize) -> Vec<SluiceProcess> {
    workers_with(dispatcher, n, &[])
}

/// Starts workers registered with `dispatcher`, with `extra` arguments.
pub fn workers_with(dispatcher: &str, n: usize, extra: &[&str]) -> Vec<SluiceProcess> {
    (0..n)
        .map(|_| {
            let mut args = vec![
                "worker",
                "--dispatcher",
                dispatcher,
                "--listen",
                "127.0.0.1:0",
            ];
            args.extend_from_slice(extra);
            SluiceProcess::spawn(bin(), &args, STARTUP).expect("worker started")
        })
        .collect()
}

/// A `sluice read` running in the background; its stdout lines arrive on `lines`.
pub struct Reader {
    child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Reader {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILLs the reader; what it wrote before is still read by [`Reader::finish`].
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn start(args: &[&str]) -> Reader {
        let mut child = Command::new(bin())
            .arg("read")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn sluice read");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Reader { child, lines }
    }

    /// Collects the rest of the output; fails past `timeout`. Returns (success, lines).
    pub fn finish(mut self, mut got: Vec<String>, timeout: Duration) -> (bool, Vec<String>) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => got.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!(
                        "sluice read did not finish within {timeout:?} ({} lines)",
                        got.len()
                    );
                }
            }
        }
        let status = self.child.wait().expect("wait for sluice read");
        (status.success(), got)
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// A memory figure of a process from /proc/PID/status, in MiB: `VmRSS` (resident now) or
/// `VmHWM` (resident at its peak).
pub fn proc_status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    kib / 1024.0
}

/// Counts of each integer line, for exactly-once checks.
pub fn counts(lines: &[String]) -> BTreeMap<i64, u32> {
    let mut counts = BTreeMap::new();
    for line in lines {
        *counts
            .entry(
                line.parse::<i64>()
                    .unwrap_or_else(|_| panic!("not an integer: {line:?}")),
            )
            .or_insert(0) += 1;
    }
    counts
}

pub fn assert_exactly_once(lines: &[String], n: i64) {
    let counts = counts(lines);
    let duplicates: Vec<_> = counts.iter().filter(|(_, c)| **c > 1).take(10).collect();
    let missing: Vec<i64> = (0..n)
        .filter(|v| !counts.contains_key(v))
        .take(10)
        .collect();
    assert!(
        duplicates.is_empty() && missing.is_empty() && lines.len() as i64 == n,
        "{} lines for 0..{n}; duplicates {duplicates:?}; missing {missing:?}",
        lines.len()
    );
}
