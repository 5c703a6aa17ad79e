//! `ExecutorProcess`: one `PYTHON -m sluice._executor` child and its pipes, spoken to with the
//! framed protocol. Only the pool's thread for this executor uses it, one request at a time.
//!
//! Invariants: the child's stdin and stdout are the protocol, its stderr is the worker's own
//! (users' prints land there), and it inherits one more descriptor, its shared region (see
//! `shared_region`), when one could be created; dropping an `ExecutorProcess` kills and reaps the child, so
//! no executor outlives its pool and none is left a zombie. The child also exits on its own
//! when its stdin closes.

use std::collections::VecDeque;
use std::io::{BufReader, BufWriter};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::PoolError;
use crate::protocol::{self, Frame, Hello};
use crate::shared_region::{SharedLayout, SharedRegion, SHARED_REGION_ENV};

/// How long an executor whose pipe broke may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// The capacity asked for the executor's pipes (Linux's default `pipe-max-size`, which an
/// unprivileged process may ask for; the kernel's 64 KiB when refused). On stdout it lets a
/// batch's results (a few hundred KiB of images) be written in one go, where 64 KiB made the
/// executor and the worker's thread wake each other for every 64 KiB.
const PIPE_BYTES: usize = 1 << 20;

/// glibc malloc's settings for an executor (environment variables it reads at start; one the
/// worker's own environment sets is left as it is). By default glibc gives the top of its heap
/// back to the OS whenever more than 128 KiB of it is free, so an executor that allocates and
/// frees a batch's images (a few hundred KiB) page-faults them in again for every batch: a
/// 48 KiB copy cost 41 µs, and 5 µs with these. An executor keeps up to 64 MiB of freed heap,
/// and allocates blocks under 32 MiB from the heap rather than mapping each one.
const MALLOC_SETTINGS: [(&str, &str); 3] = [
    ("MALLOC_TRIM_THRESHOLD_", "67108864"),
    ("MALLOC_TOP_PAD_", "16777216"),
    ("MALLOC_MMAP_THRESHOLD_", "33554432"),
];

pub struct ExecutorProcess {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pub hello: Hello,
    /// The most bytes of requests that may be written while a reply is due: half the stdin
    /// pipe's capacity. A request written while the executor writes a reply must fit in the
    /// pipe, or the executor (blocked on a full stdout) and the worker's thread (blocked on a
    /// full stdin) would wait for each other for ever.
    pub ahead_bytes: usize,
    /// The region batches and results travel through, once the executor said it mapped it.
    region: Option<SharedRegion>,
    /// The batches sent and not answered, oldest first: each one's slot in the region, `None`
    /// for one sent through the pipe.
    batches: VecDeque<Option<usize>>,
}

/// Batches a worker keeps sent to an executor ahead of their replies, so the executor starts
/// its next batch as soon as it has written a reply. Up to the region's slots less these are
/// leased (see `SharedRegion::take_reply`), so a slot is always free for the next batch.
pub const BATCHES_IN_FLIGHT: usize = 2;

impl ExecutorProcess {
    /// Starts an executor and reads its handshake. A missing interpreter, or one that cannot
    /// import what the executor needs, is an error naming the interpreter and what it printed.
    pub fn start(python: &Path) -> Result<ExecutorProcess, PoolError> {
        let mut process = Self::spawn(python)?;
        process.handshake(python)?;
        Ok(process)
    }

    /// Starts the process without waiting for it (so many can start at once); `handshake`
    /// must follow before any request.
    pub fn spawn(python: &Path) -> Result<ExecutorProcess, PoolError> {
        let mut command = Command::new(python);
        for (name, value) in MALLOC_SETTINGS {
            if std::env::var_os(name).is_none() {
                command.env(name, value);
            }
        }
        let region = match SharedRegion::create(SharedLayout::DEFAULT) {
            Ok(region) => Some(region),
            Err(e) => {
                tracing::warn!(error = %e, "no shared region for a python executor; its batches go through its pipes");
                None
            }
        };
        if let Some(region) = &region {
            use std::os::unix::process::CommandExt;
            let fd = region.raw_fd();
            command.env(SHARED_REGION_ENV, region.layout().to_env(fd));
            // SAFETY: between fork and exec only fcntl(2) runs, which is async-signal-safe: the
            // child keeps the region's descriptor (created close-on-exec) across its exec.
            unsafe {
                command.pre_exec(move || {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        } else {
            command.env_remove(SHARED_REGION_ENV);
        }
        let mut child = command
            .args(["-m", "sluice._executor"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| PoolError::Spawn {
                python: python.to_path_buf(),
                message: e.to_string(),
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(PoolError::Spawn {
                python: python.to_path_buf(),
                message: "its pipes were not set up".into(),
            });
        };
        let ahead_bytes = pipe_capacity(&stdin) / 2;
        grow_pipe(&stdout);
        Ok(ExecutorProcess {
            child,
            ahead_bytes,
            stdin: BufWriter::with_capacity(64 << 10, stdin),
            stdout: BufReader::with_capacity(64 << 10, stdout),
            hello: Hello {
                python: String::new(),
                cloudpickle: String::new(),
                pid: 0,
                shared: false,
            },
            region,
            batches: VecDeque::new(),
        })
    }

    /// Reads the executor's HELLO; on failure the executor is killed and the error says why.
    pub fn handshake(&mut self, python: &Path) -> Result<(), PoolError> {
        let hello = match protocol::read_frame(&mut self.stdout) {
            Ok(Some(Frame { kind, body })) if kind == protocol::HELLO => {
                serde_json::from_slice::<Hello>(&body).map_err(|e| e.to_string())
            }
            Ok(Some(frame)) => Err(format!(
                "a frame of kind {:#x} before its hello",
                frame.kind
            )),
            Ok(None) => Err("no hello".to_string()),
            Err(e) => Err(e.to_string()),
        };
        match hello {
            Ok(hello) => {
                if !hello.shared {
                    // It could not map the region (or is an executor without the protocol's
                    // shared frames): everything goes through the pipes.
                    self.region = None;
                }
                self.hello = hello;
                Ok(())
            }
            Err(what) => {
                let status = self.kill_and_reap();
                Err(PoolError::Handshake {
                    python: python.to_path_buf(),
                    message: format!(
                        "{what} (the executor {}); {}",
                        describe_exit(status),
                        diagnose(python)
                    ),
                })
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one frame whose body is `parts` concatenated.
    pub fn send(&mut self, kind: u8, parts: &[&[u8]]) -> std::io::Result<()> {
        protocol::write_frame(&mut self.stdin, kind, parts)
    }

    /// Reads the next reply; an end of stream is an error (the executor went away).
    pub fn receive(&mut self) -> std::io::Result<Frame> {
        protocol::read_frame(&mut self.stdout)?
            .ok_or_else(|| std::io::ErrorKind::UnexpectedEof.into())
    }

    /// Whether a batch of about `bytes` travels through the shared region (so it is not written
    /// into the pipe).
    pub fn fits_shared(&self, bytes: usize) -> bool {
        self.region
            .as_ref()
            .is_some_and(|r| bytes <= r.layout().request_bytes)
    }

    /// Sends a BATCH of function `head` whose body (after the function id) is `pieces`
    /// concatenated: through a free slot of the shared region when it fits one (a
    /// BATCH_SHARED), else through the pipe. `false` when it went through the pipe. Its reply
    /// is read with `receive_batch`.
    pub fn send_batch(&mut self, head: &[u8; 8], pieces: &[bytes::Bytes]) -> std::io::Result<bool> {
        if let Some(region) = self.region.as_mut() {
            if let Some(slot) = region.claim() {
                let out = region
                    .request_mut(slot)
                    .expect("a claimed slot is in the layout");
                if let Some(len) = protocol::copy_parts(out, pieces.iter().map(|p| p.as_ref())) {
                    self.batches.push_back(Some(slot));
                    let at = protocol::shared_ref(slot, len);
                    protocol::write_frame(&mut self.stdin, protocol::BATCH_SHARED, &[head, &at])?;
                    return Ok(true);
                }
                region.release(slot);
            }
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + pieces.len());
        parts.push(head);
        parts.extend(pieces.iter().map(|p| p.as_ref()));
        self.batches.push_back(None);
        protocol::write_frame(&mut self.stdin, protocol::BATCH, &parts)?;
        Ok(false)
    }

    /// Reads the reply to the oldest batch sent. Results the executor wrote into the batch's
    /// reply slot (a RESULTS_SHARED) come back as a RESULTS frame whose body borrows the slot
    /// (or is copied out of it, see `SharedRegion::take_reply`); the slot of a batch answered
    /// otherwise is freed. The outer error: the pipe failed; the inner: the executor answered
    /// out of protocol.
    pub fn receive_batch(&mut self) -> std::io::Result<Result<Frame, String>> {
        let frame = self.receive()?;
        let slot = self.batches.pop_front().flatten();
        let Some(region) = self.region.as_ref() else {
            return Ok(match frame.kind {
                protocol::RESULTS_SHARED => {
                    Err("shared results from an executor without a region".into())
                }
                _ => Ok(frame),
            });
        };
        if frame.kind != protocol::RESULTS_SHARED {
            if let Some(slot) = slot {
                region.release(slot);
            }
            return Ok(Ok(frame));
        }
        let Some((at, len)) = protocol::parse_shared_ref(&frame.body) else {
            return Ok(Err(
                "a shared results reference that is not a slot and a length".into(),
            ));
        };
        if slot != Some(at) {
            let sent = match slot {
                Some(slot) => {
                    region.release(slot);
                    format!("in slot {slot}")
                }
                None => "through the pipe".to_string(),
            };
            return Ok(Err(format!(
                "shared results in reply slot {at}, for a batch sent {sent}"
            )));
        }
        let max_leased = region.layout().slots.saturating_sub(BATCHES_IN_FLIGHT);
        Ok(region.take_reply(at, len, max_leased).map(|body| Frame {
            kind: protocol::RESULTS,
            body,
        }))
    }

    /// Kills the executor (if it still runs) and waits for it; its exit status if known.
    pub fn kill_and_reap(&mut self) -> Option<ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }

    /// Waits for an executor whose pipe broke to be gone; its exit status. Its pipe closes a
    /// moment before its status is known, so it is given `EXIT_GRACE` to exit by itself (and
    /// its own status is reported) before it is killed, as one that closed only its stdout
    /// would linger.
    pub fn reap_after_failure(&mut self) -> Option<ExitStatus> {
        let deadline = Instant::now() + EXIT_GRACE;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Err(_) => break,
            }
        }
        self.kill_and_reap()
    }
}

impl Drop for ExecutorProcess {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

/// The capacity of the pipe `stdin` writes into, grown to `PIPE_BYTES` where the kernel
/// allows; 64 KiB (Linux's default) when it cannot be known.
fn pipe_capacity(stdin: &ChildStdin) -> usize {
    use std::os::fd::AsRawFd;
    let fd = stdin.as_raw_fd();
    let grown = grow_pipe(stdin);
    if grown > 0 {
        return grown;
    }
    // SAFETY: fcntl(2) on a pipe descriptor this process owns; no memory is passed.
    let current = unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) };
    if current > 0 {
        current as usize
    } else {
        64 << 10
    }
}

/// Grows the pipe of `end` to `PIPE_BYTES`: its new capacity, or 0 when the kernel refused.
fn grow_pipe(end: &impl std::os::fd::AsRawFd) -> usize {
    // SAFETY: fcntl(2) on a pipe descriptor this process owns; no memory is passed.
    let grown = unsafe {
        libc::fcntl(
            end.as_raw_fd(),
            libc::F_SETPIPE_SZ,
            PIPE_BYTES as libc::c_int,
        )
    };
    grown.max(0) as usize
}

/// "exited with status 1", "was killed by signal 9".
pub fn describe_exit(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exited with status {code}"),
            (None, Some(signal)) => format!("was killed by signal {signal}"),
            (None, None) => format!("ended ({s})"),
        },
        None => "ended with an unknown status".into(),
    }
}

/// Why an interpreter cannot run executors: what it prints importing their modules.
fn diagnose(python: &Path) -> String {
    let output = Command::new(python)
        .args(["-c", "import sluice._native, numpy, cloudpickle"])
        .stdin(Stdio::null())
        .output();
    match output {
        Ok(out) if out.status.success() => {
            "it imports sluice._native, numpy and cloudpickle, so see the executor's own output \
             above"
                .into()
        }
        Ok(out) => {
            let printed = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = printed.trim_end().lines().rev().take(3).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!(
                "`{} -c \"import sluice._native, numpy, cloudpickle\"` printed: {}",
                python.display(),
                tail.join(" | ")
            )
        }
        Err(e) => format!("it cannot be run: {e}"),
    }
}
