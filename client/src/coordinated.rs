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

use crate::delivery::{Delivered, Delivery, Elements};
use crate::error::{is_worker_refusal, worker_refusal, ClientError};
use crate::options::HeartbeatWaits;
use crate::rounds::{Decision, Event, Heartbeat, Reply, Request, Rounds};
use futures::stream::{FuturesOrdered, StreamExt};
use sluice_proto::worker::worker_client::WorkerClient;
use sluice_proto::worker::GetElementRequest;
use sluice_rpc::{ClientHeartbeat, ClientHeartbeatReply, DispatcherClient};
use sluice_security::{Admission, ServerRole};
use sluice_types::{ClientId, TaskId};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub(crate) struct CoordinatedConfig {
    pub client_id: ClientId,
    /// The dispatcher's admission of `client_id` to its iteration, presented to the workers.
    pub admission: Admission,
    pub consumer_index: u32,
    pub max_outstanding: u32,
    pub heartbeat_poll: Duration,
}

type Pending = Pin<Box<dyn Future<Output = (u64, Result<Reply, ClientError>)> + Send>>;

type HeartbeatFuture =
    Pin<Box<dyn Future<Output = Result<ClientHeartbeatReply, ClientError>> + Send>>;

/// Reads the job's rounds until the epoch ends, performing what `Rounds` decides.
pub(crate) async fn run(
    client: DispatcherClient,
    config: CoordinatedConfig,
    permits: Arc<Semaphore>,
    out: flume::Sender<Delivery>,
    cancel: CancellationToken,
) -> Result<(), ClientError> {
    let mut rounds = Rounds::new(config.max_outstanding);
    let mut workers = Workers {
        client,
        consumer_index: config.consumer_index,
        client_id: config.client_id,
        admission: config.admission,
        channels: HashMap::new(),
    };
    let mut in_flight: FuturesOrdered<Pending> = FuturesOrdered::new();
    // Permits of the requests in flight, in request order.
    let mut held: VecDeque<OwnedSemaphorePermit> = VecDeque::new();
    let mut waits = HeartbeatWaits::new(config.heartbeat_poll);
    let mut heartbeat: Option<HeartbeatFuture> = None;
    let mut decisions: VecDeque<Decision> = rounds.start().into();
    // The free permit a request is decided for; the permit of the last reply.
    let mut free: Option<OwnedSemaphorePermit> = None;
    let mut replied: Option<OwnedSemaphorePermit> = None;
    loop {
        while let Some(decision) = decisions.pop_front() {
            match decision {
                Decision::Request(request) => {
                    held.push_back(free.take().expect("a request is decided for a free permit"));
                    in_flight.push_back(workers.request(request));
                }
                Decision::Deliver(bytes) => {
                    let size = bytes.len() as u64;
                    let event = match sluice_element::decode_element_bytes(bytes) {
                        Err(e) => Event::Failed(e.into()),
                        Ok(element) => {
                            let delivered = Delivered {
                                elements: Elements::one(element),
                                permit: replied.take(),
                                bytes: size,
                                indices: None,
                            };
                            match out.send_async(Ok(delivered)).await {
                                Ok(()) => Event::Delivered,
                                Err(_) => Event::Cancelled, // the consumer went away
                            }
                        }
                    };
                    decisions.extend(rounds.handle(event));
                }
                Decision::Heartbeat(next) => {
                    let poll = waits.wait(next.poll);
                    let client = workers.client.clone();
                    heartbeat = Some(Box::pin(send_heartbeat(
                        client,
                        config.client_id,
                        next,
                        poll,
                    )));
                }
                Decision::End(error) => return error.map_or(Ok(()), Err),
            }
        }
        replied = None;
        // Issue every request the order, the limit and the permits allow.
        if rounds.may_request() {
            if let Ok(permit) = permits.clone().try_acquire_owned() {
                free = Some(permit);
                decisions.extend(rounds.handle(Event::Permit));
                if !decisions.is_empty() {
                    continue;
                }
                free = None;
            }
        }
        let event = tokio::select! {
            _ = cancel.cancelled() => Event::Cancelled,
            response = async { heartbeat.as_mut().expect("guarded").await }, if heartbeat.is_some() => {
                heartbeat = None;
                match response {
                    Ok(reply) => Event::Heartbeat {
                        tasks: reply.tasks,
                        iteration_finished: reply.iteration_finished,
                        block_round: reply.block_round,
                    },
                    Err(e) => Event::Failed(e),
                }
            }
            Some((task_id, reply)) = in_flight.next(), if !in_flight.is_empty() => {
                replied = Some(held.pop_front().expect("one permit per request in flight"));
                Event::Replied { task_id, reply }
            }
            // A permit came back: loop to issue more requests.
            _ = permits.clone().acquire_owned(), if in_flight.is_empty() && permits.available_permits() == 0 => continue,
        };
        decisions.extend(rounds.handle(event));
    }
}

/// The consumer's side of the workers: a channel to each, and its requests.
struct Workers {
    client: DispatcherClient,
    consumer_index: u32,
    client_id: ClientId,
    admission: Admission,
    channels: HashMap<String, Channel>,
}

impl Workers {
    fn request(&mut self, request: Request) -> Pending {
        let channel = self.channel(&request.address);
        let task_id = request.task_id;
        let address = request.address;
        let request = GetElementRequest {
            task_id,
            consumer_index: self.consumer_index,
            round_index: request.round,
            allow_skip: true,
            skipped_previous_round: request.skipped_previous_round,
            client_id: self.client_id.0,
            admission: self.admission.to_bytes(),
        };
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
        let security = self.client.security();
        let endpoint = security
            .endpoint(address)
            .map_err(|e| ClientError::InvalidArgument(format!("worker address {address}: {e}")))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true);
        let channel = security.connect_lazy(&endpoint, ServerRole::Worker);
        self.channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }
}

/// Sends `next` after its wait, waiting `poll` for news.
async fn send_heartbeat(
    client: DispatcherClient,
    client_id: ClientId,
    next: Heartbeat,
    poll: Duration,
) -> Result<ClientHeartbeatReply, ClientError> {
    let heartbeat = ClientHeartbeat {
        client_id,
        known_tasks: next.known_tasks,
        current_round: Some(next.current_round),
        blocked_round: next.blocked_round,
    };
    tokio::time::sleep(next.after).await;
    Ok(client.client_heartbeat(&heartbeat, poll).await?)
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
        let mut call = tonic::Request::new(request.clone());
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
