//! Coordinated reads: `num_consumers` consumers of a named job read in lockstep rounds, so every
//! consumer's step `r` comes from the same worker (tf.data's round-robin reads).
//!
//! Round `r` is one pass over the iteration's tasks in the dispatcher's order; in it consumer
//! `c` asks each task with `starting_round ≤ r` for element `c` of round `r`. Requests go out
//! strictly in that order, several at once (at most one per task, at most
//! `max_outstanding_requests`), and their results are handed to the caller in request order. A
//! round the worker skips (too few elements ready) yields nothing from that task.
//!
//! Tasks join mid-job through the dispatcher's pending-task protocol: while a task is pending,
//! heartbeats carry a `block_round`; the consumer stops before that round (unless it already
//! started it, which the dispatcher then sees and answers with a later round), reports the round
//! it holds before, and resumes once the task is listed with its `starting_round`.
//!
//! A worker that cannot be reached is retried with backoff; from the second failure the consumer
//! asks the dispatcher to remove the task, which happens once every consumer asked for the same
//! round, and the task's result becomes a skip.

use crate::element_stream::{Delivered, Delivery, Elements};
use crate::error::{is_worker_refusal, worker_refusal, ClientError};
use crate::options::HeartbeatWaits;
use futures::stream::{FuturesOrdered, StreamExt};
use sluice_proto::worker::worker_client::WorkerClient;
use sluice_proto::worker::GetElementRequest;
use sluice_rpc::{ClientHeartbeat, ClientHeartbeatReply, DispatcherClient, KnownTasks};
use sluice_types::{ClientId, TaskId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// How soon a consumer heartbeats again while a task is pending (it must report its rounds).
const PENDING_REFRESH: Duration = Duration::from_millis(20);

pub(crate) struct CoordinatedConfig {
    pub client_id: ClientId,
    pub consumer_index: u32,
    pub max_outstanding: u32,
    pub heartbeat_poll: Duration,
}

struct TaskEntry {
    task_id: u64,
    address: String,
    starting_round: u64,
    /// A request to this task is outstanding (strict order: one at a time per task).
    in_use: bool,
    removed: bool,
    skipped_previous_round: bool,
}

/// What one request came to.
enum Reply {
    Element(bytes::Bytes),
    Skip,
    /// The dispatcher removed the task: skip it from now on.
    Removed,
}

type Pending = Pin<Box<dyn Future<Output = (u64, Result<Reply, ClientError>)> + Send>>;

pub(crate) async fn run(
    client: DispatcherClient,
    config: CoordinatedConfig,
    permits: Arc<Semaphore>,
    out: flume::Sender<Delivery>,
    cancel: CancellationToken,
) -> Result<(), ClientError> {
    let mut reader = Reader {
        client,
        config,
        tasks: Vec::new(),
        channels: HashMap::new(),
        current_round: 0,
        next_task_index: 0,
        round_limit: None,
    };
    let mut in_flight: FuturesOrdered<Pending> = FuturesOrdered::new();
    // Permits of the requests in flight, in request order.
    let mut held: std::collections::VecDeque<OwnedSemaphorePermit> = Default::default();
    let mut heartbeat = Box::pin(reader.heartbeat_after(Duration::ZERO, Duration::ZERO));
    let mut waits = HeartbeatWaits::new(reader.config.heartbeat_poll);
    let mut iteration_finished = false;
    loop {
        // Issue every request the order, the limit and the permits allow.
        while !iteration_finished && in_flight.len() < reader.config.max_outstanding as usize {
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                break;
            };
            match reader.next_request() {
                Some(request) => {
                    held.push_back(permit);
                    in_flight.push_back(request);
                }
                None => break,
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            response = &mut heartbeat => {
                let response = response?;
                iteration_finished = response.iteration_finished;
                let pending = reader.apply_heartbeat(response);
                if iteration_finished && in_flight.is_empty() {
                    return Ok(());
                }
                let wait = if pending { PENDING_REFRESH } else { Duration::ZERO };
                let poll = if pending { Duration::ZERO } else { waits.draw() };
                heartbeat = Box::pin(reader.heartbeat_after(wait, poll));
            }
            Some((task_id, reply)) = in_flight.next(), if !in_flight.is_empty() => {
                let permit = held.pop_front().expect("one permit per request in flight");
                let task = reader.tasks.iter_mut().find(|t| t.task_id == task_id);
                if let Some(task) = task {
                    task.in_use = false;
                }
                match reply? {
                    Reply::Element(bytes) => {
                        let size = bytes.len() as u64;
                        let element = sluice_dataset::decode_element_bytes(bytes)?;
                        let delivered = Delivered { elements: Elements::one(element), permit: Some(permit), bytes: size };
                        if out.send_async(Ok(delivered)).await.is_err() {
                            return Ok(()); // the consumer went away
                        }
                    }
                    Reply::Skip => {
                        if let Some(task) = reader.task_mut(task_id) {
                            task.skipped_previous_round = true;
                        }
                    }
                    Reply::Removed => {
                        if let Some(task) = reader.task_mut(task_id) {
                            task.removed = true;
                        }
                    }
                }
                if iteration_finished && in_flight.is_empty() {
                    return Ok(());
                }
            }
            // A permit came back: loop to issue more requests.
            _ = permits.clone().acquire_owned(), if in_flight.is_empty() && permits.available_permits() == 0 => {}
        }
    }
}

struct Reader {
    client: DispatcherClient,
    config: CoordinatedConfig,
    /// The iteration's tasks in the dispatcher's order (the same for every consumer).
    tasks: Vec<TaskEntry>,
    channels: HashMap<String, Channel>,
    current_round: u64,
    next_task_index: usize,
    /// The round this consumer must not start yet (a task is pending for it).
    round_limit: Option<u64>,
}

impl Reader {
    fn task_mut(&mut self, task_id: u64) -> Option<&mut TaskEntry> {
        self.tasks.iter_mut().find(|t| t.task_id == task_id)
    }

    /// The next request in strict round order, or `None` if the next task in order is busy,
    /// the round is blocked, or no task can be read.
    fn next_request(&mut self) -> Option<Pending> {
        if self.tasks.iter().all(|t| t.removed) {
            return None;
        }
        for _ in 0..self.tasks.len() {
            if self
                .round_limit
                .is_some_and(|limit| self.current_round >= limit)
            {
                return None;
            }
            let round = self.current_round;
            let task = &self.tasks[self.next_task_index];
            if task.in_use {
                return None; // strict order: wait for this task's previous request
            }
            let eligible = !task.removed && round >= task.starting_round;
            self.next_task_index += 1;
            if self.next_task_index == self.tasks.len() {
                self.next_task_index = 0;
                self.current_round += 1;
            }
            if eligible {
                return Some(self.request(self.next_task_index_before(), round));
            }
        }
        None
    }

    fn next_task_index_before(&self) -> usize {
        (self.next_task_index + self.tasks.len() - 1) % self.tasks.len()
    }

    fn request(&mut self, index: usize, round: u64) -> Pending {
        let channel = self.channel(&self.tasks[index].address.clone());
        let task = &mut self.tasks[index];
        task.in_use = true;
        let request = GetElementRequest {
            task_id: task.task_id,
            consumer_index: self.config.consumer_index,
            round_index: round,
            allow_skip: true,
            skipped_previous_round: std::mem::take(&mut task.skipped_previous_round),
        };
        let (task_id, address) = (task.task_id, task.address.clone());
        let client = self.client.clone();
        Box::pin(async move {
            let reply = match channel {
                Ok(channel) => get_element(client, channel, address, request).await,
                Err(e) => Err(e),
            };
            (task_id, reply)
        })
    }

    /// The channel to a worker, with the reader's TLS settings (those of its dispatcher client).
    fn channel(&mut self, address: &str) -> Result<Channel, ClientError> {
        if let Some(channel) = self.channels.get(address) {
            return Ok(channel.clone());
        }
        let channel = self
            .client
            .security()
            .endpoint(address)
            .map_err(|e| ClientError::InvalidArgument(format!("worker address {address}: {e}")))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .connect_lazy();
        self.channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    fn heartbeat_after(
        &self,
        wait: Duration,
        poll: Duration,
    ) -> impl Future<Output = Result<ClientHeartbeatReply, ClientError>> + Send + 'static {
        let client = self.client.clone();
        let heartbeat = ClientHeartbeat {
            client_id: self.config.client_id,
            // The list mirrors the dispatcher's, in its order.
            known_tasks: KnownTasks {
                count: self.tasks.len() as u32,
                last: self.tasks.last().map(|t| t.task_id),
            },
            current_round: Some(self.current_round),
            blocked_round: self.round_limit,
        };
        async move {
            tokio::time::sleep(wait).await;
            Ok(client.client_heartbeat(&heartbeat, poll).await?)
        }
    }

    /// Takes in the dispatcher's task list and blocked round; true while a task is pending.
    fn apply_heartbeat(&mut self, response: ClientHeartbeatReply) -> bool {
        match response.block_round {
            // Already in that round: the dispatcher will move the target later.
            Some(block) if self.current_round >= block => {}
            Some(block) => self.round_limit = Some(block),
            None => self.round_limit = None,
        }
        let Some(listed_tasks) = response.tasks else {
            // The list is unchanged.
            return response.block_round.is_some();
        };
        let listed: Vec<u64> = listed_tasks.iter().map(|t| t.task_id).collect();
        // Tasks no longer listed were removed; keep the position in the round consistent.
        let mut index = 0;
        while index < self.tasks.len() {
            if listed.contains(&self.tasks[index].task_id) {
                index += 1;
                continue;
            }
            self.tasks.remove(index);
            if index < self.next_task_index {
                self.next_task_index -= 1;
            }
        }
        if self.next_task_index >= self.tasks.len() && !self.tasks.is_empty() {
            self.next_task_index = 0;
            self.current_round += 1;
        }
        for info in listed_tasks {
            if self.tasks.iter().any(|t| t.task_id == info.task_id) {
                continue;
            }
            self.tasks.push(TaskEntry {
                task_id: info.task_id,
                address: info.worker_address,
                starting_round: info.starting_round,
                in_use: false,
                removed: false,
                skipped_previous_round: false,
            });
        }
        response.block_round.is_some()
    }
}

/// One request, retried while the worker is unreachable; from the second failure the consumer
/// votes to remove the task.
async fn get_element(
    client: DispatcherClient,
    channel: Channel,
    address: String,
    request: GetElementRequest,
) -> Result<Reply, ClientError> {
    // The reader's token on every call, as on its dispatcher calls.
    let mut worker =
        WorkerClient::new(client.security().authed(channel)).max_decoding_message_size(usize::MAX);
    let mut backoff = Duration::from_millis(10);
    for failures in 1u32.. {
        let mut call = tonic::Request::new(request);
        // A round waits for every consumer, however slow: no deadline on the call itself.
        call.set_timeout(Duration::from_secs(3600));
        match worker.get_element(call).await {
            Ok(response) => {
                let response = response.into_inner();
                return Ok(if response.skip_task {
                    Reply::Skip
                } else {
                    Reply::Element(response.element)
                });
            }
            Err(status) if !is_worker_refusal(status.code()) => {
                tracing::debug!(
                    task = request.task_id,
                    round = request.round_index,
                    consumer = request.consumer_index,
                    failures,
                    "worker unreachable"
                );
                if failures >= 2 && maybe_remove_task(&client, &request).await? {
                    return Ok(Reply::Removed);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(status) => return Err(worker_refusal(&address, status)),
        }
    }
    unreachable!("the retry loop returns")
}

async fn maybe_remove_task(
    client: &DispatcherClient,
    request: &GetElementRequest,
) -> Result<bool, ClientError> {
    Ok(client
        .maybe_remove_task(
            TaskId(request.task_id),
            request.consumer_index,
            request.round_index,
        )
        .await?)
}
