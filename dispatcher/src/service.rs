//! The dispatcher's gRPC service: decode, delegate to the proposer or a linearizable read of the
//! state, map the result. Any replica serves it; a follower answers `Unavailable` with the
//! leader's address, and the client libraries re-route.

use crate::config::DispatcherConfig;
use crate::convert::{self, decode_def, metadata_to_proto, request_id, task_def, task_info};
use crate::error::DispatcherError;
use crate::ids::{ClientId, DatasetId, IterationId, JobId, NodeId, TaskId};
use crate::liveness::Liveness;
use crate::proposer::ProposerHandle;
use crate::state::{
    DatasetMetadata, DispatcherState, JobOptions, Outcome, Request, ShardingPolicy, TargetWorkers,
    Update,
};
use crate::status;
use crate::task_remover::{Decision, TaskRemover};
use crate::types::NodeInfo;
use crate::types::{Raft, StateHandle};
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::ChangeMembers;
use prost::Message;
use sluice_proto::dispatcher as pb;
use sluice_proto::dispatcher::dispatcher_server::Dispatcher;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;
use tonic::{Request as GrpcRequest, Response, Status};

/// How long a caller waits for its write to commit (or for a linearizable read to be
/// confirmed) before hearing `Unavailable`; a write may still commit later, which a retry with
/// the same request id finds out.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest long poll a caller may ask for.
const MAX_POLL: Duration = Duration::from_secs(10);

pub struct DispatcherService {
    id: NodeId,
    raft: Raft,
    proposer: ProposerHandle,
    state: StateHandle,
    liveness: Arc<Liveness>,
    /// Votes of coordinated consumers to remove an unreachable task (leader-local).
    task_remover: TaskRemover,
    /// Longest worker long poll: half the worker timeout, so a polling worker is never expired.
    max_worker_poll: Duration,
    /// A leader no quorum acknowledged for this long is probably deposed (or cut off): it
    /// answers `Unavailable` at once instead of letting callers wait on writes that cannot
    /// commit.
    quorum_lease: Duration,
    /// The configured static-sharding worker list, put into every `RegisterWorker` this
    /// replica proposes (the state records it and checks that every leader has the same).
    worker_addresses: Vec<String>,
}

impl DispatcherService {
    /// A service for the replica configured by `config`: its id, the worker long-poll bound
    /// (from the worker timeout), the quorum lease (the election timeout's upper bound) and the
    /// static-sharding worker list.
    pub fn new(
        config: &DispatcherConfig,
        raft: Raft,
        proposer: ProposerHandle,
        state: StateHandle,
        liveness: Arc<Liveness>,
    ) -> Self {
        DispatcherService {
            id: config.id,
            raft,
            proposer,
            state,
            liveness,
            task_remover: TaskRemover::default(),
            max_worker_poll: config.worker_timeout / 2,
            quorum_lease: config.election_timeout.1,
            worker_addresses: config.worker_addresses.clone(),
        }
    }

    fn check_quorum(&self) -> Result<(), DispatcherError> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        match m.millis_since_quorum_ack {
            Some(ms) if m.state.is_leader() && Duration::from_millis(ms) > self.quorum_lease => {
                Err(DispatcherError::QuorumUnavailable(format!(
                    "no quorum has acknowledged this leader for {ms} ms"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Waits until this replica is the confirmed leader and has applied everything committed
    /// before the call, so the state read next is current.
    async fn linearizable(&self) -> Result<(), DispatcherError> {
        self.check_quorum()?;
        let confirmed = tokio::time::timeout(COMMIT_TIMEOUT, self.raft.ensure_linearizable())
            .await
            .map_err(|_| {
                DispatcherError::QuorumUnavailable("no quorum confirmed the leader in time".into())
            })?;
        confirmed.map(|_| ()).map_err(|e| match e {
            RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => {
                DispatcherError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                }
            }
            RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q)) => {
                DispatcherError::QuorumUnavailable(q.to_string())
            }
            RaftError::Fatal(f) => DispatcherError::RaftStopped(f.to_string()),
        })
    }

    fn read<T>(&self, f: impl FnOnce(&DispatcherState) -> T) -> T {
        let applied = self.state.read().expect("state lock poisoned");
        f(&applied.state)
    }

    async fn propose(
        &self,
        id: Option<pb::RequestId>,
        update: Update,
    ) -> Result<Outcome, DispatcherError> {
        self.check_quorum()?;
        match self
            .proposer
            .propose(Request {
                id: request_id(id),
                update,
            })
            .await?
        {
            Outcome::Rejected(rejection) => Err(rejection.into()),
            outcome => Ok(outcome),
        }
    }

    /// Waits for the next applied entry, or until `deadline`; false when the deadline passed or
    /// this replica is no longer the leader.
    async fn wait_for_change(&self, deadline: Instant) -> bool {
        let mut metrics = self.raft.metrics();
        metrics.borrow_and_update();
        if metrics.borrow().current_leader != Some(self.id) {
            return false;
        }
        matches!(
            tokio::time::timeout_at(deadline, metrics.changed()).await,
            Ok(Ok(()))
        )
    }
}

/// Maps a failed membership write: a follower names the leader; a refused change says why.
fn membership_error(e: RaftError<NodeId, ClientWriteError<NodeId, NodeInfo>>) -> DispatcherError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => DispatcherError::NotLeader {
            leader: f.leader_node.map(|n| n.addr),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            crate::state::Rejection::FailedPrecondition(format!("membership change refused: {e}"))
                .into()
        }
        RaftError::Fatal(f) => DispatcherError::RaftStopped(f.to_string()),
    }
}

fn voters(membership: Option<openraft::Membership<NodeId, NodeInfo>>) -> Vec<u64> {
    membership
        .map(|m| m.voter_ids().collect())
        .unwrap_or_default()
}

fn poll_deadline(poll_timeout_ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(poll_timeout_ms).min(MAX_POLL)
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn unexpected(outcome: Outcome) -> Status {
    Status::internal(format!("unexpected outcome {outcome:?}"))
}

#[tonic::async_trait]
impl Dispatcher for DispatcherService {
    async fn register_dataset(
        &self,
        request: GrpcRequest<pb::RegisterDatasetRequest>,
    ) -> Result<Response<pb::RegisterDatasetResponse>, Status> {
        let req = request.into_inner();
        let mut def = req
            .dataset
            .ok_or_else(|| DispatcherError::InvalidArgument("`dataset` is required".into()))?;
        let invalid =
            |e: sluice_dataset::DatasetError| DispatcherError::InvalidArgument(e.to_string());
        sluice_dataset::expand_files(&mut def).map_err(invalid)?;
        let num_splits = (0..sluice_dataset::num_split_providers(&def))
            .map(|p| sluice_dataset::num_splits(&def, p))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(invalid)?;
        let given = req.metadata.unwrap_or_default();
        let element_spec = match given.element_spec {
            Some(spec) => spec,
            None => sluice_dataset::element_spec(&def, &sluice_dataset::FunctionRegistry::global())
                .map_err(invalid)?
                .to_proto(),
        };
        let metadata = DatasetMetadata {
            element_spec: element_spec.encode_to_vec(),
            cardinality: sluice_dataset::cardinality(&def),
            compression: convert::compression_from_proto(given.compression)?,
        };
        let update = Update::RegisterDataset {
            dataset_id: req.dataset_id.filter(|id| !id.is_empty()).map(DatasetId),
            def: def.encode_to_vec(),
            metadata,
            num_splits,
        };
        match self.propose(req.request_id, update).await? {
            Outcome::DatasetRegistered { dataset_id } => {
                Ok(Response::new(pb::RegisterDatasetResponse {
                    dataset_id: dataset_id.0,
                }))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn get_dataset(
        &self,
        request: GrpcRequest<pb::GetDatasetRequest>,
    ) -> Result<Response<pb::GetDatasetResponse>, Status> {
        let id = DatasetId(request.into_inner().dataset_id);
        self.linearizable().await?;
        let found = self.read(|s| {
            s.dataset(&id)
                .map(|d| (decode_def(d), metadata_to_proto(&d.metadata)))
        });
        let (dataset, metadata) =
            found.ok_or_else(|| Status::not_found(format!("Dataset id {id} not found")))?;
        Ok(Response::new(pb::GetDatasetResponse {
            dataset: Some(dataset),
            metadata: Some(metadata),
        }))
    }

    async fn get_or_create_job(
        &self,
        request: GrpcRequest<pb::GetOrCreateJobRequest>,
    ) -> Result<Response<pb::GetOrCreateJobResponse>, Status> {
        let req = request.into_inner();
        let update = Update::GetOrCreateJob {
            dataset_id: DatasetId(req.dataset_id),
            sharding: ShardingPolicy::try_from(req.sharding_policy)
                .map_err(DispatcherError::from)?,
            job_name: req.job_name,
            anonymous_suffix: rand::random(),
            options: JobOptions {
                num_consumers: req.num_consumers,
                use_cross_trainer_cache: req.use_cross_trainer_cache,
                target_workers: TargetWorkers::try_from(req.target_workers)
                    .map_err(DispatcherError::from)?,
            },
        };
        match self.propose(req.request_id, update).await? {
            Outcome::Job { job_id } => Ok(Response::new(pb::GetOrCreateJobResponse {
                job_id: job_id.0,
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn get_or_create_iteration(
        &self,
        request: GrpcRequest<pb::GetOrCreateIterationRequest>,
    ) -> Result<Response<pb::GetOrCreateIterationResponse>, Status> {
        let req = request.into_inner();
        let update = Update::GetOrCreateIteration {
            job_id: JobId(req.job_id),
            repetition: req.repetition,
        };
        match self.propose(req.request_id, update).await? {
            Outcome::Iteration {
                iteration_id,
                client_id,
            } => Ok(Response::new(pb::GetOrCreateIterationResponse {
                iteration_client_id: client_id.0,
                iteration_id: iteration_id.0,
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn client_heartbeat(
        &self,
        request: GrpcRequest<pb::ClientHeartbeatRequest>,
    ) -> Result<Response<pb::ClientHeartbeatResponse>, Status> {
        let req = request.into_inner();
        let client_id = ClientId(req.iteration_client_id);
        self.liveness.client_seen(client_id.0);
        let deadline = poll_deadline(req.poll_timeout_ms);
        self.linearizable().await?;
        // A coordinated reader's rounds matter while a task waits to join its iteration.
        let pending = self.read(|s| {
            s.client_iteration(client_id)
                .is_some_and(|it| !it.pending_tasks.is_empty())
        });
        if let (true, Some(current_round)) = (pending, req.current_round) {
            let update = Update::ClientRounds {
                client_id,
                current_round,
                blocked_round: req.blocked_round,
            };
            self.propose(None, update).await?;
        }
        loop {
            let response = self.read(|s| {
                let iteration = s.client_iteration(client_id)?;
                let tasks = s
                    .tasks_of_iteration(iteration)
                    .into_iter()
                    .map(|t| task_info(s, t))
                    .collect();
                Some(pb::ClientHeartbeatResponse {
                    tasks,
                    iteration_finished: iteration.finished,
                    block_round: iteration.pending_tasks.front().map(|p| p.target_round),
                })
            });
            let response = response.ok_or_else(|| {
                Status::not_found(format!("Iteration client id not found: {client_id}"))
            })?;
            // A blocked round needs the consumer's answer: reply at once.
            let changed = response.iteration_finished
                || response.block_round.is_some()
                || response.tasks.len() as u32 != req.known_tasks;
            if changed || !self.wait_for_change(deadline).await {
                return Ok(Response::new(response));
            }
        }
    }

    async fn release_iteration_client(
        &self,
        request: GrpcRequest<pb::ReleaseIterationClientRequest>,
    ) -> Result<Response<pb::ReleaseIterationClientResponse>, Status> {
        let req = request.into_inner();
        let update = Update::ReleaseIterationClient {
            client_id: ClientId(req.iteration_client_id),
            time_micros: now_micros(),
        };
        self.propose(req.request_id, update).await?;
        Ok(Response::new(pb::ReleaseIterationClientResponse {}))
    }

    async fn worker_heartbeat(
        &self,
        request: GrpcRequest<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        let req = request.into_inner();
        if req.worker_address.is_empty() {
            return Err(
                DispatcherError::InvalidArgument("`worker_address` is required".into()).into(),
            );
        }
        self.liveness.worker_seen(&req.worker_address);
        let poll = Duration::from_millis(req.poll_timeout_ms).min(self.max_worker_poll);
        let deadline = poll_deadline(poll.as_millis() as u64);
        self.linearizable().await?;
        let register = self.read(|s| {
            s.worker(&req.worker_address).is_none()
                || s.worker_lacks_coordinated_task(&req.worker_address)
        });
        if register {
            let update = Update::RegisterWorker {
                address: req.worker_address.clone(),
                tags: req.tags.clone(),
                worker_addresses: self.worker_addresses.clone(),
            };
            self.propose(req.request_id, update).await?;
        }
        let current: BTreeSet<u64> = req.current_tasks.iter().copied().collect();
        loop {
            let response = self.read(|s| worker_tasks(s, &req.worker_address, &current));
            let changed = !response.new_tasks.is_empty() || !response.tasks_to_delete.is_empty();
            if changed || !self.wait_for_change(deadline).await {
                return Ok(Response::new(response));
            }
        }
    }

    async fn worker_update(
        &self,
        request: GrpcRequest<pb::WorkerUpdateRequest>,
    ) -> Result<Response<pb::WorkerUpdateResponse>, Status> {
        let req = request.into_inner();
        let update = Update::FinishTasks {
            worker: req.worker_address,
            task_ids: req.completed_tasks.into_iter().map(TaskId).collect(),
        };
        self.propose(req.request_id, update).await?;
        Ok(Response::new(pb::WorkerUpdateResponse {}))
    }

    async fn lease_splits(
        &self,
        request: GrpcRequest<pb::LeaseSplitsRequest>,
    ) -> Result<Response<pb::LeaseSplitsResponse>, Status> {
        let req = request.into_inner();
        let update = Update::LeaseSplits {
            iteration_id: IterationId(req.iteration_id),
            provider: req.provider_index,
            repetition: req.repetition,
            max: u64::from(req.max_splits),
            task_id: TaskId(req.task_id),
        };
        match self.propose(req.request_id, update).await? {
            Outcome::Splits(lease) => Ok(Response::new(pb::LeaseSplitsResponse {
                start: lease.start,
                end: lease.end,
                end_of_splits: lease.end_of_splits,
                repetition: lease.repetition,
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn maybe_remove_task(
        &self,
        request: GrpcRequest<pb::MaybeRemoveTaskRequest>,
    ) -> Result<Response<pb::MaybeRemoveTaskResponse>, Status> {
        let req = request.into_inner();
        let task_id = TaskId(req.task_id);
        self.linearizable().await?;
        let num_consumers = self.read(|s| {
            let task = s.task(task_id)?;
            let iteration = s.iteration(task.iteration_id)?;
            Some(s.job(iteration.job_id)?.options.num_consumers)
        });
        let num_consumers = match num_consumers {
            None => return Err(Status::not_found(format!("Task {task_id} not found"))),
            Some(None) => {
                return Err(Status::failed_precondition(
                    "MaybeRemoveTask called on a non-round-robin task.",
                ))
            }
            Some(Some(n)) => n,
        };
        let decision = self
            .task_remover
            .request(task_id, req.consumer_index, req.round, num_consumers)
            .await;
        let removed = match decision {
            Decision::Remove => {
                self.propose(None, Update::RemoveTask { task_id }).await?;
                true
            }
            Decision::Agreed => true,
            Decision::Keep => false,
        };
        Ok(Response::new(pb::MaybeRemoveTaskResponse { removed }))
    }

    async fn add_node(
        &self,
        request: GrpcRequest<pb::AddNodeRequest>,
    ) -> Result<Response<pb::AddNodeResponse>, Status> {
        let req = request.into_inner();
        if req.addr.is_empty() {
            return Err(DispatcherError::InvalidArgument("`addr` is required".into()).into());
        }
        // First a learner that catches up, then a voter: the joint-consensus change never waits
        // on a replica that has the whole log still to fetch.
        let node = NodeInfo { addr: req.addr };
        self.raft
            .add_learner(req.node_id, node, true)
            .await
            .map_err(membership_error)?;
        let change = ChangeMembers::AddVoterIds(BTreeSet::from([req.node_id]));
        let response = self
            .raft
            .change_membership(change, false)
            .await
            .map_err(membership_error)?;
        Ok(Response::new(pb::AddNodeResponse {
            voters: voters(response.membership),
        }))
    }

    async fn remove_node(
        &self,
        request: GrpcRequest<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        let req = request.into_inner();
        let change = ChangeMembers::RemoveVoters(BTreeSet::from([req.node_id]));
        let response = self
            .raft
            .change_membership(change, false)
            .await
            .map_err(membership_error)?;
        Ok(Response::new(pb::RemoveNodeResponse {
            voters: voters(response.membership),
        }))
    }

    async fn get_status(
        &self,
        _request: GrpcRequest<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        let metrics = self.raft.metrics().borrow().clone();
        let json = self.read(|s| status::status_json(&metrics, s));
        Ok(Response::new(pb::GetStatusResponse {
            json: json.to_string(),
        }))
    }
}

/// What a worker should start (assigned, unfinished, not running) and stop (running, no longer
/// assigned or finished).
fn worker_tasks(
    state: &DispatcherState,
    worker: &str,
    current: &BTreeSet<u64>,
) -> pb::WorkerHeartbeatResponse {
    let active: Vec<_> = state.active_tasks_of_worker(worker).collect();
    let active_ids: BTreeSet<u64> = active.iter().map(|t| t.id.0).collect();
    let new_tasks = active
        .iter()
        .filter(|t| !current.contains(&t.id.0))
        .filter_map(|t| {
            let iteration = state.iteration(t.iteration_id)?;
            let job = state.job(iteration.job_id)?;
            let dataset = state.dataset(&job.dataset_id)?;
            Some(task_def(
                t,
                job,
                dataset,
                state.worker_index(worker),
                state.static_workers(),
            ))
        })
        .collect();
    let tasks_to_delete = current.difference(&active_ids).copied().collect();
    pb::WorkerHeartbeatResponse {
        new_tasks,
        tasks_to_delete,
    }
}
