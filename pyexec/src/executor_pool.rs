//! `ExecutorPool`: a worker's pool of Python executor processes, the `PythonRunner` of its
//! pipelines.
//!
//! Calls of every task and every function go into one FIFO; one thread per executor takes the
//! next calls and keeps up to `PIPELINE_DEPTH` of them sent ahead of their replies, so all
//! executors stay busy whichever tasks produce work, and none waits for its thread between
//! calls. A function is known by its pickle's content and is loaded into an executor
//! (LOAD, unpickling there) before its first call on that executor, never per element; each
//! executor keeps at most `MAX_LOADED` functions, unloading the least recently used.
//!
//! Failure containment: an executor that dies during a call (os._exit, a segfault, a kill)
//! fails that call with `DatasetError::PythonRuntime` and is restarted by its thread; other
//! calls, tasks and the worker go on. A call sent behind the fatal one never started (an
//! executor runs one call at a time) and is sent again to the new executor. A call whose receiver is gone (its task was cancelled)
//! still runs, and its result is dropped.
//!
//! Shutdown: when the pool and every function prepared from it are dropped, the FIFO closes,
//! running executors are killed, and each thread reaps its executor and ends.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use sluice_element::pb::{PyFunctionKind, PyFunctionOp};
use sluice_element::{
    codec, CallResult, Compression, DatasetError, Element, PythonException, PythonFunction,
    PythonRunner,
};
use tracing::{info, warn};

use crate::error::PoolError;
use crate::executor_process::{describe_exit, ExecutorProcess};
use crate::pool_config::PoolConfig;
use crate::protocol::{self, RemoteException};

/// Functions an executor keeps loaded at most.
pub const MAX_LOADED: usize = 64;

/// Calls sent to one executor ahead of their replies.
const PIPELINE_DEPTH: usize = 2;

/// A running pool of executors. Cheap to share behind an `Arc`.
pub struct ExecutorPool {
    shared: Arc<Shared>,
}

struct Shared {
    calls: flume::Sender<Call>,
    /// Function ids by kind and pickle content: the same callable as a map and as a filter
    /// is loaded twice (std `Mutex`: held only to look up or insert).
    functions: Mutex<HashMap<(i32, Vec<u8>), u64>>,
    next_id: AtomicU64,
    python: PathBuf,
    /// What the executors reported in their handshake.
    python_version: String,
    cloudpickle_version: String,
    executors: usize,
    /// Each executor thread's current child pid, `None` while it has none; a thread clears it
    /// before reaping, so a pid found here is never one reused by another process.
    pids: Vec<Arc<Mutex<Option<u32>>>>,
}

/// A function as its calls carry it.
struct Function {
    id: u64,
    kind: PyFunctionKind,
    name: String,
    pickled: Vec<u8>,
}

struct Call {
    function: Arc<Function>,
    input: Element,
    reply: mpsc::Sender<CallResult>,
}

impl ExecutorPool {
    /// Starts `config.executors` executors at once and waits for each one's handshake; the
    /// first that fails to start fails the pool (those started are stopped).
    pub fn start(config: &PoolConfig) -> Result<ExecutorPool, PoolError> {
        config.validate()?;
        let mut processes = Vec::with_capacity(config.executors);
        for _ in 0..config.executors {
            processes.push(ExecutorProcess::spawn(&config.python)?);
        }
        for process in &mut processes {
            process.handshake(&config.python)?;
        }
        let hello = processes[0].hello.clone();
        let (calls, queue) = flume::unbounded();
        let pids: Vec<_> = processes
            .iter()
            .map(|p| Arc::new(Mutex::new(Some(p.pid()))))
            .collect();
        for (index, process) in processes.into_iter().enumerate() {
            let slot = ExecutorSlot {
                index,
                python: config.python.clone(),
                process: Some(process),
                loaded: VecDeque::new(),
                pid: pids[index].clone(),
            };
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("sluice-pyexec-{index}"))
                .spawn(move || slot.serve(queue))
                .map_err(|e| PoolError::Thread(e.to_string()))?;
        }
        info!(
            python = %config.python.display(),
            version = %hello.python,
            cloudpickle = %hello.cloudpickle,
            executors = config.executors,
            "python executors started"
        );
        Ok(ExecutorPool {
            shared: Arc::new(Shared {
                calls,
                functions: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                python: config.python.clone(),
                python_version: hello.python,
                cloudpickle_version: hello.cloudpickle,
                executors: config.executors,
                pids,
            }),
        })
    }

    /// The executors' Python `major.minor` and cloudpickle version.
    pub fn versions(&self) -> (&str, &str) {
        (
            &self.shared.python_version,
            &self.shared.cloudpickle_version,
        )
    }

    /// The executors' current process ids (for tests and diagnostics).
    pub fn pids(&self) -> Vec<u32> {
        self.shared
            .pids
            .iter()
            .filter_map(|p| p.lock().ok().and_then(|p| *p))
            .collect()
    }
}

impl fmt::Debug for ExecutorPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutorPool")
            .field("python", &self.shared.python)
            .field("executors", &self.shared.executors)
            .finish()
    }
}

impl PythonRunner for ExecutorPool {
    fn prepare(&self, op: &PyFunctionOp) -> Result<Arc<dyn PythonFunction>, DatasetError> {
        let shared = &self.shared;
        if op.python_version != shared.python_version
            || op.cloudpickle_version != shared.cloudpickle_version
        {
            return Err(DatasetError::PythonRuntime(format!(
                "python function '{}' was pickled by Python {} with cloudpickle {}; this \
                 worker's executors run Python {} with cloudpickle {} ({}): run the workers \
                 with the client's Python and cloudpickle versions",
                op.name,
                op.python_version,
                op.cloudpickle_version,
                shared.python_version,
                shared.cloudpickle_version,
                shared.python.display()
            )));
        }
        let kind = PyFunctionKind::try_from(op.kind)
            .ok()
            .filter(|k| *k != PyFunctionKind::Unspecified)
            .ok_or_else(|| {
                DatasetError::PythonRuntime(format!(
                    "python function '{}' has no kind (map, filter or flat_map)",
                    op.name
                ))
            })?;
        let id = {
            let mut functions = shared
                .functions
                .lock()
                .map_err(|_| DatasetError::PythonRuntime("executor pool poisoned".into()))?;
            *functions
                .entry((kind as i32, op.pickled.clone()))
                .or_insert_with(|| shared.next_id.fetch_add(1, Ordering::Relaxed))
        };
        Ok(Arc::new(PoolFunction {
            shared: shared.clone(),
            function: Arc::new(Function {
                id,
                kind,
                name: op.name.clone(),
                pickled: op.pickled.clone(),
            }),
        }))
    }
}

impl Drop for Shared {
    /// The last user is gone: executors busy with a call are killed (idle ones see the FIFO
    /// close); their threads reap them.
    fn drop(&mut self) {
        for pid in &self.pids {
            if let Ok(pid) = pid.lock() {
                if let Some(pid) = *pid {
                    // SAFETY: kill(2) with a pid that is still this process's unreaped child.
                    unsafe {
                        libc::kill(pid as libc::pid_t, libc::SIGKILL);
                    }
                }
            }
        }
    }
}

struct PoolFunction {
    shared: Arc<Shared>,
    function: Arc<Function>,
}

impl PythonFunction for PoolFunction {
    fn call(&self, input: Element) -> mpsc::Receiver<CallResult> {
        let (reply, rx) = mpsc::channel();
        let call = Call {
            function: self.function.clone(),
            input,
            reply,
        };
        if let Err(flume::SendError(call)) = self.shared.calls.send(call) {
            let _ = call.reply.send(Err(DatasetError::PythonRuntime(format!(
                "python function '{}': the worker's executors have stopped",
                self.function.name
            ))));
        }
        rx
    }

    fn parallelism(&self) -> usize {
        self.shared.executors
    }
}

/// One executor and the thread that feeds it.
struct ExecutorSlot {
    index: usize,
    python: PathBuf,
    /// `None` after a failed restart; the next call tries again.
    process: Option<ExecutorProcess>,
    /// Function ids loaded in `process`, least recently used first.
    loaded: VecDeque<u64>,
    pid: Arc<Mutex<Option<u32>>>,
}

/// Why a call did not get a reply.
enum Broken {
    /// The pipe failed: the executor is gone or stuck.
    Io(std::io::Error),
    /// The executor answered out of protocol.
    Protocol(String),
}

impl ExecutorSlot {
    /// Feeds the executor from `queue`, keeping up to `PIPELINE_DEPTH` calls sent ahead of
    /// their replies, so the executor starts its next call as soon as it has written a reply
    /// rather than after this thread has read it and sent another (on a busy machine that
    /// thread may wait for a core first). Replies come in request order.
    fn serve(mut self, queue: flume::Receiver<Call>) {
        let mut sent: VecDeque<Call> = VecDeque::new();
        // Calls to send before new ones: those sent to an executor that died before it
        // reached them (it runs calls one at a time, so they never started).
        let mut resend: VecDeque<Call> = VecDeque::new();
        loop {
            while sent.len() < PIPELINE_DEPTH {
                let next = match resend.pop_front() {
                    Some(call) => call,
                    None if sent.is_empty() => match queue.recv() {
                        Ok(call) => call,
                        Err(_) => {
                            self.set_pid(None);
                            return;
                        }
                    },
                    None => match queue.try_recv() {
                        Ok(call) => call,
                        Err(_) => break,
                    },
                };
                self.send(next, &mut sent, &mut resend);
            }
            self.answer_oldest(&mut sent, &mut resend);
        }
    }

    /// Reads the reply to the oldest call in `sent` and hands it to its caller. If the
    /// executor died running it, that call fails, and the calls behind it (which never started
    /// there) go to the front of `resend`.
    fn answer_oldest(&mut self, sent: &mut VecDeque<Call>, resend: &mut VecDeque<Call>) {
        let Some(call) = sent.pop_front() else {
            return;
        };
        let result = match self.process.as_mut().map(|p| receive(p, &call)) {
            Some(Ok(result)) => result,
            Some(Err(broken)) => {
                for stranded in sent.drain(..).rev() {
                    resend.push_front(stranded);
                }
                Err(self.died(&call.function.name, broken))
            }
            None => Err(DatasetError::PythonRuntime(format!(
                "python function '{}': no executor",
                call.function.name
            ))),
        };
        // A dropped receiver: the task is gone; the result is not wanted.
        let _ = call.reply.send(result);
    }

    /// Sends `call` (after loading its function, which first takes every reply still due) and
    /// queues it in `sent`, or answers it with the error it gets instead (its function did not
    /// load, or there is no executor). Calls of `sent` stranded by an executor's death go to
    /// `resend`.
    fn send(&mut self, call: Call, sent: &mut VecDeque<Call>, resend: &mut VecDeque<Call>) {
        let name = call.function.name.clone();
        let fail = |call: Call, error: DatasetError| {
            // A dropped receiver: the task is gone; the result is not wanted.
            let _ = call.reply.send(Err(error));
        };
        if self.process.is_none() {
            if let Err(e) = self.restart() {
                let error = DatasetError::PythonRuntime(format!("python function '{name}': {e}"));
                return fail(call, error);
            }
        }
        if !self.loaded.contains(&call.function.id) {
            // A LOAD's reply must be read before the call is sent: finish what is in flight.
            while !sent.is_empty() {
                self.answer_oldest(sent, resend);
            }
        }
        let Some(process) = self.process.as_mut() else {
            let error =
                DatasetError::PythonRuntime(format!("python function '{name}': no executor"));
            return fail(call, error);
        };
        match load_and_send(process, &mut self.loaded, &call) {
            Ok(None) => sent.push_back(call),
            Ok(Some(error)) => fail(call, error),
            Err(broken) => match sent.pop_front() {
                // The executor died running the oldest call sent: that call is the one to
                // blame; the others, and this one, never started and go again.
                Some(running) => {
                    let error = self.died(&running.function.name, broken);
                    fail(running, error);
                    resend.push_back(call);
                    for stranded in sent.drain(..).rev() {
                        resend.push_front(stranded);
                    }
                }
                None => {
                    let error = self.died(&name, broken);
                    fail(call, error);
                }
            },
        }
    }

    /// The executor failed (`broken`) during a call of `name`: reaps and restarts it, and
    /// returns the call's error.
    fn died(&mut self, name: &str, broken: Broken) -> DatasetError {
        let cause = match broken {
            Broken::Io(e) => e.to_string(),
            Broken::Protocol(e) => e,
        };
        let pid = self
            .process
            .as_ref()
            .map(ExecutorProcess::pid)
            .unwrap_or_default();
        self.set_pid(None);
        let status = self.process.take().and_then(|mut p| p.reap_after_failure());
        self.loaded.clear();
        warn!(executor = self.index, pid, %cause, "python executor died during a call");
        let message = format!(
            "python function '{name}': its executor process (pid {pid}) {} during the call \
             ({cause}); the executor is restarted, the call is not retried",
            describe_exit(status)
        );
        if let Err(e) = self.restart() {
            warn!(executor = self.index, error = %e, "python executor did not restart");
        }
        DatasetError::PythonRuntime(message)
    }

    fn restart(&mut self) -> Result<(), PoolError> {
        let process = ExecutorProcess::start(&self.python)?;
        self.set_pid(Some(process.pid()));
        self.process = Some(process);
        Ok(())
    }

    fn set_pid(&self, pid: Option<u32>) {
        if let Ok(mut slot) = self.pid.lock() {
            *slot = pid;
        }
    }
}

/// Loads the call's function if needed (waiting for its LOADED), then sends the call without
/// waiting for its reply. `Ok(Some(error))`: the function did not load, and the call was not
/// sent.
fn load_and_send(
    process: &mut ExecutorProcess,
    loaded: &mut VecDeque<u64>,
    call: &Call,
) -> Result<Option<DatasetError>, Broken> {
    let function = &call.function;
    let head = protocol::function_head(function.id);
    if let Some(at) = loaded.iter().position(|id| *id == function.id) {
        loaded.remove(at);
        loaded.push_back(function.id);
    } else {
        if loaded.len() >= MAX_LOADED {
            if let Some(evicted) = loaded.pop_front() {
                process
                    .send(protocol::UNLOAD, &[&protocol::function_head(evicted)])
                    .map_err(Broken::Io)?;
            }
        }
        let kind = [function.kind as i32 as u8];
        process
            .send(protocol::LOAD, &[&head, &kind, &function.pickled])
            .map_err(Broken::Io)?;
        let reply = process.receive().map_err(Broken::Io)?;
        match reply.kind {
            protocol::LOADED => loaded.push_back(function.id),
            protocol::ERROR => {
                let e = remote_exception(&reply.body)?;
                return Ok(Some(DatasetError::PythonRuntime(format!(
                    "python function '{}' could not be loaded in its executor (pid {}): {}: {}\n{}",
                    function.name,
                    process.pid(),
                    e.type_name,
                    e.message,
                    e.traceback
                ))));
            }
            other => return Err(unexpected(other, "LOAD")),
        }
    }
    let mut encoded = BytesMut::new();
    let payload = codec::encode_element_append(&call.input, Compression::None, &mut encoded);
    process
        .send(
            protocol::CALL,
            &[&head, &encoded, payload.as_deref().unwrap_or_default()],
        )
        .map_err(Broken::Io)?;
    Ok(None)
}

/// Reads the reply to `call`, the oldest call sent and not answered.
fn receive(process: &mut ExecutorProcess, call: &Call) -> Result<CallResult, Broken> {
    let function = &call.function;
    let reply = process.receive().map_err(Broken::Io)?;
    Ok(match reply.kind {
        protocol::OUTPUTS => protocol::decode_outputs(&reply.body),
        protocol::KEEP => match reply.body.first() {
            Some(1) => Ok(vec![call.input.clone()]),
            Some(0) => Ok(Vec::new()),
            _ => return Err(Broken::Protocol("a KEEP reply without its verdict".into())),
        },
        protocol::ERROR => {
            let e = remote_exception(&reply.body)?;
            Err(DatasetError::Python(Box::new(PythonException {
                type_module: e.type_module,
                type_name: e.type_name,
                message: e.message,
                traceback: e.traceback,
                function: function.name.clone(),
            })))
        }
        other => return Err(unexpected(other, "CALL")),
    })
}

fn remote_exception(body: &[u8]) -> Result<RemoteException, Broken> {
    serde_json::from_slice(body)
        .map_err(|e| Broken::Protocol(format!("an exception report that is not JSON: {e}")))
}

fn unexpected(kind: u8, request: &str) -> Broken {
    Broken::Protocol(format!("a reply of kind {kind:#x} to a {request}"))
}
