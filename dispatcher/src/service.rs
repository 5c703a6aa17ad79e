//! The dispatcher's gRPC service: decode, delegate, map. Any replica serves it; a follower
//! answers `Unavailable` with the leader's address, and the client libraries re-route.
//!
//! Every handler first checks that the caller's role may make the call (the caller was
//! authenticated by the interceptor in front of the service; see `access`). Handlers hold no
//! logic: writes go to the proposer's typed methods (after the quorum-lease
//! check), current reads to the `StateReader`, heartbeats to `Heartbeats`, the task-removal vote
//! to `TaskRemover`, dataset preparation to `Registration`, membership changes to
//! `membership`. Every error leaves through `From<DispatcherError> for tonic::Status`.

use crate::access;
use crate::admissions;
use crate::blobs::{Blobs, Chunks};
use crate::cluster_status;
use crate::config::DispatcherConfig;
use crate::convert::{decode_def, metadata_to_proto, request_id};
use crate::error::DispatcherError;
use crate::heartbeats::Heartbeats;
use crate::leader_watch::LeaderWatch;
use crate::liveness::Liveness;
use crate::membership;
use crate::proposer::ProposerHandle;
use crate::raft_network::PeerNetwork;
use crate::raft_types::{Raft, StateHandle};
use crate::registration::{check_definition_size, Registration};
use crate::state::{DispatcherState, JobOptions, Rejection};
use crate::state_reader::StateReader;
use crate::task_remover::TaskRemover;
use futures::future::join_all;
use prost::Message;
use sluice_formats::DataRoots;
use sluice_pipeline::PipelineLimits;
use sluice_proto::dispatcher as pb;
use sluice_proto::dispatcher::dispatcher_server::Dispatcher;
use sluice_proto::MAX_LEASES_PER_CALL;
use sluice_rpc::{is_retryable_status, lease_splits_result, FromProto, ToProto};
use sluice_security::{authorize, Identity};
use sluice_types::{
    ClientId, DatasetId, Delivery, JobId, LeaseRequest, ShardingPolicy, TargetWorkers, TaskId,
};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request as GrpcRequest, Response, Status};

/// The replies of a `WatchLeader` stream.
pub type LeaderUpdates = Pin<Box<dyn Stream<Item = Result<pb::LeaderUpdate, Status>> + Send>>;

pub struct DispatcherService {
    raft: Raft,
    /// The directories files sources may name (canonical).
    data_roots: DataRoots,
    proposer: ProposerHandle,
    reader: StateReader,
    heartbeats: Heartbeats,
    /// Votes of coordinated consumers to remove an unreachable task (leader-local).
    task_remover: TaskRemover,
    /// The largest definition a registration may carry, in encoded bytes.
    max_definition_bytes: usize,
    /// The most ops and the deepest structures a registered definition may have.
    pipeline_limits: PipelineLimits,
    /// Who this replica believes leads, for `WatchLeader`.
    leaders: LeaderWatch,
    /// Raft's connections to the other replicas (`RemoveNode` asks which voters answer).
    peers: PeerNetwork,
    /// This replica's blob store (`PutBlob`, `GetBlob`, and the blobs a registration names).
    blobs: Blobs,
}

/// The chunks of a `GetBlob` reply.
pub type BlobChunks = Pin<Box<dyn Stream<Item = Result<pb::BlobChunk, Status>> + Send>>;

impl DispatcherService {
    /// A service for the replica configured by `config`: its id, the worker long-poll bound
    /// (from the worker timeout), the quorum lease (the election timeout's upper bound) and the
    /// static-sharding worker list. `peers` are Raft's connections, which `RemoveNode` uses to
    /// ask the voters whether they answer.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: &DispatcherConfig,
        raft: Raft,
        proposer: ProposerHandle,
        state: StateHandle,
        liveness: Arc<Liveness>,
        data_roots: DataRoots,
        leaders: LeaderWatch,
        peers: PeerNetwork,
        blobs: Blobs,
    ) -> Self {
        let reader = StateReader::new(config.id, raft.clone(), state, config.election_timeout);
        DispatcherService {
            raft,
            data_roots,
            heartbeats: Heartbeats::new(config, reader.clone(), proposer.clone(), liveness),
            proposer,
            reader,
            task_remover: TaskRemover::default(),
            max_definition_bytes: config.max_definition_bytes(),
            pipeline_limits: config.pipeline_limits(),
            leaders,
            peers,
            blobs,
        }
    }

    /// The proposer, once the quorum lease says writes can commit.
    fn writer(&self) -> Result<&ProposerHandle, DispatcherError> {
        self.reader.check_quorum()?;
        Ok(&self.proposer)
    }

    /// Leases splits for `caller`'s task, as one `LeaseSplits` call or one lease of a batch.
    async fn lease(
        &self,
        caller: &Identity,
        req: pb::LeaseSplitsRequest,
    ) -> Result<pb::LeaseSplitsResponse, DispatcherError> {
        let writer = self.writer()?;
        let id = request_id(req.request_id);
        let lease = LeaseRequest::from_proto(&req)?;
        // Checked before proposing, so a request that would be refused costs no log entry. The
        // applied state may lag what is committed (a new leader): a refusal is confirmed on a
        // linearizable read before it is returned.
        // A repetition the provider has left behind is over for good: answered without a log
        // entry (`lease_of_past_repetition`).
        let check = |s: &DispatcherState| {
            access::check_task(s, caller, lease.task_id)?;
            s.check_lease(id, &lease).map_err(DispatcherError::from)?;
            Ok::<_, DispatcherError>(s.lease_of_past_repetition(id, &lease))
        };
        let past = match self.reader.read(check) {
            Ok(past) => past,
            Err(_) => {
                self.reader.linearizable().await?;
                self.reader.read(check)?
            }
        };
        if let Some(end_of_splits) = past {
            return Ok(end_of_splits.to_proto());
        }
        Ok(writer.lease_splits(id, lease).await?.to_proto())
    }
}

#[tonic::async_trait]
impl Dispatcher for DispatcherService {
    async fn register_dataset(
        &self,
        request: GrpcRequest<pb::RegisterDatasetRequest>,
    ) -> Result<Response<pb::RegisterDatasetResponse>, Status> {
        authorize(&request, "RegisterDataset", access::CLIENT)?;
        let mut req = request.into_inner();
        let limit = self.max_definition_bytes;
        let sent = req.dataset.as_ref().map_or(0, Message::encoded_len);
        check_definition_size(sent, limit, "as sent")?;
        if let Some(def) = &req.dataset {
            self.pipeline_limits
                .check(def)
                .map_err(|e| DispatcherError::InvalidArgument(e.to_string()))?;
        }
        let id = request_id(req.request_id.take());
        // Globbing and resolving paths block on the file system: off the runtime.
        let roots = self.data_roots.clone();
        let prepared =
            tokio::task::spawn_blocking(move || Registration::prepare(req, &roots)).await;
        let registration = match prepared {
            Ok(registration) => registration?,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(_) => {
                    return Err(
                        DispatcherError::RaftStopped("the dispatcher is stopping".into()).into(),
                    )
                }
            },
        };
        let expanded = registration.def.encoded_len();
        check_definition_size(expanded, limit, "with its file patterns expanded")?;
        // Every blob the definition names is held here (fetched from a peer if need be), so
        // the replicas that uploaded it and this leader agree it exists before the log names it.
        let named = sluice_element::blob_tensors::digests(&registration.def)
            .map_err(|e| DispatcherError::InvalidArgument(e.to_string()))?;
        for (digest, len) in &named {
            self.blobs.ensure_local(digest, Some(*len)).await?;
        }
        let dataset_id = self.writer()?.register_dataset(id, registration).await?;
        Ok(Response::new(pb::RegisterDatasetResponse {
            dataset_id: dataset_id.0,
        }))
    }

    async fn get_dataset(
        &self,
        request: GrpcRequest<pb::GetDatasetRequest>,
    ) -> Result<Response<pb::GetDatasetResponse>, Status> {
        authorize(&request, "GetDataset", access::READER)?;
        let id = DatasetId(request.into_inner().dataset_id);
        self.reader.linearizable().await?;
        let found = self.reader.read(|s| {
            s.dataset(&id)
                .and_then(|d| Some((decode_def(s, d)?, metadata_to_proto(&d.metadata))))
        });
        let (dataset, metadata) = found.ok_or_else(|| {
            DispatcherError::from(Rejection::NotFound(format!("Dataset id {id} not found")))
        })?;
        Ok(Response::new(pb::GetDatasetResponse {
            dataset: Some(dataset),
            metadata: Some(metadata),
        }))
    }

    async fn get_or_create_job(
        &self,
        request: GrpcRequest<pb::GetOrCreateJobRequest>,
    ) -> Result<Response<pb::GetOrCreateJobResponse>, Status> {
        authorize(&request, "GetOrCreateJob", access::CLIENT)?;
        let req = request.into_inner();
        let sharding =
            ShardingPolicy::from_proto(req.sharding_policy).map_err(DispatcherError::from)?;
        if sharding == ShardingPolicy::Dynamic {
            // What distributed_epoch cannot run (a random source, a cache) is refused here, at
            // once, rather than by every worker's task. A dataset this replica does not know
            // yet is left to the job's creation to find.
            let dataset_id = DatasetId(req.dataset_id.clone());
            let def = self
                .reader
                .read(|s| s.dataset(&dataset_id).and_then(|d| decode_def(s, d)));
            if let Some(def) = def {
                sluice_pipeline::check_distributed_epoch(&def)
                    .map_err(|e| DispatcherError::InvalidArgument(e.to_string()))?;
            }
        }
        let options = JobOptions {
            num_consumers: req.num_consumers,
            use_cross_trainer_cache: req.use_cross_trainer_cache,
            target_workers: TargetWorkers::from_proto(req.target_workers)
                .map_err(DispatcherError::from)?,
        };
        let job_id = self
            .writer()?
            .get_or_create_job(
                request_id(req.request_id),
                DatasetId(req.dataset_id),
                sharding,
                req.job_name,
                rand::random(),
                options,
                Delivery::from_proto(req.delivery).map_err(DispatcherError::from)?,
            )
            .await?;
        Ok(Response::new(pb::GetOrCreateJobResponse {
            job_id: job_id.0,
        }))
    }

    async fn get_or_create_iteration(
        &self,
        request: GrpcRequest<pb::GetOrCreateIterationRequest>,
    ) -> Result<Response<pb::GetOrCreateIterationResponse>, Status> {
        authorize(&request, "GetOrCreateIteration", access::CLIENT)?;
        let req = request.into_inner();
        let writer = self.writer()?;
        let key = admissions::fetch_key(|| self.reader.read(admissions::key_of), writer).await?;
        let (iteration_id, client_id) = writer
            .get_or_create_iteration(
                request_id(req.request_id),
                JobId(req.job_id),
                req.repetition,
                req.resume.map(|r| (r.step, r.reader)),
            )
            .await?;
        Ok(Response::new(pb::GetOrCreateIterationResponse {
            iteration_client_id: client_id.0,
            iteration_id: iteration_id.0,
            admission: admissions::admission(&key, iteration_id, client_id).to_bytes(),
        }))
    }

    async fn client_heartbeat(
        &self,
        request: GrpcRequest<pb::ClientHeartbeatRequest>,
    ) -> Result<Response<pb::ClientHeartbeatResponse>, Status> {
        authorize(&request, "ClientHeartbeat", access::CLIENT)?;
        let response = self.heartbeats.client(request.into_inner()).await?;
        Ok(Response::new(response))
    }

    async fn release_iteration_client(
        &self,
        request: GrpcRequest<pb::ReleaseIterationClientRequest>,
    ) -> Result<Response<pb::ReleaseIterationClientResponse>, Status> {
        authorize(&request, "ReleaseIterationClient", access::CLIENT)?;
        let req = request.into_inner();
        self.writer()?
            .release_iteration_client(
                request_id(req.request_id),
                ClientId(req.iteration_client_id),
            )
            .await?;
        Ok(Response::new(pb::ReleaseIterationClientResponse {}))
    }

    async fn report_delivered(
        &self,
        request: GrpcRequest<pb::ReportDeliveredRequest>,
    ) -> Result<Response<pb::ReportDeliveredResponse>, Status> {
        authorize(&request, "ReportDelivered", access::CLIENT)?;
        let req = request.into_inner();
        let reports = crate::convert::delivery_reports(&req.tasks)?;
        self.writer()?
            .report_delivered(
                request_id(req.request_id),
                ClientId(req.iteration_client_id),
                reports,
            )
            .await?;
        Ok(Response::new(pb::ReportDeliveredResponse {}))
    }

    async fn save_checkpoint(
        &self,
        request: GrpcRequest<pb::SaveCheckpointRequest>,
    ) -> Result<Response<pb::SaveCheckpointResponse>, Status> {
        authorize(&request, "SaveCheckpoint", access::CLIENT)?;
        let req = request.into_inner();
        let taken = crate::convert::delivery_reports(&req.taken)?
            .into_iter()
            .map(|r| (r.task_id, r.runs))
            .collect();
        let (job_name, repetition, definition) = self
            .writer()?
            .save_checkpoint(
                request_id(req.request_id),
                ClientId(req.iteration_client_id),
                req.reader,
                req.step,
                req.base_step,
                taken,
            )
            .await?;
        Ok(Response::new(pb::SaveCheckpointResponse {
            job_name,
            repetition,
            dataset_definition: crate::state::definition_hex(&definition),
        }))
    }

    async fn worker_heartbeat(
        &self,
        request: GrpcRequest<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        let caller = authorize(&request, "WorkerHeartbeat", access::WORKER)?;
        let hosts = access::worker_cert_hosts(request.extensions().get());
        let response = self
            .heartbeats
            .worker(request.into_inner(), &caller, hosts.as_deref())
            .await?;
        Ok(Response::new(response))
    }

    async fn worker_update(
        &self,
        request: GrpcRequest<pb::WorkerUpdateRequest>,
    ) -> Result<Response<pb::WorkerUpdateResponse>, Status> {
        let caller = authorize(&request, "WorkerUpdate", access::WORKER)?;
        let req = request.into_inner();
        let tasks: Vec<TaskId> = req.completed_tasks.into_iter().map(TaskId).collect();
        self.reader
            .read(|s| access::check_finish(s, &caller, &req.worker_address, &tasks))?;
        self.writer()?
            .finish_tasks(request_id(req.request_id), req.worker_address, tasks)
            .await?;
        Ok(Response::new(pb::WorkerUpdateResponse {}))
    }

    async fn lease_splits(
        &self,
        request: GrpcRequest<pb::LeaseSplitsRequest>,
    ) -> Result<Response<pb::LeaseSplitsResponse>, Status> {
        let caller = authorize(&request, "LeaseSplits", access::WORKER)?;
        let lease = self.lease(&caller, request.into_inner()).await?;
        Ok(Response::new(lease))
    }

    async fn lease_splits_batch(
        &self,
        request: GrpcRequest<pb::LeaseSplitsBatchRequest>,
    ) -> Result<Response<pb::LeaseSplitsBatchResponse>, Status> {
        let caller = authorize(&request, "LeaseSplitsBatch", access::WORKER)?;
        let leases = request.into_inner().leases;
        if leases.len() > MAX_LEASES_PER_CALL {
            return Err(DispatcherError::InvalidArgument(format!(
                "LeaseSplitsBatch carries {} leases; at most {MAX_LEASES_PER_CALL} are accepted \
                 in one call",
                leases.len()
            ))
            .into());
        }
        // Concurrently, so the leases share the proposer's next log entry.
        let outcomes = join_all(leases.into_iter().map(|req| self.lease(&caller, req))).await;
        let mut results = Vec::with_capacity(outcomes.len());
        for outcome in outcomes {
            match outcome.map_err(Status::from) {
                // A retry may cure it (no leader, no quorum): the whole call is retried, with
                // the same request ids, so the leases granted are answered again.
                Err(status) if is_retryable_status(&status) => return Err(status),
                outcome => results.push(lease_splits_result(outcome)),
            }
        }
        Ok(Response::new(pb::LeaseSplitsBatchResponse { results }))
    }

    async fn maybe_remove_task(
        &self,
        request: GrpcRequest<pb::MaybeRemoveTaskRequest>,
    ) -> Result<Response<pb::MaybeRemoveTaskResponse>, Status> {
        authorize(&request, "MaybeRemoveTask", access::CLIENT)?;
        let req = request.into_inner();
        let removed = self
            .task_remover
            .maybe_remove(
                &self.reader,
                &self.proposer,
                TaskId(req.task_id),
                req.consumer_index,
                req.round,
            )
            .await?;
        Ok(Response::new(pb::MaybeRemoveTaskResponse { removed }))
    }

    async fn add_node(
        &self,
        request: GrpcRequest<pb::AddNodeRequest>,
    ) -> Result<Response<pb::AddNodeResponse>, Status> {
        authorize(&request, "AddNode", access::ADMIN)?;
        let req = request.into_inner();
        let catch_up = match req.catch_up_timeout_ms {
            0 => membership::DEFAULT_CATCH_UP_TIMEOUT,
            ms => Duration::from_millis(ms),
        };
        let voters =
            membership::add_voter(&self.raft, req.node_id, req.peer_addr, catch_up).await?;
        Ok(Response::new(pb::AddNodeResponse { voters }))
    }

    async fn remove_node(
        &self,
        request: GrpcRequest<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        authorize(&request, "RemoveNode", access::ADMIN)?;
        let req = request.into_inner();
        let voters =
            membership::remove_member(&self.raft, &self.peers, req.node_id, req.force).await?;
        Ok(Response::new(pb::RemoveNodeResponse { voters }))
    }

    async fn get_status(
        &self,
        request: GrpcRequest<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        authorize(&request, "GetStatus", access::READER)?;
        let request = request.into_inner();
        let page = cluster_status::StatusPage::parse(request.page_size, &request.page_token)?;
        let metrics = self.raft.metrics().borrow().clone();
        let mut json = self
            .reader
            .read(|s| cluster_status::status_json(&metrics, s, &page));
        // Sizes: the encoded state, and the snapshot a lagging follower would be sent.
        json["state_bytes"] = self.reader.encoded_state_bytes()?.into();
        json["snapshot_bytes"] = match self.raft.get_snapshot().await {
            Ok(snapshot) => snapshot.map(|s| s.snapshot.get_ref().len()).into(),
            // Only a stopped Raft fails to read its snapshot.
            Err(e) => return Err(DispatcherError::RaftStopped(e.to_string()).into()),
        };
        Ok(Response::new(pb::GetStatusResponse {
            json: json.to_string(),
        }))
    }

    type WatchLeaderStream = LeaderUpdates;

    async fn watch_leader(
        &self,
        request: GrpcRequest<pb::WatchLeaderRequest>,
    ) -> Result<Response<LeaderUpdates>, Status> {
        authorize(&request, "WatchLeader", access::READER)?;
        let updates = WatchStream::from_changes(self.leaders.subscribe()).map(Ok);
        Ok(Response::new(Box::pin(updates)))
    }
    /// A blob's upload: written here, verified, and acknowledged once a majority of the voters
    /// hold it (see `blobs`). Only the leader takes uploads.
    async fn put_blob(
        &self,
        request: GrpcRequest<tonic::Streaming<pb::PutBlobChunk>>,
    ) -> Result<Response<pb::PutBlobResponse>, Status> {
        authorize(&request, "PutBlob", access::CLIENT)?;
        self.reader.linearizable().await?;
        let mut chunks = request.into_inner();
        let first = chunks.message().await?.ok_or_else(|| {
            DispatcherError::InvalidArgument("a blob upload with no chunk".into())
        })?;
        let digest = sluice_element::blob_tensors::digest_from(&first.digest)
            .map_err(|e| DispatcherError::InvalidArgument(e.to_string()))?;
        self.blobs.check_len(&digest, first.total_len)?;
        let already_present = self.blobs.holds_fresh(&digest, first.total_len);
        if !already_present {
            let rest: Chunks = Box::pin(chunks.map(|c| c.map(|c| c.data)));
            self.blobs
                .write(digest, first.total_len, first.data, rest)
                .await?;
        }
        let replicas = self.blobs.replicate(digest).await?;
        Ok(Response::new(pb::PutBlobResponse {
            already_present,
            replicas,
        }))
    }

    type GetBlobStream = BlobChunks;

    /// A blob's bytes from an offset on; a replica that lacks it fetches it from a peer first.
    async fn get_blob(
        &self,
        request: GrpcRequest<pb::GetBlobRequest>,
    ) -> Result<Response<BlobChunks>, Status> {
        authorize(&request, "GetBlob", access::READER)?;
        let req = request.into_inner();
        let digest = sluice_element::blob_tensors::digest_from(&req.digest)
            .map_err(|e| DispatcherError::InvalidArgument(e.to_string()))?;
        self.blobs.ensure_local(&digest, None).await?;
        let (len, rx) = self.blobs.read(&digest, req.offset)?;
        let chunks = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |chunk| {
            chunk
                .map(|data| pb::BlobChunk {
                    data,
                    total_len: len,
                })
                .map_err(|e| Status::internal(format!("reading the blob: {e}")))
        });
        Ok(Response::new(Box::pin(chunks)))
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
