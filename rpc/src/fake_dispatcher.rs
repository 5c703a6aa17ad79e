//! `FakeDispatcher`: a stand-in for one dispatcher replica, served over real gRPC on
//! `127.0.0.1:0`, for tests of the transport (leader following) and of the worker's split
//! leaser (prefetch, growth, lost replies).
//!
//! A follower answers every RPC `Unavailable` with its leader's address in `x-sluice-leader`, as
//! a real replica that is not the leader does. A leader serves `lease_splits` and
//! `lease_splits_batch` with the real dispatcher's at-most-once contract: a lease is recorded
//! before the reply leaves, and a request id seen before gets the recorded lease back. It can be
//! told to lose replies (record the leases, answer `Unavailable`), as a reply lost in a failover
//! is, or to answer batches `Unimplemented`, as a dispatcher older than them does.
//! `get_status` answers `{}`, or a chosen refusal. `get_dataset` serves the definitions a test put in
//! (`add_dataset`), `NotFound` for others. `watch_leader` streams the leader (itself, or the one
//! a follower points at) in the replica's term, at once and at every term change. A replica can be frozen: from then on it
//! answers nothing, as a stopped process whose port still accepts connections. Every other
//! RPC is `Unimplemented`: tests here need no more.

use crate::convert::lease_splits_result;
use sluice_proto::dispatcher as pb;
use sluice_proto::dispatcher::dispatcher_server::{Dispatcher, DispatcherServer};
use sluice_proto::LEADER_METADATA_KEY;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Code, Request, Response, Status};

/// One lease the fake handed out (recorded before its reply left).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantedLease {
    pub request: (u64, u64),
    pub task_id: u64,
    pub max_splits: u32,
    pub repetition: u64,
    pub start: u64,
    pub end: u64,
    pub end_of_splits: bool,
}

#[derive(Default)]
struct Leases {
    /// Next split per (iteration, provider, repetition).
    cursors: HashMap<(u64, u32, u64), u64>,
    /// The recorded outcome per request id: a retry gets it back.
    recorded: HashMap<(u64, u64), pb::LeaseSplitsResponse>,
    granted: Vec<GrantedLease>,
    /// Lease requests received, retries included, by request id.
    received: Vec<(u64, u64)>,
    /// Replies still to lose, of any lease call and of batches only.
    to_lose: u32,
    batches_to_lose: u32,
}

struct Replica {
    /// `Some(leader address)` for a follower.
    leader: Option<String>,
    /// This replica's own address (the leader `watch_leader` names when it leads).
    addr: String,
    /// The term `watch_leader` reports.
    term: watch::Sender<u64>,
    /// A frozen replica answers nothing.
    frozen: AtomicBool,
    /// Whether `lease_splits_batch` is served (a dispatcher older than the batch call is
    /// `Unimplemented` there).
    batches: AtomicBool,
    /// Splits of each provider, per repetition.
    num_splits: u64,
    /// Std mutexes: held only to read or update, never across an `.await`.
    leases: Mutex<Leases>,
    status_refusal: Mutex<Option<Code>>,
    /// The definitions `get_dataset` serves, by dataset id.
    datasets: Mutex<HashMap<String, sluice_proto::dataset::DatasetDef>>,
    /// RPCs received, by name.
    calls: Mutex<HashMap<&'static str, u32>>,
}

/// A fake replica; it stops serving when dropped.
pub struct FakeDispatcher {
    addr: SocketAddr,
    replica: Arc<Replica>,
    server: JoinHandle<()>,
}

impl Drop for FakeDispatcher {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeDispatcher {
    /// A leader whose split providers have `num_splits` splits per repetition.
    pub async fn leader(num_splits: u64) -> FakeDispatcher {
        Self::serve(None, num_splits).await
    }

    /// A follower that points every caller at `leader`.
    pub async fn follower(leader: &str) -> FakeDispatcher {
        Self::serve(Some(leader.to_string()), 0).await
    }

    async fn serve(leader: Option<String>, num_splits: u64) -> FakeDispatcher {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("a bound listener's address");
        let replica = Arc::new(Replica {
            leader,
            addr: addr.to_string(),
            term: watch::channel(1).0,
            frozen: AtomicBool::new(false),
            batches: AtomicBool::new(true),
            num_splits,
            leases: Mutex::default(),
            status_refusal: Mutex::default(),
            datasets: Mutex::default(),
            calls: Mutex::default(),
        });
        let service = DispatcherServer::new(Service(replica.clone()));
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        FakeDispatcher {
            addr,
            replica,
            server,
        }
    }

    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// `watch_leader` reports `term` from now on.
    pub fn set_term(&self, term: u64) {
        self.replica.term.send_replace(term);
    }

    /// From now on every RPC waits forever: the replica accepts calls and answers none.
    pub fn freeze(&self) {
        self.replica.frozen.store(true, Ordering::SeqCst);
    }

    /// From now on `lease_splits_batch` is `Unimplemented`, as on a dispatcher older than it.
    pub fn refuse_batches(&self) {
        self.replica.batches.store(false, Ordering::SeqCst);
    }

    /// Loses the replies of the next `n` lease calls: each lease is recorded, its reply
    /// replaced by `Unavailable`.
    pub fn lose_lease_replies(&self, n: u32) {
        self.replica.leases().to_lose = n;
    }

    /// Loses the replies of the next `n` `lease_splits_batch` calls, as `lose_lease_replies`.
    pub fn lose_batch_replies(&self, n: u32) {
        self.replica.leases().batches_to_lose = n;
    }

    /// `get_status` answers `code` from now on.
    pub fn refuse_status(&self, code: Code) {
        *self
            .replica
            .status_refusal
            .lock()
            .expect("refusal lock poisoned") = Some(code);
    }

    /// `get_dataset(dataset_id)` answers `def` from now on.
    pub fn add_dataset(&self, dataset_id: &str, def: sluice_proto::dataset::DatasetDef) {
        self.replica
            .datasets
            .lock()
            .expect("dataset lock poisoned")
            .insert(dataset_id.to_string(), def);
    }

    /// The leases handed out, in order (a retry that got a recorded lease back is not repeated).
    pub fn granted(&self) -> Vec<GrantedLease> {
        self.replica.leases().granted.clone()
    }

    /// The request ids of every lease request received, retries included, in order.
    pub fn lease_requests(&self) -> Vec<(u64, u64)> {
        self.replica.leases().received.clone()
    }

    /// How many times the RPC `name` (e.g. `"get_status"`) reached this replica.
    pub fn calls(&self, name: &str) -> u32 {
        self.replica
            .calls
            .lock()
            .expect("call count lock poisoned")
            .get(name)
            .copied()
            .unwrap_or(0)
    }
}

impl Replica {
    fn leases(&self) -> std::sync::MutexGuard<'_, Leases> {
        self.leases.lock().expect("lease lock poisoned")
    }

    fn count(&self, name: &'static str) {
        *self
            .calls
            .lock()
            .expect("call count lock poisoned")
            .entry(name)
            .or_default() += 1;
    }

    /// Never returns while the replica is frozen.
    async fn thawed(&self) {
        if self.frozen.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    /// Counts the call and waits while frozen; a follower's answer is the error.
    async fn receive(&self, name: &'static str) -> Result<(), Status> {
        self.count(name);
        self.thawed().await;
        self.follow()
    }

    /// A follower's answer to every call: `Unavailable` naming the leader.
    fn follow(&self) -> Result<(), Status> {
        match &self.leader {
            None => Ok(()),
            Some(leader) => {
                let mut status = Status::unavailable("this dispatcher is not the leader");
                status.metadata_mut().insert(
                    LEADER_METADATA_KEY,
                    leader.parse().expect("an address is valid metadata"),
                );
                Err(status)
            }
        }
    }

    /// Grants (or answers again) one lease; loses the reply when told to.
    fn lease(&self, request: pb::LeaseSplitsRequest) -> Result<pb::LeaseSplitsResponse, Status> {
        let response = self.grant(request)?;
        self.maybe_lose()?;
        Ok(response)
    }

    /// Loses this reply when told to.
    fn maybe_lose(&self) -> Result<(), Status> {
        lose(&mut self.leases().to_lose)
    }

    /// Records a lease before any reply leaves; a request id seen before gets its lease again.
    fn grant(&self, request: pb::LeaseSplitsRequest) -> Result<pb::LeaseSplitsResponse, Status> {
        let id = request
            .request_id
            .map(|id| (id.requester_id, id.seq))
            .ok_or_else(|| Status::invalid_argument("request_id is required"))?;
        let mut leases = self.leases();
        leases.received.push(id);
        let response = match leases.recorded.get(&id) {
            Some(recorded) => *recorded,
            None => {
                let key = (
                    request.iteration_id,
                    request.provider_index,
                    request.repetition,
                );
                let cursor = leases.cursors.entry(key).or_default();
                let start = *cursor;
                let end = (start + u64::from(request.max_splits)).min(self.num_splits);
                *cursor = end;
                let response = pb::LeaseSplitsResponse {
                    start,
                    end,
                    end_of_splits: start >= self.num_splits,
                    repetition: request.repetition,
                };
                leases.recorded.insert(id, response);
                leases.granted.push(GrantedLease {
                    request: id,
                    task_id: request.task_id,
                    max_splits: request.max_splits,
                    repetition: request.repetition,
                    start,
                    end,
                    end_of_splits: response.end_of_splits,
                });
                response
            }
        };
        Ok(response)
    }
}

/// Loses a reply while `to_lose` counts some still to lose.
fn lose(to_lose: &mut u32) -> Result<(), Status> {
    if *to_lose > 0 {
        *to_lose -= 1;
        return Err(Status::unavailable("the reply was lost"));
    }
    Ok(())
}

struct Service(Arc<Replica>);

async fn unimplemented<T>(replica: &Replica, name: &'static str) -> Result<Response<T>, Status> {
    replica.receive(name).await?;
    Err(Status::unimplemented(format!(
        "{name} is not served by the fake dispatcher"
    )))
}

#[tonic::async_trait]
impl Dispatcher for Service {
    async fn register_dataset(
        &self,
        _: Request<pb::RegisterDatasetRequest>,
    ) -> Result<Response<pb::RegisterDatasetResponse>, Status> {
        unimplemented(&self.0, "register_dataset").await
    }

    async fn get_dataset(
        &self,
        request: Request<pb::GetDatasetRequest>,
    ) -> Result<Response<pb::GetDatasetResponse>, Status> {
        self.0.receive("get_dataset").await?;
        let id = request.into_inner().dataset_id;
        let found = self
            .0
            .datasets
            .lock()
            .expect("dataset lock poisoned")
            .get(&id)
            .cloned();
        match found {
            Some(def) => Ok(Response::new(pb::GetDatasetResponse {
                dataset: Some(def),
                metadata: None,
            })),
            None => Err(Status::not_found(format!("Dataset id {id} not found"))),
        }
    }

    async fn get_or_create_job(
        &self,
        _: Request<pb::GetOrCreateJobRequest>,
    ) -> Result<Response<pb::GetOrCreateJobResponse>, Status> {
        unimplemented(&self.0, "get_or_create_job").await
    }

    async fn get_or_create_iteration(
        &self,
        _: Request<pb::GetOrCreateIterationRequest>,
    ) -> Result<Response<pb::GetOrCreateIterationResponse>, Status> {
        unimplemented(&self.0, "get_or_create_iteration").await
    }

    async fn client_heartbeat(
        &self,
        _: Request<pb::ClientHeartbeatRequest>,
    ) -> Result<Response<pb::ClientHeartbeatResponse>, Status> {
        unimplemented(&self.0, "client_heartbeat").await
    }

    async fn release_iteration_client(
        &self,
        _: Request<pb::ReleaseIterationClientRequest>,
    ) -> Result<Response<pb::ReleaseIterationClientResponse>, Status> {
        unimplemented(&self.0, "release_iteration_client").await
    }

    async fn report_delivered(
        &self,
        _: Request<pb::ReportDeliveredRequest>,
    ) -> Result<Response<pb::ReportDeliveredResponse>, Status> {
        unimplemented(&self.0, "report_delivered").await
    }

    async fn save_checkpoint(
        &self,
        _: Request<pb::SaveCheckpointRequest>,
    ) -> Result<Response<pb::SaveCheckpointResponse>, Status> {
        unimplemented(&self.0, "save_checkpoint").await
    }

    async fn worker_heartbeat(
        &self,
        _: Request<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        unimplemented(&self.0, "worker_heartbeat").await
    }

    async fn worker_update(
        &self,
        _: Request<pb::WorkerUpdateRequest>,
    ) -> Result<Response<pb::WorkerUpdateResponse>, Status> {
        unimplemented(&self.0, "worker_update").await
    }

    async fn lease_splits(
        &self,
        request: Request<pb::LeaseSplitsRequest>,
    ) -> Result<Response<pb::LeaseSplitsResponse>, Status> {
        self.0.receive("lease_splits").await?;
        self.0.lease(request.into_inner()).map(Response::new)
    }

    async fn lease_splits_batch(
        &self,
        request: Request<pb::LeaseSplitsBatchRequest>,
    ) -> Result<Response<pb::LeaseSplitsBatchResponse>, Status> {
        let replica = &self.0;
        if !replica.batches.load(Ordering::SeqCst) {
            return unimplemented(replica, "lease_splits_batch").await;
        }
        replica.receive("lease_splits_batch").await?;
        let results = request
            .into_inner()
            .leases
            .into_iter()
            .map(|lease| lease_splits_result(replica.grant(lease)))
            .collect();
        // A lost reply loses the whole call's: every lease in it was recorded.
        lose(&mut replica.leases().batches_to_lose)?;
        replica.maybe_lose()?;
        Ok(Response::new(pb::LeaseSplitsBatchResponse { results }))
    }

    async fn maybe_remove_task(
        &self,
        _: Request<pb::MaybeRemoveTaskRequest>,
    ) -> Result<Response<pb::MaybeRemoveTaskResponse>, Status> {
        unimplemented(&self.0, "maybe_remove_task").await
    }

    async fn get_status(
        &self,
        _: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        self.0.receive("get_status").await?;
        match *self.0.status_refusal.lock().expect("refusal lock poisoned") {
            Some(code) => Err(Status::new(code, "refused by the fake dispatcher")),
            None => Ok(Response::new(pb::GetStatusResponse { json: "{}".into() })),
        }
    }

    type WatchLeaderStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<pb::LeaderUpdate, Status>> + Send>,
    >;

    async fn watch_leader(
        &self,
        _: Request<pb::WatchLeaderRequest>,
    ) -> Result<Response<Self::WatchLeaderStream>, Status> {
        let replica = &self.0;
        replica.count("watch_leader");
        replica.thawed().await;
        let leader = replica.leader.clone().unwrap_or(replica.addr.clone());
        let terms = tokio_stream::wrappers::WatchStream::new(replica.term.subscribe());
        let updates = tokio_stream::StreamExt::map(terms, move |term| {
            Ok(pb::LeaderUpdate {
                leader: Some(leader.clone()),
                term,
            })
        });
        Ok(Response::new(Box::pin(updates)))
    }

    async fn add_node(
        &self,
        _: Request<pb::AddNodeRequest>,
    ) -> Result<Response<pb::AddNodeResponse>, Status> {
        unimplemented(&self.0, "add_node").await
    }

    async fn remove_node(
        &self,
        _: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        unimplemented(&self.0, "remove_node").await
    }

    async fn put_blob(
        &self,
        _: Request<tonic::Streaming<pb::PutBlobChunk>>,
    ) -> Result<Response<pb::PutBlobResponse>, Status> {
        unimplemented(&self.0, "put_blob").await
    }

    type GetBlobStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::BlobChunk, Status>> + Send>>;

    async fn get_blob(
        &self,
        _: Request<pb::GetBlobRequest>,
    ) -> Result<Response<Self::GetBlobStream>, Status> {
        unimplemented(&self.0, "get_blob").await
    }
}
