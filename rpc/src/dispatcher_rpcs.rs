//! The dispatcher's RPCs as typed methods of [`DispatcherClient`], one per RPC.
//!
//! Each method builds its request once, with a fresh request id for a mutating call, and sends
//! it through the leader-following retry loop: every retry of one call carries the same request
//! id, so a retry after a lost reply gets the outcome the dispatcher recorded (a split lease is
//! never handed out twice). Each attempt has a deadline, set by how long the dispatcher may take
//! to answer (`Wait`): a long poll (`poll`) adds its wait to it.

use crate::convert::{lease_result, FromProto, ToProto};
use crate::dispatcher_client::{DispatcherClient, Wait};
use crate::error::RpcError;
use sluice_proto::dataset as dpb;
use sluice_proto::dispatcher as pb;
use sluice_types::{
    ClientId, DatasetId, IterationId, JobId, LeaseRequest, NodeId, ShardingPolicy, SplitLease,
    TargetWorkers, TaskId, WorkerId,
};
use std::time::Duration;

/// How long the dispatcher may hold a task removal vote while the other consumers ask.
const REMOVAL_WAIT: Duration = Duration::from_secs(11);
/// Membership changes wait for the new replica to catch up.
const MEMBERSHIP_WAIT: Duration = Duration::from_secs(30);

/// The job a client asks for (tf.data's `GetOrCreateJob`): a named job requested again must ask
/// for the same parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRequest {
    pub dataset_id: DatasetId,
    pub sharding: ShardingPolicy,
    /// Consumers with the same name share the job; `None` makes a fresh anonymous job.
    pub job_name: Option<String>,
    /// Coordinated reads: how many consumers read in lockstep rounds.
    pub num_consumers: Option<u32>,
    pub use_cross_trainer_cache: bool,
    pub target_workers: TargetWorkers,
}

/// The iteration a client was attached to, and its id as a client of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IterationClient {
    pub iteration_id: IterationId,
    pub client_id: ClientId,
}

/// A client's heartbeat; `current_round` and `blocked_round` only for coordinated reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientHeartbeat {
    pub client_id: ClientId,
    /// The task list the client holds: the dispatcher answers at once when it has another,
    /// and leaves the list out of a reply while it is the same.
    pub known_tasks: KnownTasks,
    pub current_round: Option<u64>,
    pub blocked_round: Option<u64>,
}

/// A client's task list as its heartbeat describes it: its length and last task. The
/// dispatcher only appends tasks (with fresh ids) or removes them, so the two tell any change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KnownTasks {
    pub count: u32,
    pub last: Option<u64>,
}

impl KnownTasks {
    /// The list a heartbeat reply gave, in its order.
    pub fn of(tasks: &[pb::TaskInfo]) -> Self {
        KnownTasks {
            count: tasks.len() as u32,
            last: tasks.last().map(|t| t.task_id),
        }
    }
}

/// A client heartbeat's reply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientHeartbeatReply {
    /// The iteration's tasks, in the dispatcher's order; `None` when the caller's list is still
    /// current.
    pub tasks: Option<Vec<pb::TaskInfo>>,
    pub iteration_finished: bool,
    /// Coordinated reads: a pending task joins at this round.
    pub block_round: Option<u64>,
}

/// A worker's heartbeat: the tasks it holds; the first one registers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerHeartbeat {
    pub worker: WorkerId,
    pub current_tasks: Vec<TaskId>,
    pub tags: Vec<String>,
}

/// The longest a lease asked for ahead of need waits for company (see [`lease_slack`]).
pub const MAX_LEASE_SLACK: Duration = Duration::from_secs(1);

/// The slack of a lease asked for as the one before it is installed, when that one's
/// predecessor lasted `lasted`: half that time, at most [`MAX_LEASE_SLACK`]. The lease just
/// installed is at least as large as its predecessor, so the one asked for ahead arrives
/// before it is needed unless the task speeds up to twice its pace.
pub fn lease_slack(lasted: Duration) -> Duration {
    (lasted / 2).min(MAX_LEASE_SLACK)
}

/// A request with the attempt's deadline.
fn timed<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// A registration the dispatcher's decode bound refused (`OutOfRange`, with tonic's text naming
/// the message's size and the bound) becomes the same `InvalidArgument` as one its handler
/// refused: the definition's size, and the flag that sets the bound.
fn too_large_definition(e: RpcError, def: &dpb::DatasetDef) -> RpcError {
    match e {
        RpcError::Status {
            code: tonic::Code::OutOfRange,
            message,
        } => RpcError::InvalidArgument(format!(
            "the dataset definition is {} bytes, more than the dispatcher accepts ({message}); \
             its limit is set by --max-definition-size, and large constant data belongs in \
             files rather than in the definition",
            prost::Message::encoded_len(def)
        )),
        other => other,
    }
}

impl DispatcherClient {
    /// Registers a dataset definition (file lists already expanded) with its metadata; returns
    /// its id, `dataset_id` when one was given.
    pub async fn register_dataset_def(
        &self,
        def: &dpb::DatasetDef,
        dataset_id: Option<&DatasetId>,
        metadata: &pb::DatasetMetadata,
    ) -> Result<DatasetId, RpcError> {
        let in_flight = self.begin_request();
        let request_id = in_flight.id;
        let response = self
            .call("register_dataset", Wait::Slow, |mut c, timeout| {
                // Built per attempt from the borrowed definition: one copy of a large
                // definition per attempt, not two.
                let request = pb::RegisterDatasetRequest {
                    dataset: Some(def.clone()),
                    dataset_id: dataset_id.map(|id| id.0.clone()),
                    metadata: Some(metadata.clone()),
                    request_id: Some(request_id),
                };
                let request = timed(request, timeout);
                async move { c.register_dataset(request).await }
            })
            .await
            .map_err(|e| too_large_definition(e, def))?;
        Ok(DatasetId(response.dataset_id))
    }

    /// A registered dataset's definition and metadata.
    pub async fn get_dataset(
        &self,
        dataset_id: &DatasetId,
    ) -> Result<pb::GetDatasetResponse, RpcError> {
        let request = pb::GetDatasetRequest {
            dataset_id: dataset_id.0.clone(),
        };
        self.call("get_dataset", Wait::Slow, |mut c, timeout| {
            let request = timed(request.clone(), timeout);
            async move { c.get_dataset(request).await }
        })
        .await
    }

    /// The job `job` names, created if absent.
    pub async fn get_or_create_job(&self, job: &JobRequest) -> Result<JobId, RpcError> {
        let in_flight = self.begin_request();
        let request = pb::GetOrCreateJobRequest {
            dataset_id: job.dataset_id.0.clone(),
            sharding_policy: job.sharding.to_proto() as i32,
            job_name: job.job_name.clone(),
            request_id: Some(in_flight.id),
            num_consumers: job.num_consumers,
            use_cross_trainer_cache: job.use_cross_trainer_cache,
            target_workers: job.target_workers.to_proto() as i32,
        };
        let response = self
            .call("get_or_create_job", Wait::Brief, |mut c, timeout| {
                let request = timed(request.clone(), timeout);
                async move { c.get_or_create_job(request).await }
            })
            .await?;
        Ok(JobId(response.job_id))
    }

    /// Attaches a new client to the iteration `(job_id, repetition)`, created if absent.
    pub async fn get_or_create_iteration(
        &self,
        job_id: JobId,
        repetition: u64,
    ) -> Result<IterationClient, RpcError> {
        let in_flight = self.begin_request();
        let request = pb::GetOrCreateIterationRequest {
            job_id: job_id.0,
            repetition,
            request_id: Some(in_flight.id),
        };
        let response = self
            .call("get_or_create_iteration", Wait::Brief, |mut c, timeout| {
                let request = timed(request, timeout);
                async move { c.get_or_create_iteration(request).await }
            })
            .await?;
        Ok(IterationClient {
            iteration_id: IterationId(response.iteration_id),
            client_id: ClientId(response.iteration_client_id),
        })
    }

    /// A client's heartbeat: its iteration's tasks. The dispatcher may hold it up to `poll`
    /// while nothing changed.
    pub async fn client_heartbeat(
        &self,
        heartbeat: &ClientHeartbeat,
        poll: Duration,
    ) -> Result<ClientHeartbeatReply, RpcError> {
        let request = pb::ClientHeartbeatRequest {
            iteration_client_id: heartbeat.client_id.0,
            poll_timeout_ms: poll.as_millis() as u64,
            known_tasks: heartbeat.known_tasks.count,
            current_round: heartbeat.current_round,
            blocked_round: heartbeat.blocked_round,
            omit_unchanged_tasks: true,
            last_known_task: heartbeat.known_tasks.last.unwrap_or_default(),
        };
        let response = self
            .call("client_heartbeat", Wait::Poll(poll), |mut c, timeout| {
                let request = timed(request, timeout);
                async move { c.client_heartbeat(request).await }
            })
            .await?;
        Ok(ClientHeartbeatReply {
            tasks: (!response.tasks_unchanged).then_some(response.tasks),
            iteration_finished: response.iteration_finished,
            block_round: response.block_round,
        })
    }

    /// Detaches a client from its iteration.
    pub async fn release_iteration_client(&self, client_id: ClientId) -> Result<(), RpcError> {
        let in_flight = self.begin_request();
        let request = pb::ReleaseIterationClientRequest {
            iteration_client_id: client_id.0,
            request_id: Some(in_flight.id),
        };
        self.call("release_iteration_client", Wait::Brief, |mut c, timeout| {
            let request = timed(request, timeout);
            async move { c.release_iteration_client(request).await }
        })
        .await?;
        Ok(())
    }

    /// A worker's heartbeat (the first registers it): new tasks and tasks to delete. The
    /// dispatcher may hold it up to `poll` while nothing changed.
    pub async fn worker_heartbeat(
        &self,
        heartbeat: &WorkerHeartbeat,
        poll: Duration,
    ) -> Result<pb::WorkerHeartbeatResponse, RpcError> {
        let in_flight = self.begin_request();
        let request = pb::WorkerHeartbeatRequest {
            worker_address: heartbeat.worker.0.clone(),
            current_tasks: heartbeat.current_tasks.iter().map(|t| t.0).collect(),
            request_id: Some(in_flight.id),
            tags: heartbeat.tags.clone(),
            poll_timeout_ms: poll.as_millis() as u64,
        };
        self.call("worker_heartbeat", Wait::Poll(poll), |mut c, timeout| {
            let request = timed(request.clone(), timeout);
            async move { c.worker_heartbeat(request).await }
        })
        .await
    }

    /// Reports tasks of `worker` whose end a reader saw.
    pub async fn worker_update(
        &self,
        worker: &WorkerId,
        completed: &[TaskId],
    ) -> Result<(), RpcError> {
        let in_flight = self.begin_request();
        let request = pb::WorkerUpdateRequest {
            worker_address: worker.0.clone(),
            completed_tasks: completed.iter().map(|t| t.0).collect(),
            request_id: Some(in_flight.id),
        };
        self.call("worker_update", Wait::Brief, |mut c, timeout| {
            let request = timed(request.clone(), timeout);
            async move { c.worker_update(request).await }
        })
        .await?;
        Ok(())
    }

    /// Leases splits for a task of a distributed_epoch iteration. Leases this client asks for
    /// while another is on its way are sent together (see `lease_batcher`).
    pub async fn lease_splits(&self, lease: &LeaseRequest) -> Result<SplitLease, RpcError> {
        self.lease_splits_ahead(lease, Duration::ZERO).await
    }

    /// [`lease_splits`](Self::lease_splits) for a lease asked for ahead of need: it may wait up
    /// to `slack` to go in one call with this client's other leases (see [`lease_slack`]).
    pub async fn lease_splits_ahead(
        &self,
        lease: &LeaseRequest,
        slack: Duration,
    ) -> Result<SplitLease, RpcError> {
        let in_flight = self.begin_request();
        let request = pb::LeaseSplitsRequest {
            request_id: Some(in_flight.id),
            ..lease.to_proto()
        };
        let response = self.lease_together(request, in_flight, slack).await?;
        Ok(SplitLease::from_proto(response)?)
    }

    /// One lease in a call of its own (`LeaseSplits`).
    pub(crate) async fn lease_splits_once(
        &self,
        request: &pb::LeaseSplitsRequest,
    ) -> Result<pb::LeaseSplitsResponse, RpcError> {
        self.call("lease_splits", Wait::Brief, |mut c, timeout| {
            let request = timed(*request, timeout);
            async move { c.lease_splits(request).await }
        })
        .await
    }

    /// Several leases in one call (`LeaseSplitsBatch`): each lease's answer, in order, or the
    /// call's error.
    pub(crate) async fn lease_splits_batch(
        &self,
        leases: Vec<pb::LeaseSplitsRequest>,
    ) -> Result<Vec<Result<pb::LeaseSplitsResponse, RpcError>>, RpcError> {
        let request = pb::LeaseSplitsBatchRequest { leases };
        let response = self
            .call("lease_splits_batch", Wait::Brief, |mut c, timeout| {
                let request = timed(request.clone(), timeout);
                async move { c.lease_splits_batch(request).await }
            })
            .await?;
        Ok(response.results.into_iter().map(lease_result).collect())
    }

    /// A coordinated consumer's vote to take `task_id` out of the rounds, from `round` on;
    /// true once every consumer voted and the task was removed.
    pub async fn maybe_remove_task(
        &self,
        task_id: TaskId,
        consumer_index: u32,
        round: u64,
    ) -> Result<bool, RpcError> {
        let request = pb::MaybeRemoveTaskRequest {
            task_id: task_id.0,
            consumer_index,
            round,
        };
        let response = self
            .call(
                "maybe_remove_task",
                Wait::Poll(REMOVAL_WAIT),
                |mut c, timeout| {
                    let request = timed(request, timeout);
                    async move { c.maybe_remove_task(request).await }
                },
            )
            .await?;
        Ok(response.removed)
    }

    /// The status JSON of the replica that answers (its own view: leader, members, workers,
    /// jobs, iterations), every page of it merged into one document.
    pub async fn get_status(&self) -> Result<String, RpcError> {
        let mut merged: Option<serde_json::Value> = None;
        let mut token = String::new();
        loop {
            let page = self.get_status_page(0, &token).await?;
            let mut page: serde_json::Value =
                serde_json::from_str(&page).map_err(|e| RpcError::Status {
                    code: tonic::Code::Internal,
                    message: format!("the dispatcher's status is not JSON: {e}"),
                })?;
            let next = page
                .get("next_page_token")
                .and_then(|t| t.as_str())
                .map(str::to_string);
            match merged.as_mut() {
                None => merged = Some(page.take()),
                Some(document) => {
                    for list in ["datasets", "workers", "jobs", "iterations"] {
                        let more = page.get_mut(list).map(serde_json::Value::take);
                        if let (
                            Some(serde_json::Value::Array(into)),
                            Some(serde_json::Value::Array(more)),
                        ) = (document.get_mut(list), more)
                        {
                            into.extend(more);
                        }
                    }
                }
            }
            match next {
                // A token that does not move on would repeat the page forever.
                Some(next) if next != token => token = next,
                _ => break,
            }
        }
        let mut document = merged.unwrap_or_default();
        // The merged document is the whole status: no page follows it.
        if let Some(object) = document.as_object_mut() {
            object.remove("next_page_token");
        }
        Ok(document.to_string())
    }

    /// One page of the status JSON: at most `page_size` entries per list (0: the dispatcher's
    /// default) after `page_token` (empty: the first page).
    pub async fn get_status_page(
        &self,
        page_size: u32,
        page_token: &str,
    ) -> Result<String, RpcError> {
        let request = pb::GetStatusRequest {
            page_size,
            page_token: page_token.to_string(),
        };
        let response = self
            .call("get_status", Wait::Slow, |mut c, timeout| {
                let request = timed(request.clone(), timeout);
                async move { c.get_status(request).await }
            })
            .await?;
        Ok(response.json)
    }

    /// Adds replica `node_id`, whose Raft peer listener is at `peer_addr`, to the quorum (as a
    /// learner, then a voter). The replica must be running with `join` set; its client address
    /// enters the membership once it has caught up and recorded it. Returns the voters after the
    /// change.
    pub async fn add_node(
        &self,
        node_id: NodeId,
        peer_addr: &str,
    ) -> Result<Vec<NodeId>, RpcError> {
        let request = pb::AddNodeRequest {
            node_id,
            peer_addr: peer_addr.to_string(),
        };
        let response = self
            .call("add_node", Wait::Poll(MEMBERSHIP_WAIT), |mut c, timeout| {
                let request = timed(request.clone(), timeout);
                async move { c.add_node(request).await }
            })
            .await?;
        Ok(response.voters)
    }

    /// Removes replica `node_id` from the quorum. Returns the voters after the change.
    pub async fn remove_node(&self, node_id: NodeId) -> Result<Vec<NodeId>, RpcError> {
        let response = self
            .call(
                "remove_node",
                Wait::Poll(MEMBERSHIP_WAIT),
                |mut c, timeout| {
                    let request = timed(pb::RemoveNodeRequest { node_id }, timeout);
                    async move { c.remove_node(request).await }
                },
            )
            .await?;
        Ok(response.voters)
    }
}
