//! `WorkerPool`: the worker processes of a run, each the real `sluice` binary, started as
//! `sluice worker --listen LISTEN --advertise-address READER_PROXY --dispatcher FRONTS
//! --split-lease FIRST,MAX --print-leases` (plus worker I's credentials) with stderr appended to
//! `DIR/worker-I.log`.
//!
//! A worker keeps its listen address and its advertised address (the proxy the readers dial)
//! across restarts, so a restarted worker is the same worker to the dispatcher. Each process is
//! one incarnation (numbered from 1 per worker); the history ties every lease and every death to
//! the incarnation that got or suffered it, which is what the loss bound is stated in:
//! - `worker-I start` (`ok`) when the process printed `READY`, with its incarnation and pid;
//! - `worker-I lease` for every `LEASE` line it printed (the lease is recorded even when the
//!   line is read after the process died: it was received before);
//! - `worker-I exit` when it died: killed or stopped by the harness (`cause` kill, terminate,
//!   shutdown), or on its own (`cause` crash: no fault explains it).
//!
//! The pids of the live incarnations are shared (`WorkerPids`), so the dispatchers' front
//! proxies can tell which worker opened a connection.

use crate::fixed_ports;
use crate::history::{History, Kind};
use crate::lease_book::LeaseBook;
use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

/// The pid of each live worker process, by worker name (`worker-I`). A std mutex: held only to
/// read or update the map, never across `.await`.
#[derive(Clone, Default)]
pub struct WorkerPids(Arc<StdMutex<BTreeMap<u32, String>>>);

impl WorkerPids {
    pub fn name_of(&self, pid: u32) -> Option<String> {
        self.0
            .lock()
            .expect("pids lock poisoned")
            .get(&pid)
            .cloned()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.0
            .lock()
            .expect("pids lock poisoned")
            .keys()
            .copied()
            .collect()
    }

    fn set(&self, pid: u32, name: &str) {
        self.0
            .lock()
            .expect("pids lock poisoned")
            .insert(pid, name.to_string());
    }

    fn remove(&self, pid: u32) {
        self.0.lock().expect("pids lock poisoned").remove(&pid);
    }
}

/// How the worker processes are started.
#[derive(Clone, Debug)]
pub struct WorkerPoolConfig {
    pub bin: PathBuf,
    pub dir: PathBuf,
    /// The dispatchers' front proxies, comma-separated.
    pub dispatchers: String,
    pub split_lease: (u32, u32),
    /// Each worker's flags besides its addresses (its certificate and token file).
    pub flags: BTreeMap<u32, Vec<String>>,
}

/// Where a worker's process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    Running,
    Paused,
    Down,
}

struct Worker {
    index: u32,
    listen: SocketAddr,
    advertised: SocketAddr,
    incarnation: u64,
    child: Option<Child>,
    /// Set before the harness stops the current process, so its end is not taken for a crash.
    stopping: Arc<AtomicBool>,
    state: WorkerState,
}

impl Worker {
    fn name(&self) -> String {
        name(self.index)
    }
}

/// `worker-I`, the worker's name in the history.
pub fn name(index: u32) -> String {
    format!("worker-{index}")
}

pub struct WorkerPool {
    config: WorkerPoolConfig,
    history: History,
    pids: WorkerPids,
    book: LeaseBook,
    workers: BTreeMap<u32, Mutex<Worker>>,
}

/// How long a worker may take to print `READY`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

impl WorkerPool {
    /// Picks a free listen port for each of `n` workers (kept across restarts; see
    /// `fixed_ports`).
    pub fn pick_addrs(n: u32) -> anyhow::Result<BTreeMap<u32, SocketAddr>> {
        let ports = fixed_ports::pick(n as usize)?;
        Ok((1..=n).zip(ports).collect())
    }

    /// Starts every worker (`listen` and `advertised` addresses by index) and waits for each
    /// `READY` line.
    pub async fn start(
        config: WorkerPoolConfig,
        addrs: &BTreeMap<u32, (SocketAddr, SocketAddr)>,
        history: History,
        pids: WorkerPids,
        book: LeaseBook,
    ) -> anyhow::Result<WorkerPool> {
        let workers = addrs
            .iter()
            .map(|(&index, &(listen, advertised))| {
                let worker = Worker {
                    index,
                    listen,
                    advertised,
                    incarnation: 0,
                    child: None,
                    stopping: Arc::new(AtomicBool::new(false)),
                    state: WorkerState::Down,
                };
                (index, Mutex::new(worker))
            })
            .collect();
        let pool = WorkerPool {
            config,
            history,
            pids,
            book,
            workers,
        };
        for index in pool.indices() {
            pool.spawn(index).await?;
        }
        Ok(pool)
    }

    pub fn indices(&self) -> Vec<u32> {
        self.workers.keys().copied().collect()
    }

    fn worker(&self, index: u32) -> anyhow::Result<&Mutex<Worker>> {
        self.workers
            .get(&index)
            .with_context(|| format!("no worker {index}"))
    }

    pub async fn state(&self, index: u32) -> anyhow::Result<WorkerState> {
        Ok(self.worker(index)?.lock().await.state)
    }

    /// The incarnation the worker is in (or was in last).
    pub async fn incarnation(&self, index: u32) -> anyhow::Result<u64> {
        Ok(self.worker(index)?.lock().await.incarnation)
    }

    /// Starts a new process for worker `index` (it must be down) and waits for its `READY`.
    pub async fn spawn(&self, index: u32) -> anyhow::Result<()> {
        let mut worker = self.worker(index)?.lock().await;
        if worker.state != WorkerState::Down {
            bail!("worker {index} is already running");
        }
        let name = worker.name();
        let log_path = self.config.dir.join(format!("{name}.log"));
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let (first, max) = self.config.split_lease;
        let mut child = Command::new(&self.config.bin)
            .arg("worker")
            .arg("--dispatcher")
            .arg(&self.config.dispatchers)
            .arg("--listen")
            .arg(worker.listen.to_string())
            .arg("--advertise-address")
            .arg(worker.advertised.to_string())
            .arg("--split-lease")
            .arg(format!("{first},{max}"))
            .arg("--print-leases")
            .args(self.config.flags.get(&index).into_iter().flatten())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {}", self.config.bin.display()))?;
        let pid = child.id().context("worker pid")?;
        // Known before the process dials anyone: a front names a connection's caller once,
        // when it accepts it.
        self.pids.set(pid, &name);
        let stdout = child.stdout.take().context("child stdout")?;
        let incarnation = worker.incarnation + 1;
        let stopping = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(read_stdout(
            stdout,
            Incarnation {
                name: name.clone(),
                number: incarnation,
                pid,
            },
            ready_tx,
            stopping.clone(),
            self.history.clone(),
            self.book.clone(),
            self.pids.clone(),
        ));
        match tokio::time::timeout(READY_TIMEOUT, ready_rx).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                self.pids.remove(pid);
                let status = child.wait().await.ok();
                bail!(
                    "{name} exited before READY ({status:?}); see {}",
                    log_path.display()
                )
            }
            Err(_) => {
                self.pids.remove(pid);
                let _ = child.kill().await;
                bail!("{name} printed no READY within {READY_TIMEOUT:?}")
            }
        }
        self.history.record(
            &name,
            Kind::Ok,
            "start",
            json!({"incarnation": incarnation, "pid": pid, "address": worker.advertised.to_string()}),
        );
        worker.incarnation = incarnation;
        worker.child = Some(child);
        worker.stopping = stopping;
        worker.state = WorkerState::Running;
        Ok(())
    }

    fn signal(worker: &Worker, signal: Signal) -> anyhow::Result<()> {
        let pid = worker
            .child
            .as_ref()
            .and_then(|c| c.id())
            .with_context(|| format!("{} has no process", worker.name()))?;
        kill(Pid::from_raw(pid as i32), signal)
            .with_context(|| format!("{signal} {}", worker.name()))
    }

    /// SIGKILL; waits for the exit. Returns the incarnation that died.
    pub async fn kill(&self, index: u32) -> anyhow::Result<u64> {
        self.stop(index, Signal::SIGKILL, "kill").await
    }

    /// SIGTERM, a clean shutdown (SIGKILL after 5 s). Returns the incarnation that ended.
    pub async fn terminate(&self, index: u32) -> anyhow::Result<u64> {
        self.stop(index, Signal::SIGTERM, "terminate").await
    }

    async fn stop(&self, index: u32, signal: Signal, cause: &str) -> anyhow::Result<u64> {
        let mut worker = self.worker(index)?.lock().await;
        if worker.state == WorkerState::Down {
            bail!("worker {index} is already down");
        }
        worker.stopping.store(true, Ordering::SeqCst);
        Self::signal(&worker, signal)?;
        if worker.state == WorkerState::Paused {
            Self::signal(&worker, Signal::SIGCONT)?;
        }
        let mut child = worker.child.take().context("child")?;
        if let Some(pid) = child.id() {
            self.pids.remove(pid);
        }
        if tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
        worker.state = WorkerState::Down;
        self.history.record(
            &worker.name(),
            Kind::Ok,
            "exit",
            json!({"incarnation": worker.incarnation, "cause": cause}),
        );
        Ok(worker.incarnation)
    }

    pub async fn pause(&self, index: u32) -> anyhow::Result<u64> {
        let mut worker = self.worker(index)?.lock().await;
        if worker.state != WorkerState::Running {
            bail!("worker {index} is not running");
        }
        Self::signal(&worker, Signal::SIGSTOP)?;
        worker.state = WorkerState::Paused;
        Ok(worker.incarnation)
    }

    pub async fn resume(&self, index: u32) -> anyhow::Result<()> {
        let mut worker = self.worker(index)?.lock().await;
        if worker.state != WorkerState::Paused {
            bail!("worker {index} is not paused");
        }
        Self::signal(&worker, Signal::SIGCONT)?;
        worker.state = WorkerState::Running;
        Ok(())
    }

    /// Brings every worker back: SIGCONT the paused, start the down. Returns what it did.
    pub async fn heal(&self) -> anyhow::Result<Vec<String>> {
        let mut done = Vec::new();
        for index in self.indices() {
            match self.state(index).await? {
                WorkerState::Running => {}
                WorkerState::Paused => {
                    self.resume(index).await?;
                    done.push(format!("resumed {}", name(index)));
                }
                WorkerState::Down => {
                    self.spawn(index).await?;
                    done.push(format!("restarted {}", name(index)));
                }
            }
        }
        Ok(done)
    }

    /// Stops every worker (end of run; recorded as `shutdown`).
    pub async fn shutdown(&self) {
        for index in self.indices() {
            let _ = self.stop(index, Signal::SIGKILL, "shutdown").await;
        }
    }
}

/// One worker process, as its stdout reader knows it.
struct Incarnation {
    name: String,
    number: u64,
    pid: u32,
}

/// Reads one worker process's stdout until it closes: reports `READY`, records every `LEASE`
/// line, and records an exit the harness did not cause as a crash.
async fn read_stdout(
    stdout: tokio::process::ChildStdout,
    me: Incarnation,
    ready: tokio::sync::oneshot::Sender<()>,
    stopping: Arc<AtomicBool>,
    history: History,
    book: LeaseBook,
    pids: WorkerPids,
) {
    let mut lines = BufReader::new(stdout).lines();
    let mut ready = Some(ready);
    while let Ok(Some(line)) = lines.next_line().await {
        if line.starts_with("READY worker ") {
            if let Some(tx) = ready.take() {
                let _ = tx.send(());
            }
        } else if let Some(json) = line.strip_prefix("LEASE ") {
            let Ok(mut lease) = serde_json::from_str::<Value>(json) else {
                history.record(
                    &me.name,
                    Kind::Info,
                    "lease",
                    json!({"incarnation": me.number, "unparsed": line}),
                );
                continue;
            };
            lease["incarnation"] = json!(me.number);
            lease["address"] = lease["worker"].clone();
            lease["worker"] = json!(me.name);
            book.add(&lease);
            history.record(&me.name, Kind::Ok, "lease", lease);
        }
    }
    // Stdout closed: the process is gone (or going). If the harness did not stop it, a crash.
    if ready.is_none() && !stopping.load(Ordering::SeqCst) {
        pids.remove(me.pid);
        history.record(
            &me.name,
            Kind::Ok,
            "exit",
            json!({"incarnation": me.number, "cause": "crash"}),
        );
    }
}
