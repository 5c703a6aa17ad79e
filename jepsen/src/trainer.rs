//! The trainer: a reading process that the trainer nemesis SIGKILLs, and that restarts from its
//! last state, as a training job restarts from its last checkpoint.
//!
//! It reads distributed epochs of `range(N)` with exactly-once delivery, one named job per epoch
//! (`t<seed>-e<epoch>`), each with the real `sluice` binary as its reading process:
//! `sluice read --mode distributed_epoch --job-name J --state-every K --state-file DIR/J.state`
//! (plus `--resume` of the state it restarts from), stdout piped to the harness, stderr to
//! `DIR/J-r<run>.log`. `K` is drawn from the seed (`state_every`), once per run of the harness.
//! The process writes its state every `K` elements, after the elements before it reached
//! stdout; so of a killed process's output, the lines up to its last state's `step` (counted
//! from the step it started at) are the elements read before that state.
//!
//! When a process dies (killed by the nemesis, or failed on its own), the trainer waits for the
//! nemesis to let it up again, then starts a new process of the same epoch from the epoch's last
//! state (copied to `DIR/J-r<run>.resume.json`, so every restored state is kept). An epoch that
//! fails before its first state is abandoned (its job has readers' elements that no state
//! accounts for); the next epoch starts with a fresh job.
//!
//! The history (`process: trainer`):
//! - `trainer-epoch` `invoke` `{job, splits, state_every}`, then `ok` (its last run read to the
//!   end of the epoch) or `info` (abandoned: cancelled at the end of the fault phase, timed out,
//!   failed before its first state) with `{job, runs, end, error}`;
//! - `trainer-run` `invoke` `{job, run, pid, resume}` per process: `resume` is the state it
//!   restored from (`null` for the epoch's first run); then `ok` `{job, run, elements}` when it
//!   read to the end, or `info` `{job, run, elements, end, error}` with `end` one of `killed`,
//!   `failed`, `cancelled`, `timed-out`;
//! - `trainer-element` `ok` `{job, run, split}` per line the process printed, in order.
//!
//! A kill request (`Trainer::kill`) waits until a process is running and its epoch has a state
//! to restart from, then SIGKILLs it; the trainer stays down until `Trainer::release`.

use crate::history::{History, Kind};
use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The history's process name of the trainer.
pub const PROCESS: &str = "trainer";
/// Mixed into the seed for the trainer's own generator.
const TRAINER_SEED: u64 = 0x7755_0000_0000_0003;
/// The range `state_every` is drawn from.
const STATE_EVERY: (u64, u64) = (16, 128);
/// How long a kill request waits for a process with a state to restart from.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// Pause before restarting after a process failed on its own (not killed).
const FAILURE_BACKOFF: Duration = Duration::from_millis(200);

/// How the trainer reads.
#[derive(Clone, Debug)]
pub struct TrainerConfig {
    /// The `sluice` binary.
    pub bin: PathBuf,
    /// Where the states and the processes' logs go (created).
    pub dir: PathBuf,
    /// Every dispatcher's front, comma-separated.
    pub dispatchers: String,
    /// The client's credential flags of `sluice read` (none for a plain run).
    pub security_flags: Vec<String>,
    pub seed: u64,
    /// Splits (elements) per epoch.
    pub splits: u64,
    /// Elements per second the process reads at most.
    pub rate: f64,
    /// Elements between two states.
    pub state_every: u64,
    /// An epoch that takes longer is abandoned.
    pub epoch_timeout: Duration,
}

/// The `--state-every` of a run of the harness with `seed`.
pub fn state_every(seed: u64) -> u64 {
    StdRng::seed_from_u64(seed ^ TRAINER_SEED).random_range(STATE_EVERY.0..=STATE_EVERY.1)
}

/// A kill request: answered with what was killed once it was.
type KillRequest = oneshot::Sender<Value>;

/// The nemesis's handle on the trainer.
pub struct Trainer {
    kills: mpsc::Sender<KillRequest>,
    down: watch::Sender<bool>,
}

impl Trainer {
    /// Starts the trainer's epochs; they run until `cancel`.
    pub fn start(
        config: TrainerConfig,
        history: History,
        cancel: CancellationToken,
    ) -> anyhow::Result<(Arc<Trainer>, tokio::task::JoinHandle<()>)> {
        std::fs::create_dir_all(&config.dir)
            .with_context(|| format!("create {}", config.dir.display()))?;
        let (kills, requests) = mpsc::channel(4);
        let (down, up) = watch::channel(false);
        let driver = Driver {
            config,
            history,
            requests,
            pending: None,
            no_more_requests: false,
            down: down.clone(),
            up,
        };
        let handle = tokio::spawn(driver.run(cancel));
        Ok((Arc::new(Trainer { kills, down }), handle))
    }

    /// SIGKILLs the reading process as soon as one runs with a state to restart from (waiting
    /// at most 10 s); the trainer stays down until `release`. Returns what was killed: `job`,
    /// `run`, `pid` and the `state` it will restart from.
    pub async fn kill(&self) -> anyhow::Result<Value> {
        let (reply, killed) = oneshot::channel();
        let kill = async {
            self.kills
                .send(reply)
                .await
                .map_err(|_| anyhow::anyhow!("the trainer has stopped"))?;
            killed
                .await
                .map_err(|_| anyhow::anyhow!("the trainer stopped before a process was killed"))
        };
        // The wait covers the request's send too: the trainer takes requests only while a
        // process runs.
        match tokio::time::timeout(KILL_WAIT, kill).await {
            Ok(result) => result,
            Err(_) => {
                bail!("no trainer process with a state to restart from ran within {KILL_WAIT:?}")
            }
        }
    }

    /// Lets the trainer start its next process.
    pub fn release(&self) {
        self.down.send_replace(false);
    }
}

/// How one process ended.
enum RunEnd {
    /// It read to the end of the epoch.
    Complete,
    Killed,
    Failed(String),
    Cancelled,
    TimedOut,
}

impl RunEnd {
    fn name(&self) -> &'static str {
        match self {
            RunEnd::Complete => "complete",
            RunEnd::Killed => "killed",
            RunEnd::Failed(_) => "failed",
            RunEnd::Cancelled => "cancelled",
            RunEnd::TimedOut => "timed-out",
        }
    }
}

/// One process of an epoch.
struct RunSpec<'a> {
    job: &'a str,
    run: u64,
    state_file: &'a Path,
    /// The copy of the state it restores from, and that state.
    resume: Option<(PathBuf, Value)>,
    deadline: Instant,
}

struct Driver {
    config: TrainerConfig,
    history: History,
    requests: mpsc::Receiver<KillRequest>,
    /// A kill request waiting for a process with a state.
    pending: Option<KillRequest>,
    /// No more kill requests come (the handle is gone).
    no_more_requests: bool,
    down: watch::Sender<bool>,
    up: watch::Receiver<bool>,
}

impl Driver {
    async fn run(mut self, cancel: CancellationToken) {
        for epoch in 0u64.. {
            if cancel.is_cancelled() {
                return;
            }
            let job = format!("t{}-e{epoch}", self.config.seed);
            self.epoch(&job, &cancel).await;
        }
    }

    /// Reads one epoch to its end, restarting from its last state after every death.
    async fn epoch(&mut self, job: &str, cancel: &CancellationToken) {
        let state_file = self.config.dir.join(format!("{job}.state"));
        self.history.record(
            PROCESS,
            Kind::Invoke,
            "trainer-epoch",
            json!({"job": job, "splits": self.config.splits,
                   "state_every": self.config.state_every}),
        );
        let deadline = Instant::now() + self.config.epoch_timeout;
        let mut resume = None;
        let mut run = 0u64;
        let (end, error) = loop {
            // Down while the nemesis holds the trainer killed.
            let mut up = self.up.clone();
            let wait_up = up.wait_for(|down| !*down);
            tokio::select! {
                _ = cancel.cancelled() => break (RunEnd::Cancelled, None),
                _ = tokio::time::sleep_until(deadline) => break (RunEnd::TimedOut, None),
                _ = wait_up => {}
            }
            let spec = RunSpec {
                job,
                run,
                state_file: &state_file,
                resume: resume.take(),
                deadline,
            };
            let end = match self.run_once(spec, cancel).await {
                Ok(end) => end,
                Err(e) => RunEnd::Failed(format!("{e:#}")),
            };
            match end {
                RunEnd::Complete | RunEnd::Cancelled | RunEnd::TimedOut => break (end, None),
                RunEnd::Killed | RunEnd::Failed(_) => {
                    if let RunEnd::Failed(_) = end {
                        tokio::time::sleep(FAILURE_BACKOFF).await;
                    }
                    if !state_file.is_file() {
                        let error = match end {
                            RunEnd::Failed(e) => e,
                            _ => String::new(),
                        };
                        break (
                            RunEnd::Failed(format!(
                                "the reader died before its first state: {error}"
                            )),
                            None,
                        );
                    }
                    run += 1;
                    let copy = self.config.dir.join(format!("{job}-r{run}.resume.json"));
                    match keep_state(&state_file, &copy) {
                        Ok(state) => resume = Some((copy, state)),
                        Err(e) => break (RunEnd::Failed(String::new()), Some(format!("{e:#}"))),
                    }
                }
            }
        };
        let runs = run + 1;
        match end {
            RunEnd::Complete => self.history.record(
                PROCESS,
                Kind::Ok,
                "trainer-epoch",
                json!({"job": job, "runs": runs}),
            ),
            other => {
                let error = error.or(match &other {
                    RunEnd::Failed(e) => Some(e.clone()),
                    _ => None,
                });
                self.history.record(
                    PROCESS,
                    Kind::Info,
                    "trainer-epoch",
                    json!({"job": job, "runs": runs, "end": other.name(), "error": error}),
                );
            }
        }
    }

    /// One reading process, from its start to its exit.
    async fn run_once(
        &mut self,
        spec: RunSpec<'_>,
        cancel: &CancellationToken,
    ) -> anyhow::Result<RunEnd> {
        let RunSpec {
            job,
            run,
            state_file,
            resume,
            deadline,
        } = spec;
        let config = &self.config;
        let log_path = config.dir.join(format!("{job}-r{run}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("create {}", log_path.display()))?;
        let mut command = Command::new(&config.bin);
        command
            .arg("read")
            .args(["--dispatcher", &config.dispatchers])
            .args(["--dataset", &format!("range({})", config.splits)])
            .args(["--mode", "distributed_epoch", "--job-name", job])
            .args([
                "--delivery",
                "exactly-once",
                "--max-outstanding-requests",
                "64",
            ])
            .args(["--state-every", &config.state_every.to_string()])
            .arg("--state-file")
            .arg(state_file)
            .args(&config.security_flags);
        if config.rate > 0.0 {
            command.args(["--rate", &config.rate.to_string()]);
        }
        if let Some((copy, _)) = &resume {
            command.arg("--resume").arg(copy);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {} read", config.bin.display()))?;
        let pid = child.id().unwrap_or(0);
        self.history.record(
            PROCESS,
            Kind::Invoke,
            "trainer-run",
            json!({"job": job, "run": run, "pid": pid,
                   "resume": resume.as_ref().map(|(_, state)| state.clone())}),
        );
        let stdout = child.stdout.take().context("the reader's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let mut elements = 0u64;
        let mut killed = false;
        let mut stopped: Option<RunEnd> = None;
        loop {
            tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(line)) => {
                        self.record_element(job, run, &line);
                        elements += 1;
                        if !killed {
                            killed = self.kill_if_asked(&mut child, job, run, pid, state_file);
                        }
                    }
                    Ok(None) | Err(_) => break,
                },
                // The nemesis asks one kill at a time: a new request replaces one it gave up.
                request = self.requests.recv(), if !killed && !self.no_more_requests => {
                    self.no_more_requests = request.is_none();
                    self.pending = request;
                    killed = self.kill_if_asked(&mut child, job, run, pid, state_file);
                }
                _ = cancel.cancelled(), if stopped.is_none() => {
                    let _ = child.start_kill();
                    stopped = Some(RunEnd::Cancelled);
                }
                _ = tokio::time::sleep_until(deadline), if stopped.is_none() => {
                    let _ = child.start_kill();
                    stopped = Some(RunEnd::TimedOut);
                }
            }
        }
        let status = child.wait().await.context("wait for the reader")?;
        let end = match stopped {
            Some(end) => end,
            None if status.success() => RunEnd::Complete,
            None if killed => RunEnd::Killed,
            None => RunEnd::Failed(format!("{status}: {}", log_tail(&log_path))),
        };
        match &end {
            RunEnd::Complete => self.history.record(
                PROCESS,
                Kind::Ok,
                "trainer-run",
                json!({"job": job, "run": run, "elements": elements, "killed": killed}),
            ),
            other => {
                let error = match other {
                    RunEnd::Failed(e) => Some(e.clone()),
                    _ => None,
                };
                self.history.record(
                    PROCESS,
                    Kind::Info,
                    "trainer-run",
                    json!({"job": job, "run": run, "elements": elements, "end": other.name(),
                           "error": error}),
                );
            }
        }
        Ok(end)
    }

    fn record_element(&self, job: &str, run: u64, line: &str) {
        let value = match serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| v.as_i64())
        {
            Some(split) => json!({"job": job, "run": run, "split": split}),
            None => json!({"job": job, "run": run, "raw": line}),
        };
        self.history
            .record(PROCESS, Kind::Ok, "trainer-element", value);
    }

    /// Kills the process if a kill request waits and the epoch has a state to restart from;
    /// returns whether it did.
    fn kill_if_asked(
        &mut self,
        child: &mut Child,
        job: &str,
        run: u64,
        pid: u32,
        state_file: &Path,
    ) -> bool {
        if self.pending.as_ref().is_some_and(|r| r.is_closed()) {
            // The nemesis gave up waiting.
            self.pending = None;
        }
        if self.pending.is_none() || !state_file.is_file() {
            return false;
        }
        let state = std::fs::read(state_file)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok());
        self.down.send_replace(true);
        if child.start_kill().is_err() {
            self.down.send_replace(false);
            return false;
        }
        if let Some(reply) = self.pending.take() {
            let _ = reply.send(json!({"job": job, "run": run, "pid": pid, "state": state}));
        }
        true
    }
}

/// Copies the state in `from` to `to` and returns it.
fn keep_state(from: &Path, to: &Path) -> anyhow::Result<Value> {
    let bytes = std::fs::read(from).with_context(|| format!("read {}", from.display()))?;
    let state: Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} holds no JSON state", from.display()))?;
    std::fs::write(to, &bytes).with_context(|| format!("write {}", to.display()))?;
    Ok(state)
}

/// The last lines of a process's log, for an error.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}
