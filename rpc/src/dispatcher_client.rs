//! `DispatcherClient`: calls the dispatcher quorum, one typed method per dispatcher RPC.
//!
//! The calls follow the leader, retry and hedge as [`Quorum`] does. Each typed method builds
//! its request once, with a fresh request id for a mutating call, and sends it through the
//! quorum's retry loop (`Quorum::call`). Each attempt has a deadline, set by how long the
//! dispatcher may take to answer (`Wait`): a long poll (`poll`) adds its wait to it. Leases go
//! through the client's [`LeaseBatcher`], which sends concurrent ones together.
//!
//! Mutating calls carry a `RequestId` (this client's random requester id, a sequence number and
//! the watermark, see `request_ids`) that stays the same across retries of one call, so a retry
//! after a lost reply returns the outcome the dispatcher recorded instead of acting twice. The
//! typed method holds the id in flight until `call` returns, which is after its last attempt
//! ended: an abandoned attempt is dropped before the next one starts, and one still executing
//! on a frozen replica can commit nothing there (a newer leader exists), or reaches a replica
//! after the watermark passed it and is refused.

use crate::convert::{lease_result, FromProto, ToProto};
use crate::dispatcher_rpcs::{
    ClientHeartbeat, ClientHeartbeatReply, IterationClient, JobRequest, TaskDelivery,
    WorkerHeartbeat,
};
use crate::error::{is_retryable_status, RpcError};
use crate::lease_batcher::LeaseBatcher;
use crate::quorum::{Quorum, RetryConfig, Wait};
use crate::request_ids::{InFlight, RequestIds};
use bytes::Bytes;
use sluice_element::blob_tensors::{self, BlobDigest};
use sluice_proto::dataset as dpb;
use sluice_proto::dispatcher as pb;
use sluice_security::fetch_admission::FETCH_KEY_LEN;
use sluice_security::{Admission, ClientSecurity};
use sluice_types::{
    ClientId, DatasetId, IterationId, JobId, LeaseRequest, NodeId, SplitLease, TaskId, WorkerId,
};
use std::sync::Arc;
use std::time::Duration;

/// How long the dispatcher may hold a task removal vote while the other consumers ask.
const REMOVAL_WAIT: Duration = Duration::from_secs(11);
/// Membership changes wait for the new replica to catch up.
const MEMBERSHIP_WAIT: Duration = Duration::from_secs(30);
/// The dispatcher's catch-up deadline of `add_node` when the caller names none.
const DEFAULT_CATCH_UP: Duration = Duration::from_secs(30);

/// A clone-able client of the dispatcher quorum.
#[derive(Clone)]
pub struct DispatcherClient {
    inner: Arc<Inner>,
}

struct Inner {
    quorum: Quorum,
    request_ids: Arc<RequestIds>,
    /// Lease requests waiting to be sent together.
    leases: LeaseBatcher,
}

/// Tensors with more data than this travel as blobs when a definition is registered.
pub const BLOB_THRESHOLD: usize = 256 * 1024;

/// The largest blob (one tensor's data): 2 GiB, the limit on a constant in a tf.data graph.
pub const MAX_BLOB_BYTES: u64 = 2 << 30;

/// The most bytes one chunk of a blob carries.
const BLOB_CHUNK_BYTES: usize = 1 << 20;

/// How often a blob fetch that breaks off is resumed before it fails.
const MAX_BLOB_RESUMES: u32 = 5;

/// How long a blob of `len` bytes may take to travel, at 10 MiB/s at the least, beyond a
/// fixed minute (the leader also hands it to a majority of replicas before it answers).
fn transfer_wait(len: u64) -> Duration {
    Duration::from_secs(60 + len / (10 << 20))
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
             its limit is set by --max-definition-size (numeric tensors over 256 KiB travel \
             apart as blobs and do not count; many small tensors and strings do: keep such \
             data in files)",
            prost::Message::encoded_len(def)
        )),
        other => other,
    }
}

impl DispatcherClient {
    /// A client of the replicas at `addrs` (`host:port`, comma-separated lists accepted).
    pub fn new(addrs: &str) -> Result<DispatcherClient, RpcError> {
        Self::with_retry(addrs, RetryConfig::default())
    }

    pub fn with_retry(addrs: &str, retry: RetryConfig) -> Result<DispatcherClient, RpcError> {
        Self::connect(addrs, retry, ClientSecurity::default())
    }

    /// A client presenting `security` (TLS settings and token) on every call.
    pub fn connect(
        addrs: &str,
        retry: RetryConfig,
        security: ClientSecurity,
    ) -> Result<DispatcherClient, RpcError> {
        Ok(Self::over(Quorum::new(addrs, retry, security)?))
    }

    /// A client of the same replicas over this one's connections, with a requester id (and
    /// request sequence) of its own, as a caller in another process would have. For harnesses
    /// that simulate many callers in one process without opening a connection per caller.
    pub fn sharing_connections(&self) -> DispatcherClient {
        Self::over(self.inner.quorum.sharing_connections())
    }

    fn over(quorum: Quorum) -> DispatcherClient {
        DispatcherClient {
            inner: Arc::new(Inner {
                quorum,
                request_ids: RequestIds::new(rand::random()),
                leases: LeaseBatcher::default(),
            }),
        }
    }

    /// The addresses this client was given.
    pub fn addrs(&self) -> &[String] {
        self.inner.quorum.addrs()
    }

    /// What this client presents; readers present the same to workers.
    pub fn security(&self) -> &ClientSecurity {
        self.inner.quorum.security()
    }

    /// How many lease calls this client has sent (a batch counts once; retries of a call are
    /// not counted). With the leases asked for, it tells how many leases a call carried.
    pub fn lease_calls(&self) -> u64 {
        self.inner.leases.calls()
    }

    /// This client's lease requests waiting to be sent together.
    pub(crate) fn lease_batcher(&self) -> &LeaseBatcher {
        &self.inner.leases
    }

    /// A fresh id for one mutating call; reuse it for every retry of that call, and keep the
    /// guard until the call is over.
    fn begin_request(&self) -> InFlight {
        self.inner.request_ids.begin()
    }

    /// Registers a dataset definition (file lists already expanded) with its metadata; returns
    /// its id, `dataset_id` when one was given.
    ///
    /// The data of every tensor over [`BLOB_THRESHOLD`] bytes travels apart from the
    /// definition, as a blob (see [`DispatcherClient::put_blob`]): uploaded first, then named
    /// by its digest in the definition that is registered. So the definition's size limit
    /// (`--max-definition-size`) bounds what is left, and each large tensor has a limit of its
    /// own (2 GiB, as a constant in a tf.data graph).
    pub async fn register_dataset_def(
        &self,
        def: &dpb::DatasetDef,
        dataset_id: Option<&DatasetId>,
        metadata: &pb::DatasetMetadata,
    ) -> Result<DatasetId, RpcError> {
        let mut has_large = false;
        blob_tensors::visit(def, &mut |t| has_large |= t.data.len() > BLOB_THRESHOLD);
        if has_large {
            let mut slim = def.clone();
            let blobs = blob_tensors::extract(&mut slim, BLOB_THRESHOLD);
            for (digest, data) in blobs {
                self.put_blob(&digest, data).await?;
            }
            return self.register_prepared(&slim, dataset_id, metadata).await;
        }
        self.register_prepared(def, dataset_id, metadata).await
    }

    /// Uploads `data` as the blob `digest` names (its SHA-256), in chunks of at most 1 MiB;
    /// returns once a majority of the dispatcher replicas hold it. A blob the leader holds
    /// already is acknowledged after its first chunk.
    pub async fn put_blob(&self, digest: &BlobDigest, data: Bytes) -> Result<(), RpcError> {
        let len = data.len() as u64;
        if len > MAX_BLOB_BYTES {
            return Err(RpcError::InvalidArgument(format!(
                "a tensor of {len} bytes is more than the largest constant a definition may \
                 hold, {MAX_BLOB_BYTES} bytes (2 GiB, as tf.data's graphs): keep data this \
                 large in files"
            )));
        }
        let chunks: Vec<pb::PutBlobChunk> = if data.is_empty() {
            vec![pb::PutBlobChunk {
                digest: digest.to_vec(),
                total_len: 0,
                data: Bytes::new(),
            }]
        } else {
            (0..data.len())
                .step_by(BLOB_CHUNK_BYTES)
                .map(|start| pb::PutBlobChunk {
                    digest: if start == 0 {
                        digest.to_vec()
                    } else {
                        Vec::new()
                    },
                    total_len: if start == 0 { len } else { 0 },
                    data: data.slice(start..(start + BLOB_CHUNK_BYTES).min(data.len())),
                })
                .collect()
        };
        self.inner
            .quorum
            .call("put_blob", Wait::Poll(transfer_wait(len)), |c, timeout| {
                let mut request = tonic::Request::new(tokio_stream::iter(chunks.clone()));
                request.set_timeout(timeout);
                async move {
                    c.max_encoding_message_size(2 * BLOB_CHUNK_BYTES)
                        .put_blob(request)
                        .await
                }
            })
            .await?;
        Ok(())
    }

    /// Blob `digest` (`len` bytes), fetched from the dispatcher; a fetch that breaks off
    /// resumes where it stopped. The bytes are checked against the digest.
    pub async fn get_blob(&self, digest: &BlobDigest, len: u64) -> Result<Bytes, RpcError> {
        let capacity = usize::try_from(len.min(MAX_BLOB_BYTES)).unwrap_or(0);
        let mut got = Vec::with_capacity(capacity);
        let mut breaks = 0;
        loop {
            let request = pb::GetBlobRequest {
                digest: digest.to_vec(),
                offset: got.len() as u64,
            };
            let mut stream = self
                .inner
                .quorum
                .call("get_blob", Wait::Poll(transfer_wait(len)), |c, timeout| {
                    let request = timed(request.clone(), timeout);
                    async move {
                        c.max_decoding_message_size(2 * BLOB_CHUNK_BYTES)
                            .get_blob(request)
                            .await
                    }
                })
                .await?;
            let broke = loop {
                match stream.message().await {
                    Ok(Some(chunk)) => {
                        if chunk.total_len != len || got.len() + chunk.data.len() > capacity {
                            return Err(RpcError::FailedPrecondition(format!(
                                "blob {} is {} bytes at the dispatcher, not the {len} bytes \
                                 the definition names",
                                blob_tensors::hex(digest),
                                chunk.total_len
                            )));
                        }
                        got.extend_from_slice(&chunk.data);
                    }
                    Ok(None) => break None,
                    Err(status) => break Some(status),
                }
            };
            match broke {
                None if got.len() as u64 == len => break,
                None => {
                    return Err(RpcError::FailedPrecondition(format!(
                        "the dispatcher sent {} of blob {}'s {len} bytes",
                        got.len(),
                        blob_tensors::hex(digest)
                    )))
                }
                Some(status) if breaks < MAX_BLOB_RESUMES && is_retryable_status(&status) => {
                    breaks += 1;
                }
                Some(status) => return Err(RpcError::from_status(&status)),
            }
        }
        if blob_tensors::digest(&got) != *digest {
            return Err(RpcError::FailedPrecondition(format!(
                "the {len} bytes fetched as blob {} do not hash to its digest",
                blob_tensors::hex(digest)
            )));
        }
        Ok(Bytes::from(got))
    }

    /// Registers `def` as it is (its large tensors already blobs).
    async fn register_prepared(
        &self,
        def: &dpb::DatasetDef,
        dataset_id: Option<&DatasetId>,
        metadata: &pb::DatasetMetadata,
    ) -> Result<DatasetId, RpcError> {
        let in_flight = self.begin_request();
        let request_id = in_flight.id;
        let response = self
            .inner
            .quorum
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
        self.inner
            .quorum
            .call("get_dataset", Wait::Slow, |mut c, timeout| {
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
            delivery: job.delivery.to_proto() as i32,
        };
        let response = self
            .inner
            .quorum
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
        self.attach_to_iteration(job_id, repetition, None).await
    }

    /// Attaches a new client to the iteration `(job_id, repetition)` restored from a reader's
    /// state at `step` (`reader` names the reader that took it): the one another reader of the
    /// same state restored already, or a new one.
    pub async fn resume_iteration(
        &self,
        job_id: JobId,
        repetition: u64,
        step: u64,
        reader: &str,
    ) -> Result<IterationClient, RpcError> {
        let resume = pb::ResumeFrom {
            step,
            reader: reader.to_string(),
        };
        self.attach_to_iteration(job_id, repetition, Some(resume))
            .await
    }

    async fn attach_to_iteration(
        &self,
        job_id: JobId,
        repetition: u64,
        resume: Option<pb::ResumeFrom>,
    ) -> Result<IterationClient, RpcError> {
        let in_flight = self.begin_request();
        let request = pb::GetOrCreateIterationRequest {
            job_id: job_id.0,
            repetition,
            request_id: Some(in_flight.id),
            resume,
        };
        let response = self
            .inner
            .quorum
            .call("get_or_create_iteration", Wait::Brief, |mut c, timeout| {
                let request = timed(request.clone(), timeout);
                async move { c.get_or_create_iteration(request).await }
            })
            .await?;
        let admission = Admission::from_bytes(&response.admission).ok_or_else(|| {
            RpcError::FailedPrecondition(format!(
                "the dispatcher admitted client {} to iteration {} with a credential of {} \
                 bytes, not {FETCH_KEY_LEN}: workers will not serve it (the dispatcher and \
                 this client must be the same release)",
                response.iteration_client_id,
                response.iteration_id,
                response.admission.len()
            ))
        })?;
        Ok(IterationClient {
            iteration_id: IterationId(response.iteration_id),
            client_id: ClientId(response.iteration_client_id),
            admission,
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
            .inner
            .quorum
            .call("client_heartbeat", Wait::Poll(poll), |mut c, timeout| {
                let request = timed(request, timeout);
                async move { c.client_heartbeat(request).await }
            })
            .await?;
        // A failed iteration (a task crashed its worker) ends every read of it with the reason.
        if !response.iteration_failure.is_empty() {
            return Err(RpcError::FailedPrecondition(response.iteration_failure));
        }
        Ok(ClientHeartbeatReply {
            tasks: (!response.tasks_unchanged).then_some(response.tasks),
            iteration_finished: response.iteration_finished,
            block_round: response.block_round,
            release_tasks: response.release_tasks.into_iter().map(TaskId).collect(),
        })
    }

    /// Reports what this client received from exactly-once tasks (runs `[start, end)` of each
    /// task stream's element indices) and which tasks it let go of for good. Retries carry one
    /// request id, and merging what was received is idempotent.
    pub async fn report_delivered(
        &self,
        client_id: ClientId,
        reports: &[TaskDelivery],
    ) -> Result<(), RpcError> {
        let in_flight = self.begin_request();
        let request = pb::ReportDeliveredRequest {
            iteration_client_id: client_id.0,
            tasks: reports
                .iter()
                .map(|r| pb::TaskDelivery {
                    task_id: r.task_id.0,
                    runs: r.runs.iter().flat_map(|(s, e)| [s, e]).collect(),
                    released: r.released,
                })
                .collect(),
            request_id: Some(in_flight.id),
        };
        self.inner
            .quorum
            .call("report_delivered", Wait::Brief, |mut c, timeout| {
                let request = timed(request.clone(), timeout);
                async move { c.report_delivered(request).await }
            })
            .await?;
        Ok(())
    }

    /// Records a reader's state at `step`: what it handed out since its state at `base_step`
    /// (or since it joined), as runs of task stream indices. Returns the job's name, the
    /// repetition, and the hex key of the definition the job reads.
    pub async fn save_checkpoint(
        &self,
        client_id: ClientId,
        reader: &str,
        step: u64,
        base_step: Option<u64>,
        taken: &[TaskDelivery],
    ) -> Result<pb::SaveCheckpointResponse, RpcError> {
        let in_flight = self.begin_request();
        let request = pb::SaveCheckpointRequest {
            iteration_client_id: client_id.0,
            reader: reader.to_string(),
            step,
            base_step,
            taken: taken
                .iter()
                .map(|r| pb::TaskDelivery {
                    task_id: r.task_id.0,
                    runs: r.runs.iter().flat_map(|(s, e)| [s, e]).collect(),
                    released: false,
                })
                .collect(),
            request_id: Some(in_flight.id),
        };
        self.inner
            .quorum
            .call("save_checkpoint", Wait::Brief, |mut c, timeout| {
                let request = timed(request.clone(), timeout);
                async move { c.save_checkpoint(request).await }
            })
            .await
    }

    /// Detaches a client from its iteration.
    pub async fn release_iteration_client(&self, client_id: ClientId) -> Result<(), RpcError> {
        let in_flight = self.begin_request();
        let request = pb::ReleaseIterationClientRequest {
            iteration_client_id: client_id.0,
            request_id: Some(in_flight.id),
        };
        self.inner
            .quorum
            .call("release_iteration_client", Wait::Brief, |mut c, timeout| {
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
        self.worker_heartbeat_reporting(heartbeat, None, poll).await
    }

    /// [`DispatcherClient::worker_heartbeat`] that also reports how the worker's previous run
    /// crashed (`crash`), so the dispatcher fails the iterations of the tasks it was running.
    pub async fn worker_heartbeat_reporting(
        &self,
        heartbeat: &WorkerHeartbeat,
        crash: Option<&pb::CrashReport>,
        poll: Duration,
    ) -> Result<pb::WorkerHeartbeatResponse, RpcError> {
        let in_flight = self.begin_request();
        let request = pb::WorkerHeartbeatRequest {
            worker_address: heartbeat.worker.0.clone(),
            current_tasks: heartbeat.current_tasks.iter().map(|t| t.0).collect(),
            request_id: Some(in_flight.id),
            tags: heartbeat.tags.clone(),
            poll_timeout_ms: poll.as_millis() as u64,
            crash: crash.cloned(),
            incarnation: heartbeat.incarnation,
        };
        self.inner
            .quorum
            .call("worker_heartbeat", Wait::Poll(poll), |mut c, timeout| {
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
        self.inner
            .quorum
            .call("worker_update", Wait::Brief, |mut c, timeout| {
                let request = timed(request.clone(), timeout);
                async move { c.worker_update(request).await }
            })
            .await?;
        Ok(())
    }

    /// Leases splits for a task of a distributed_epoch iteration. Leases this client asks for
    /// while another is on its way are sent together (see `LeaseBatcher`).
    pub async fn lease_splits(&self, lease: &LeaseRequest) -> Result<SplitLease, RpcError> {
        self.lease_splits_ahead(lease, Duration::ZERO).await
    }

    /// [`lease_splits`](Self::lease_splits) for a lease asked for ahead of need: it may wait up
    /// to `slack` to go in one call with this client's other leases (see
    /// [`lease_slack`](crate::lease_slack)).
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
        let response = self
            .lease_batcher()
            .lease(self, request, in_flight, slack)
            .await?;
        Ok(SplitLease::from_proto(response)?)
    }

    /// One lease in a call of its own (`LeaseSplits`).
    pub(crate) async fn lease_splits_once(
        &self,
        request: &pb::LeaseSplitsRequest,
    ) -> Result<pb::LeaseSplitsResponse, RpcError> {
        self.inner
            .quorum
            .call("lease_splits", Wait::Brief, |mut c, timeout| {
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
            .inner
            .quorum
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
            .inner
            .quorum
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
            .inner
            .quorum
            .call("get_status", Wait::Slow, |mut c, timeout| {
                let request = timed(request.clone(), timeout);
                async move { c.get_status(request).await }
            })
            .await?;
        Ok(response.json)
    }

    /// Adds replica `node_id`, whose Raft peer listener is at `peer_addr`, to the quorum (as a
    /// learner, then a voter once it has caught up). The replica must be running with `join`
    /// set; its client address enters the membership once it has caught up and recorded it.
    /// Returns the voters after the change. Waits the dispatcher's default catch-up deadline.
    pub async fn add_node(
        &self,
        node_id: NodeId,
        peer_addr: &str,
    ) -> Result<Vec<NodeId>, RpcError> {
        self.add_node_within(node_id, peer_addr, None).await
    }

    /// [`DispatcherClient::add_node`], with a catch-up deadline (`None`: the dispatcher's
    /// default, 30 s). A replica that has not caught up by then is refused
    /// (`FailedPrecondition`, naming it) and the voters stay as they were.
    pub async fn add_node_within(
        &self,
        node_id: NodeId,
        peer_addr: &str,
        catch_up: Option<Duration>,
    ) -> Result<Vec<NodeId>, RpcError> {
        let request = pb::AddNodeRequest {
            node_id,
            peer_addr: peer_addr.to_string(),
            catch_up_timeout_ms: catch_up.map_or(0, |d| d.as_millis().max(1) as u64),
        };
        let poll = catch_up.unwrap_or(DEFAULT_CATCH_UP) + MEMBERSHIP_WAIT;
        let response = self
            .inner
            .quorum
            .call("add_node", Wait::Poll(poll), |mut c, timeout| {
                let request = timed(request.clone(), timeout);
                async move { c.add_node(request).await }
            })
            .await?;
        Ok(response.voters)
    }

    /// Removes replica `node_id` from the quorum. Returns the voters after the change. A
    /// removal that would leave the voters answering the leader no majority is refused
    /// (`FailedPrecondition`) unless `force`.
    pub async fn remove_node(&self, node_id: NodeId) -> Result<Vec<NodeId>, RpcError> {
        self.remove_node_with(node_id, false).await
    }

    /// [`DispatcherClient::remove_node`], forced or not.
    pub async fn remove_node_with(
        &self,
        node_id: NodeId,
        force: bool,
    ) -> Result<Vec<NodeId>, RpcError> {
        let response = self
            .inner
            .quorum
            .call(
                "remove_node",
                Wait::Poll(MEMBERSHIP_WAIT),
                |mut c, timeout| {
                    let request = timed(pb::RemoveNodeRequest { node_id, force }, timeout);
                    async move { c.remove_node(request).await }
                },
            )
            .await?;
        Ok(response.voters)
    }
}

#[cfg(test)]
#[path = "dispatcher_client_tests.rs"]
mod tests;
