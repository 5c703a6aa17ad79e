//! A worker's port with gRPC and raw fetch clients on it: tasks run in this process (added to
//! the worker's state directly, their definitions served by a fake dispatcher), served as
//! `WorkerHandle` serves (`serve_port`). The helpers serve `port_security_tests` too.

use super::*;
use crate::config::WorkerConfig;
use crate::cross_trainer_cache::EMPTY_TRAINER_ID;
use crate::task_runner::{TaskResources, TaskRunner};
use sluice_element::{Element, Tensor};
use sluice_pipeline::{Dataset, Transform};
use sluice_proto::dispatcher::{Compression, ShardingPolicy, TaskDef};
use sluice_proto::worker::worker_client::WorkerClient;
use sluice_proto::worker::{ElementBatch, GetWorkerTasksRequest};
use sluice_rpc::fake_dispatcher::FakeDispatcher;
use sluice_rpc::raw_fetch;
use sluice_rpc::DispatcherClient;
use sluice_security::{AuthChannel, ClientSecurity, FetchKey};
use std::net::SocketAddr;
use tokio::net::TcpStream;
use tonic::Code;
use tracing::info;

/// Long enough for a loaded machine; tests wait on their conditions, never this long.
pub(super) const DEADLINE: Duration = Duration::from_secs(20);
/// Rows of the large-element task, 256 KiB of float32 each (large enough to travel as payloads).
const LARGE_ROWS: usize = 6;
const LARGE_FLOATS: usize = 65_536;

pub(super) struct Worker {
    pub(super) addr: SocketAddr,
    pub(super) state: Arc<WorkerState>,
    cancel: CancellationToken,
    _tasks: JoinSet<()>,
    /// Serves the tasks' definitions.
    dispatcher: FakeDispatcher,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.state.cancel_all();
    }
}

/// A task of its own dataset: the assignment and the definition the dispatcher serves.
pub(super) struct Held {
    pub(super) def: TaskDef,
    /// `None`: the dispatcher does not know the dataset.
    dataset: Option<Dataset>,
}

pub(super) fn task(task_id: u64, dataset: Dataset) -> Held {
    Held {
        def: TaskDef {
            task_id,
            dataset_id: format!("dataset-{task_id}"),
            sharding_policy: ShardingPolicy::Off as i32,
            compression: Compression::None as i32,
            ..Default::default()
        },
        dataset: Some(dataset),
    }
}

fn large_tensor() -> Tensor {
    let floats: Vec<f32> = (0..LARGE_ROWS * LARGE_FLOATS).map(|i| i as f32).collect();
    Tensor::from_f32s(vec![LARGE_ROWS, LARGE_FLOATS], &floats).expect("a valid tensor")
}

/// An open worker on 127.0.0.1 port 0 holding `tasks`.
pub(super) async fn start(tasks: Vec<Held>) -> Worker {
    start_with(tasks, &ServerSecurity::default()).await
}

/// A worker on 127.0.0.1 port 0 holding `tasks`, its port secured by `security`, knowing the
/// fetch key [`test_key`] as if the dispatcher had sent it.
pub(super) async fn start_with(tasks: Vec<Held>, security: &ServerSecurity) -> Worker {
    start_keyed(tasks, security, Some(test_key())).await
}

/// The fetch key of the tests' workers.
pub(super) fn test_key() -> FetchKey {
    FetchKey::from_bytes(&[7; 32]).expect("32 bytes")
}

/// A worker holding `tasks`, secured by `security`, that heard `key` from the dispatcher,
/// whose reports of finished tasks the dispatcher records at once.
pub(super) async fn start_keyed(
    tasks: Vec<Held>,
    security: &ServerSecurity,
    key: Option<FetchKey>,
) -> Worker {
    let (worker, reports) = start_reporting(tasks, security, key).await;
    confirming(worker, reports)
}

/// `worker`, whose reports of finished tasks the dispatcher records at once.
fn confirming(worker: Worker, mut reports: mpsc::UnboundedReceiver<u64>) -> Worker {
    let state = worker.state.clone();
    tokio::spawn(async move {
        while let Some(task_id) = reports.recv().await {
            state.confirm(&[task_id]);
        }
    });
    worker
}

/// `start_keyed`, with the worker's reports of finished tasks handed to the caller, who
/// records them at the dispatcher's place (`WorkerState::confirm`) when it chooses.
pub(super) async fn start_reporting(
    tasks: Vec<Held>,
    security: &ServerSecurity,
    key: Option<FetchKey>,
) -> (Worker, mpsc::UnboundedReceiver<u64>) {
    start_sharing(tasks, security, key, true).await
}

/// `start_reporting`, offering local readers shared memory regions or not (`share`).
async fn start_sharing(
    tasks: Vec<Held>,
    security: &ServerSecurity,
    key: Option<FetchKey>,
    share: bool,
) -> (Worker, mpsc::UnboundedReceiver<u64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("bound");
    let (completed, reports) = mpsc::unbounded_channel();
    let state = Arc::new(WorkerState::new(addr.to_string(), completed).sharing_memory(share));
    if let Some(key) = key {
        state.set_fetch_key(key);
    }
    let mut serving = JoinSet::new();
    // Only asked for definitions: the tasks run in mode OFF.
    let fake = FakeDispatcher::leader(0).await;
    let dispatcher = DispatcherClient::new(&fake.addr()).expect("a valid address");
    for held in tasks {
        if let Some(dataset) = held.dataset {
            fake.add_dataset(&held.def.dataset_id, dataset.into_def());
        }
        state.add(TaskRunner::new(
            held.def,
            dispatcher.clone(),
            tokio::runtime::Handle::current(),
            WorkerConfig::default(),
            addr.to_string(),
            TaskResources {
                data_roots: sluice_formats::DataRoots::none(),
                python: None,
                memory: sluice_executor::MemoryBudget::new(u64::MAX, "--memory-budget"),
                stats: Default::default(),
            },
        ));
    }
    let cancel = CancellationToken::new();
    serve_port(
        listener,
        security,
        state.clone(),
        Default::default(),
        cancel.clone(),
        &mut serving,
    )
    .expect("serve");
    let worker = Worker {
        addr,
        state,
        cancel,
        _tasks: serving,
        dispatcher: fake,
    };
    (worker, reports)
}

/// A request of reader 1, admitted to iteration 0 (the iteration of the tests' tasks).
pub(super) fn request(task_id: u64, credits: u32) -> FetchRequest {
    FetchRequest {
        task_id,
        credits,
        client_id: 1,
        admission: test_key().admit(0, 1).to_bytes(),
        ..Default::default()
    }
}

/// The elements a message carries, still encoded.
pub(super) fn packed(batch: &ElementBatch) -> sluice_element::Packed {
    sluice_element::Packed::from_wire(
        batch.packed.clone(),
        batch.lengths.clone(),
        batch.each_length,
        batch.payloads.clone(),
    )
    .expect("well-formed elements")
}

pub(super) fn decode(batch: ElementBatch) -> Vec<Element> {
    packed(&batch)
        .into_decoder()
        .map(|e| e.expect("an element"))
        .collect()
}

/// Reads a task to its end over a raw fetch stream, granting back each batch's credits; the
/// status the stream ends with otherwise.
async fn read_raw(addr: SocketAddr, task_id: u64, credits: u32) -> Result<Vec<Element>, Status> {
    read_raw_as(&ClientSecurity::default(), addr, task_id, credits).await
}

/// The same, presenting `security`'s TLS settings and token. A connection that fails (TLS
/// handshake) is `Unavailable` with the I/O error.
pub(super) async fn read_raw_as(
    security: &ClientSecurity,
    addr: SocketAddr,
    task_id: u64,
    credits: u32,
) -> Result<Vec<Element>, Status> {
    read_raw_with(security, addr, request(task_id, credits)).await
}

/// The same, opening the stream with `first` (its credits are the stream's).
pub(super) async fn read_raw_with(
    security: &ClientSecurity,
    addr: SocketAddr,
    first: FetchRequest,
) -> Result<Vec<Element>, Status> {
    let (task_id, credits) = (first.task_id, first.credits);
    let socket = raw_fetch::connect(&addr.to_string(), security)
        .await
        .map_err(|e| Status::unavailable(format!("connect: {e}")))?;
    let token = security.token().map(|t| t.expose().as_bytes());
    let (requests, mut batches) = raw_fetch::open(socket, token, first, credits)
        .await
        .map_err(|e| Status::unavailable(format!("open: {e}")))?;
    let mut elements = Vec::new();
    loop {
        let batch = tokio::time::timeout(DEADLINE, batches.message())
            .await
            .expect("a batch in time")?
            .expect("no end before the end of sequence");
        assert!(batch.error.is_empty(), "{}", batch.error);
        let n = packed(&batch).len();
        assert!(n <= credits as usize, "{n} elements for {credits} credits");
        let end = batch.end_of_sequence;
        elements.extend(decode(batch));
        if end {
            return Ok(elements);
        }
        requests
            .send(request(task_id, n as u32))
            .await
            .expect("the stream is open");
    }
}

/// The same over gRPC `Fetch`, with all credits at once.
async fn read_grpc(addr: SocketAddr, task_id: u64) -> Result<Vec<Element>, Status> {
    read_grpc_as(&ClientSecurity::default(), addr, task_id).await
}

/// A gRPC client of the worker at `addr` presenting `security`; a failed connection (TLS
/// handshake) is `Unavailable`.
pub(super) async fn grpc_client(
    security: &ClientSecurity,
    addr: SocketAddr,
) -> Result<WorkerClient<AuthChannel>, Status> {
    let endpoint = security
        .endpoint(&addr.to_string())
        .expect("a valid address");
    let channel = security
        .connect(&endpoint, sluice_security::ServerRole::Worker)
        .await
        .map_err(|e| Status::unavailable(format!("connect: {e:?}")))?;
    Ok(WorkerClient::new(security.authed(channel)))
}

/// `read_grpc`, presenting `security`.
pub(super) async fn read_grpc_as(
    security: &ClientSecurity,
    addr: SocketAddr,
    task_id: u64,
) -> Result<Vec<Element>, Status> {
    read_grpc_with(security, addr, request(task_id, 1 << 20)).await
}

/// `read_grpc`, opening the stream with `first`.
pub(super) async fn read_grpc_with(
    security: &ClientSecurity,
    addr: SocketAddr,
    first: FetchRequest,
) -> Result<Vec<Element>, Status> {
    let mut worker = grpc_client(security, addr).await?;
    let (tx, rx) = mpsc::channel(1);
    tx.send(first).await.expect("open");
    let mut stream = worker.fetch(ReceiverStream::new(rx)).await?.into_inner();
    let mut elements = Vec::new();
    loop {
        let batch = tokio::time::timeout(DEADLINE, stream.message())
            .await
            .expect("a batch in time")?
            .expect("no end before the end of sequence");
        let end = batch.end_of_sequence;
        elements.extend(decode(batch));
        if end {
            return Ok(elements);
        }
    }
}

pub(super) fn ints(elements: &[Element]) -> Vec<i64> {
    elements
        .iter()
        .map(|e| e.as_i64().expect("an integer"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_and_raw_clients_share_the_port() {
    let worker = start(vec![
        task(1, Dataset::range(50)),
        task(2, Dataset::from_slices(large_tensor())),
        task(3, Dataset::range(3000)),
    ])
    .await;

    info!("--- a silent connection holds up no one");
    let _silent = TcpStream::connect(worker.addr).await.expect("connect");

    info!("--- gRPC calls and raw streams at once");
    let mut grpc = WorkerClient::connect(format!("http://{}", worker.addr))
        .await
        .expect("connect");
    let tasks = grpc
        .get_worker_tasks(GetWorkerTasksRequest {})
        .await
        .expect("served")
        .into_inner()
        .task_ids;
    assert_eq!(tasks, [1, 2, 3]);
    let (over_grpc, large, tiny) = tokio::join!(
        read_grpc(worker.addr, 1),
        read_raw(worker.addr, 2, 2),
        read_raw(worker.addr, 3, 64),
    );
    assert_eq!(ints(&over_grpc.expect("read")), (0..50).collect::<Vec<_>>());
    assert_eq!(ints(&tiny.expect("read")), (0..3000).collect::<Vec<_>>());
    let large = large.expect("read");
    let want: Vec<Element> = (0..LARGE_ROWS)
        .map(|i| Element::Tensor(large_tensor().slice(i).expect("a row")))
        .collect();
    assert!(large == want, "the large rows arrive intact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_the_workers_machine_reads_large_payloads_from_shared_memory() {
    let rows = || Dataset::from_slices(large_tensor());
    let want_rows: Vec<Element> = (0..LARGE_ROWS)
        .map(|i| Element::Tensor(large_tensor().slice(i).expect("a row")))
        .collect();
    // Pairs travel in the frame's packed elements rather than as payloads.
    let pairs = || Dataset::zip(vec![rows(), Dataset::range(LARGE_ROWS as i64)]);
    let want_pairs: Vec<Element> = want_rows
        .iter()
        .zip(0..)
        .map(|(row, i)| Element::Tuple(vec![row.clone(), Element::Tensor(Tensor::scalar_i64(i))]))
        .collect();
    let row_bytes = (LARGE_FLOATS * 4) as u64;
    // (dataset, worker shares memory, reader asks for it, rows that must come through the
    // region): the first batch may leave before the reader mapped the region.
    let cases = [
        ("rows", true, true, LARGE_ROWS as u64 - 2),
        ("rows", true, false, 0),
        ("rows", false, true, 0),
        ("pairs", true, true, LARGE_ROWS as u64 - 2),
    ];
    for (dataset, share, ask, at_least) in cases {
        info!(dataset, share, ask, "--- a local reader");
        let (source, want) = match dataset {
            "rows" => (rows(), &want_rows),
            _ => (pairs(), &want_pairs),
        };
        let (worker, reports) = start_sharing(
            vec![task(2, source)],
            &ServerSecurity::default(),
            Some(test_key()),
            share,
        )
        .await;
        let worker = confirming(worker, reports);
        let first = FetchRequest {
            shared_memory: ask,
            ..request(2, 2)
        };
        let got = read_raw_with(&ClientSecurity::default(), worker.addr, first)
            .await
            .expect("read");
        assert!(
            &got == want,
            "{dataset} arrive intact (share {share}, ask {ask})"
        );
        let shared = worker.state.stats.shared_memory_bytes();
        assert!(
            shared >= at_least * row_bytes && (at_least > 0 || shared == 0),
            "{dataset}: {shared} bytes through shared memory (share {share}, ask {ask})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_read_as_the_same_status_on_both_transports() {
    let worker = start(vec![task(5, Dataset::range(10)), {
        let mut cached = task(7, Dataset::range(10).repeat_forever());
        cached.def.use_cross_trainer_cache = true;
        cached
    }])
    .await;
    worker.state.delete_local(5); // a client in this process went away: later reads fail
    worker.state.delete(6); // the dispatcher deleted it: finished

    info!("--- not found, deleted, a bad first request: the same status either way");
    for (task_id, code) in [
        (999, Code::Unavailable),
        (5, Code::FailedPrecondition),
        (7, Code::InvalidArgument),
    ] {
        let raw = read_raw(worker.addr, task_id, 4).await.unwrap_err();
        let grpc = read_grpc(worker.addr, task_id).await.unwrap_err();
        assert_eq!((raw.code(), raw.message()), (code, grpc.message()));
        assert_eq!(grpc.code(), code);
    }
    let deleted = read_raw(worker.addr, 5, 4).await.unwrap_err();
    assert_eq!(
        deleted.message(),
        format!(
            "Got request for local task 5 of worker {}, which has been deleted. You may be \
             creating a duplicate iteration which has already finished. To fix this, make sure \
             to create your dataset only once, as opposed to re-creating it repeatedly inside a \
             loop.",
            worker.addr
        )
    );
    assert_eq!(
        read_raw(worker.addr, 999, 4).await.unwrap_err().message(),
        "Task 999 not found"
    );
    assert_eq!(
        read_raw(worker.addr, 7, 4).await.unwrap_err().message(),
        EMPTY_TRAINER_ID
    );

    info!("--- a finished task: just the end of sequence");
    assert_eq!(read_raw(worker.addr, 6, 4).await.expect("the end"), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_peer_is_cut_off_and_the_port_keeps_serving() {
    let worker = start(vec![task(1, Dataset::range(100))]).await;

    info!("--- the magic, no token, then a request length past the bound: a status frame");
    let mut socket = TcpStream::connect(worker.addr).await.expect("connect");
    socket.write_all(&MAGIC).await.expect("write");
    socket.write_all(&0u32.to_le_bytes()).await.expect("write");
    socket
        .write_all(&u32::MAX.to_le_bytes())
        .await
        .expect("write");
    let mut frames = raw_frame::FrameReader::new(socket, 4);
    let status = tokio::time::timeout(DEADLINE, frames.next())
        .await
        .expect("an answer in time")
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");

    info!("--- another protocol version: a status frame naming both");
    let mut socket = TcpStream::connect(worker.addr).await.expect("connect");
    socket.write_all(b"SLUICE\x00\x01").await.expect("write");
    let mut frames = raw_frame::FrameReader::new(socket, 4);
    let status = tokio::time::timeout(DEADLINE, frames.next())
        .await
        .expect("an answer in time")
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    assert!(status.message().contains("version 1"), "{status}");

    info!("--- a near-miss of the magic: dropped");
    let mut socket = TcpStream::connect(worker.addr).await.expect("connect");
    socket.write_all(b"SLUICX\x00\x02").await.expect("write");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(DEADLINE, socket.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "the worker closes the connection");

    info!("--- the magic and an empty token, then silence: closed after the handshake deadline");
    let mut socket = TcpStream::connect(worker.addr).await.expect("connect");
    socket.write_all(&MAGIC).await.expect("write");
    socket.write_all(&0u32.to_le_bytes()).await.expect("write");
    let n = tokio::time::timeout(DEADLINE, socket.read(&mut buf))
        .await
        .expect("closed in time, not held open")
        .unwrap_or(0);
    assert_eq!(n, 0, "the worker closes the silent connection");

    info!("--- both transports still serve");
    assert_eq!(
        ints(&read_raw(worker.addr, 1, 8).await.expect("read")).len(),
        100
    );
    let mut grpc = WorkerClient::connect(format!("http://{}", worker.addr))
        .await
        .expect("connect");
    grpc.get_worker_tasks(GetWorkerTasksRequest {})
        .await
        .expect("served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cuts_open_raw_streams() {
    let worker = start(vec![task(1, Dataset::range(10).repeat_forever())]).await;
    let socket = raw_fetch::connect(&worker.addr.to_string(), &ClientSecurity::default())
        .await
        .expect("connect");
    let (_requests, mut batches) = raw_fetch::open(socket, None, request(1, 4), 4)
        .await
        .expect("open");
    let first = tokio::time::timeout(DEADLINE, batches.message())
        .await
        .expect("a batch in time")
        .expect("a batch")
        .expect("open");
    assert!(!packed(&first).is_empty());

    info!("--- the worker stops: the stream ends without its end of sequence");
    worker.cancel.cancel();
    let mut elements = packed(&first).len();
    // Batches already on their way may still arrive, within the credits granted; then the
    // stream ends (closed or broken).
    while let Ok(Some(batch)) = tokio::time::timeout(DEADLINE, batches.message())
        .await
        .expect("cut in time")
    {
        assert!(!batch.end_of_sequence, "an infinite task has no end");
        elements += packed(&batch).len();
        assert!(elements <= 4, "{elements} elements for 4 credits");
    }
}

/// The first message of a fetch stream of `task_id` over gRPC, and over a raw stream.
async fn first_batches(addr: SocketAddr, task_id: u64) -> (ElementBatch, ElementBatch) {
    let mut worker = grpc_client(&ClientSecurity::default(), addr)
        .await
        .expect("connect");
    let (tx, rx) = mpsc::channel(1);
    tx.send(request(task_id, 8)).await.expect("open");
    let mut stream = worker
        .fetch(ReceiverStream::new(rx))
        .await
        .expect("served")
        .into_inner();
    let grpc = tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("a batch in time")
        .expect("a batch, not a status")
        .expect("a batch before the end");
    let socket = raw_fetch::connect(&addr.to_string(), &ClientSecurity::default())
        .await
        .expect("connect");
    let (_requests, mut batches) = raw_fetch::open(socket, None, request(task_id, 8), 8)
        .await
        .expect("open");
    let raw = tokio::time::timeout(DEADLINE, batches.message())
        .await
        .expect("a batch in time")
        .expect("a batch, not a status")
        .expect("a batch before the end");
    (grpc, raw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_definition_cannot_be_fetched_fails_naming_the_dataset() {
    let mut unknown = task(3, Dataset::range(5));
    unknown.dataset = None;
    let worker = start(vec![task(1, Dataset::range(5)), unknown]).await;

    info!("--- the definition is fetched by id when the task starts");
    assert_eq!(
        ints(&read_grpc(worker.addr, 1).await.expect("the task")),
        vec![0, 1, 2, 3, 4]
    );
    assert_eq!(worker.dispatcher.calls("get_dataset"), 1);

    info!("--- an unknown dataset is the task's error, on both transports");
    let (grpc, raw) = first_batches(worker.addr, 3).await;
    for batch in [grpc, raw] {
        assert_eq!(
            batch.error,
            "task 3: could not fetch the definition of dataset dataset-3: Dataset id dataset-3 \
             not found"
        );
    }
    assert_eq!(worker.dispatcher.calls("get_dataset"), 2, "once per task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_functions_exception_reaches_readers_of_both_transports_intact() {
    let worker = start(vec![task(9, Dataset::range(10).repeat_forever())]).await;
    let exception = sluice_element::PythonException {
        type_module: "builtins".into(),
        type_name: "ValueError".into(),
        message: "bad pixel".into(),
        traceback:
            "Traceback (most recent call last):\n  File \"aug.py\", line 7, in augment\n    \
                    raise ValueError(\"bad pixel\")\nValueError: bad pixel\n"
                .into(),
        function: "aug.augment".into(),
    };
    let failure = crate::TaskFailure::from(sluice_element::DatasetError::Python(Box::new(
        exception.clone(),
    )));
    worker.state.get(9).expect("the task").set_error(failure);

    info!("--- the failed task's first message carries the exception beside the text");
    let (grpc, raw) = first_batches(worker.addr, 9).await;
    for batch in [grpc, raw] {
        assert_eq!(
            batch.error,
            "python function 'aug.augment' raised ValueError: bad pixel"
        );
        let got = batch.python_exception.expect("the exception");
        assert_eq!(sluice_element::PythonException::from_proto(got), exception);
    }

    info!("--- another task's failure carries none");
    let plain = start(vec![task(10, Dataset::range(10).repeat_forever())]).await;
    plain
        .state
        .get(10)
        .expect("the task")
        .set_error("a file went away".into());
    let (grpc, raw) = first_batches(plain.addr, 10).await;
    for batch in [grpc, raw] {
        assert_eq!(batch.error, "a file went away");
        assert_eq!(batch.python_exception, None);
    }
}

/// A reader that saw a task's end knows the dispatcher recorded it: the worker sends the end
/// only once its report is taken. Otherwise a worker killed between the two, restarted at the
/// same address, is given the task again and runs it with no reader left for it, and the
/// iteration never finishes.
#[tokio::test]
async fn the_end_of_an_at_most_once_task_waits_for_the_dispatcher_to_record_it() {
    let (worker, mut reports) = start_reporting(
        vec![task(1, Dataset::range(3))],
        &ServerSecurity::default(),
        Some(test_key()),
    )
    .await;
    let mut read = tokio::spawn(read_raw(worker.addr, 1, 16));
    let reported = tokio::time::timeout(DEADLINE, reports.recv())
        .await
        .expect("the task's end is reported");
    assert_eq!(reported, Some(1));
    // Only a worker that sends the end unrecorded lets the read finish now.
    let early = tokio::time::timeout(Duration::from_millis(300), &mut read).await;
    assert!(
        early.is_err(),
        "the end went out before the dispatcher recorded it"
    );
    worker.state.confirm(&[1]);
    let elements = tokio::time::timeout(DEADLINE, read)
        .await
        .expect("the end arrives once recorded")
        .expect("the reader task")
        .expect("the read");
    assert_eq!(ints(&elements), vec![0, 1, 2]);
}
