//! `ExecutorPool`: a worker's pool of Python executor processes, the `PythonRunner` of its
//! pipelines.
//!
//! Calls of every task and every function go into one FIFO; one thread per executor takes the
//! next calls and keeps up to `BATCHES_IN_FLIGHT` of them sent ahead of their replies, so all
//! executors stay busy whichever tasks produce work, and none waits for its thread between
//! calls. A function is known by its pickle's content and is loaded into an executor
//! (LOAD, unpickling there) before its first call on that executor, never per element; each
//! executor keeps at most `MAX_LOADED` functions, unloading the least recently used.
//!
//! Batches: the stage hands a function's inputs over in batches (`call_batch`), each one frame
//! to an executor (BATCH) and one frame back (RESULTS, a result per element, in order). The
//! size it is asked for (`batch_size`) is each function's own, re-chosen after every batch
//! from the executor's measure of it and the batch's bytes (`batch_size::next_batch_size`): 1
//! at first, growing while a batch is short and small, 1 for a function that takes 20 ms or
//! more per element or whose elements are a megabyte.
//!
//! Failure containment: an executor that dies during a call (os._exit, a segfault, a kill)
//! fails that call with `DatasetError::PythonRuntime` and is restarted by its thread; other
//! calls, tasks and the worker go on. A call sent behind the fatal one never started (an
//! executor runs one call at a time) and is sent again to the new executor. An executor that
//! dies during a batch of several elements does not say which element killed it (and its
//! results so far are lost with it): the batch's elements are sent again one per batch, so the
//! element that kills an executor again is the one whose call fails, as without batches, and
//! the function's batch size goes back to 1. (The elements before it in the batch run twice;
//! their outputs are delivered once.) A call whose receiver is gone (its task was cancelled)
//! still runs, and its result is dropped.
//!
//! Shutdown: when the pool and every function prepared from it are dropped, the FIFO closes,
//! running executors are killed, and each thread reaps its executor and ends.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_element::pb::{PyFunctionKind, PyFunctionOp};
use sluice_element::{
    CallResult, DatasetError, Element, PythonException, PythonFunction, PythonRunner,
};
use tracing::{info, warn};

use crate::batch_size::next_batch_size;
use crate::error::PoolError;
use crate::executor_process::{describe_exit, ExecutorProcess, BATCHES_IN_FLIGHT};
use crate::pool_config::PoolConfig;
use crate::protocol::{self, RemoteException};

/// Functions an executor keeps loaded at most.
pub const MAX_LOADED: usize = 64;

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
    /// The batch size the stage is asked for (`next_batch_size` of the last batch's measure).
    batch: AtomicUsize,
}

/// A batch of calls of one function: the inputs and, for each, where its result goes.
struct Call {
    function: Arc<Function>,
    inputs: Vec<Element>,
    replies: Vec<mpsc::Sender<CallResult>>,
}

impl Call {
    /// Answers every call of the batch with `error`. A dropped receiver: the task is gone; the
    /// result is not wanted.
    fn fail(self, error: DatasetError) {
        for reply in self.replies {
            let _ = reply.send(Err(error.clone()));
        }
    }

    /// The batch as batches of one element each, in order.
    fn split(self) -> Vec<Call> {
        let function = self.function;
        self.inputs
            .into_iter()
            .zip(self.replies)
            .map(|(input, reply)| Call {
                function: function.clone(),
                inputs: vec![input],
                replies: vec![reply],
            })
            .collect()
    }
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
                batch: AtomicUsize::new(1),
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
        self.call_batch(vec![input])
            .pop()
            .expect("a receiver per input")
    }

    fn call_batch(&self, inputs: Vec<Element>) -> Vec<mpsc::Receiver<CallResult>> {
        if inputs.is_empty() {
            return Vec::new();
        }
        let (replies, receivers) = inputs.iter().map(|_| mpsc::channel()).unzip();
        let call = Call {
            function: self.function.clone(),
            inputs,
            replies,
        };
        if let Err(flume::SendError(call)) = self.shared.calls.send(call) {
            call.fail(DatasetError::PythonRuntime(format!(
                "python function '{}': the worker's executors have stopped",
                self.function.name
            )));
        }
        receivers
    }

    fn parallelism(&self) -> usize {
        self.shared.executors
    }

    fn batch_size(&self) -> usize {
        self.function.batch.load(Ordering::Relaxed).max(1)
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
    /// Feeds the executor from `queue`, keeping up to `BATCHES_IN_FLIGHT` calls sent ahead of
    /// their replies, so the executor starts its next call as soon as it has written a reply
    /// rather than after this thread has read it and sent another (on a busy machine that
    /// thread may wait for a core first). Replies come in request order.
    fn serve(mut self, queue: flume::Receiver<Call>) {
        let mut sent: VecDeque<Call> = VecDeque::new();
        // Calls to send before new ones: those sent to an executor that died before it
        // reached them (it runs calls one at a time, so they never started).
        let mut resend: VecDeque<Call> = VecDeque::new();
        loop {
            while sent.len() < BATCHES_IN_FLIGHT {
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

    /// Reads the reply to the oldest batch in `sent` and hands each result to its caller. If
    /// the executor died running it, that batch fails (or goes again element by element, see
    /// `died_running`), and the batches behind it (which never started there) go to the front
    /// of `resend`.
    fn answer_oldest(&mut self, sent: &mut VecDeque<Call>, resend: &mut VecDeque<Call>) {
        let Some(call) = sent.pop_front() else {
            return;
        };
        match self.process.as_mut().map(|p| receive(p, &call)) {
            Some(Ok(results)) => {
                for (reply, result) in call.replies.into_iter().zip(results) {
                    // A dropped receiver: the task is gone; the result is not wanted.
                    let _ = reply.send(result);
                }
            }
            Some(Err(broken)) => {
                for stranded in sent.drain(..).rev() {
                    resend.push_front(stranded);
                }
                self.died_running(call, broken, resend);
            }
            None => {
                let error = DatasetError::PythonRuntime(format!(
                    "python function '{}': no executor",
                    call.function.name
                ));
                call.fail(error);
            }
        }
    }

    /// The executor died (`broken`) running `call`. A batch of one fails with the death; a
    /// larger batch goes again at the front of `resend`, one element per batch, and its
    /// function's batch size drops to 1.
    fn died_running(&mut self, call: Call, broken: Broken, resend: &mut VecDeque<Call>) {
        let error = self.died(&call.function.name, broken);
        if call.inputs.len() <= 1 {
            return call.fail(error);
        }
        call.function.batch.store(1, Ordering::Relaxed);
        for single in call.split().into_iter().rev() {
            resend.push_front(single);
        }
    }

    /// Sends `call` (after loading its function, which first takes every reply still due) and
    /// queues it in `sent`, or answers it with the error it gets instead (its function did not
    /// load, or there is no executor). Calls of `sent` stranded by an executor's death go to
    /// `resend`.
    fn send(&mut self, call: Call, sent: &mut VecDeque<Call>, resend: &mut VecDeque<Call>) {
        let name = call.function.name.clone();
        let fail = |call: Call, error: DatasetError| call.fail(error);
        if self.process.is_none() {
            if let Err(e) = self.restart() {
                let error = DatasetError::PythonRuntime(format!("python function '{name}': {e}"));
                return fail(call, error);
            }
        }
        let bytes = request_bytes(&call);
        let fills_pipe = self
            .process
            .as_ref()
            .is_none_or(|p| !p.fits_shared(bytes) && bytes > p.ahead_bytes);
        if !self.loaded.contains(&call.function.id) || fills_pipe {
            // A LOAD's reply must be read before the call is sent, and a request larger than
            // the pipe holds must not be written into it while the executor may be writing a
            // reply (see `ExecutorProcess::ahead_bytes`): finish what is in flight.
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
                    resend.push_back(call);
                    for stranded in sent.drain(..).rev() {
                        resend.push_front(stranded);
                    }
                    self.died_running(running, broken, resend);
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

/// About the bytes of `call`'s BATCH frame: its elements' payloads, and a bound on what the
/// encoding adds per element (lengths, shapes).
fn request_bytes(call: &Call) -> usize {
    call.inputs
        .iter()
        .map(|e| e.byte_size().saturating_add(256))
        .fold(16, usize::saturating_add)
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
    let pieces = match protocol::encode_batch(&call.inputs) {
        Ok(pieces) => pieces,
        Err(error) => return Ok(Some(error)),
    };
    process.send_batch(&head, &pieces).map_err(Broken::Io)?;
    Ok(None)
}

/// Reads the reply to `call`, the oldest batch sent and not answered: a result per input, in
/// order. Re-sizes the function's batches from the executor's measure.
fn receive(process: &mut ExecutorProcess, call: &Call) -> Result<Vec<CallResult>, Broken> {
    let function = &call.function;
    let reply = process
        .receive_batch()
        .map_err(Broken::Io)?
        .map_err(Broken::Protocol)?;
    let body = match reply.kind {
        protocol::RESULTS => reply.body,
        // The batch itself could not be read: every element fails with why.
        protocol::ERROR => {
            let error = exception(function, &reply.body)?;
            return Ok(call.inputs.iter().map(|_| Err(error.clone())).collect());
        }
        other => return Err(unexpected(other, "BATCH")),
    };
    let batch = protocol::decode_results(&body).map_err(|e| Broken::Protocol(e.to_string()))?;
    if batch.results.len() != call.inputs.len() {
        return Err(Broken::Protocol(format!(
            "{} results to a batch of {}",
            batch.results.len(),
            call.inputs.len()
        )));
    }
    let current = function.batch.load(Ordering::Relaxed);
    let elapsed = Duration::from_nanos(batch.nanos);
    let bytes = request_bytes(call).saturating_add(body.len());
    function.batch.store(
        next_batch_size(current, call.inputs.len(), elapsed, bytes),
        Ordering::Relaxed,
    );
    call.inputs
        .iter()
        .zip(batch.results)
        .map(|(input, (kind, body))| {
            Ok(match kind {
                protocol::OUTPUTS => protocol::decode_outputs(&body),
                protocol::KEEP => match body.first() {
                    Some(1) => Ok(vec![input.clone()]),
                    Some(0) => Ok(Vec::new()),
                    _ => return Err(Broken::Protocol("a KEEP result without its verdict".into())),
                },
                protocol::ERROR => Err(exception(function, &body)?),
                other => return Err(unexpected(other, "BATCH's element")),
            })
        })
        .collect()
}

/// What a call of `function` raised, from its ERROR body.
fn exception(function: &Function, body: &[u8]) -> Result<DatasetError, Broken> {
    let e = remote_exception(body)?;
    Ok(DatasetError::Python(Box::new(PythonException {
        type_module: e.type_module,
        type_name: e.type_name,
        message: e.message,
        traceback: e.traceback,
        function: function.name.clone(),
    })))
}

fn remote_exception(body: &[u8]) -> Result<RemoteException, Broken> {
    serde_json::from_slice(body)
        .map_err(|e| Broken::Protocol(format!("an exception report that is not JSON: {e}")))
}

fn unexpected(kind: u8, request: &str) -> Broken {
    Broken::Protocol(format!("a reply of kind {kind:#x} to a {request}"))
}
