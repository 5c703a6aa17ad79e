//! `LeaseBatcher`: the lease requests of one client's callers, sent together.
//!
//! A worker runs many tasks, and each task's split leaser asks for its next lease while the
//! current one runs. Every lease is a call to the leader, and at scale it is the calls, more than
//! the log entries, that the leader spends its time on: the proposer already puts concurrent
//! leases into one entry, but each call is decoded, authenticated and answered on its own. So
//! requests made while a lease call of this client is on its way wait, and go together in one
//! call (`LeaseSplitsBatch`, up to `MAX_LEASES_PER_CALL` of them) when it returns. A request
//! that finds no call on its way is sent at once, as a plain `LeaseSplits`. Under light load
//! nothing waits; the slower the leader answers, the more leases each call carries, so the calls
//! per lease fall as the load rises.
//!
//! A call holds the others back only while it is no slower than usual: once it has been on its
//! way twice as long as calls have lately taken (`patience`), the requests waiting behind it are
//! sent without it. So a call stuck on a leader that was cut off, or retrying through an
//! election, never holds up the leases of the worker's other tasks for long.
//!
//! Each request keeps its own request id, taken when it was made and in flight until it is
//! answered, so a batch retried after a lost reply is answered from the leases recorded for it.
//! An error of the whole call (the retry deadline passed) is every request's error; a refusal is
//! its own request's alone. A request whose caller stopped waiting before it was sent is not
//! sent. A dispatcher older than the batch call answers it `Unimplemented`: the client then sends
//! every lease in a call of its own, as it did before.

use crate::dispatcher_client::DispatcherClient;
use crate::error::RpcError;
use crate::request_ids::InFlight;
use futures::future::join_all;
use sluice_proto::dispatcher as pb;
use sluice_proto::MAX_LEASES_PER_CALL;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

type LeaseReply = Result<pb::LeaseSplitsResponse, RpcError>;

/// How long a lease call is taken to last before any has returned.
const FIRST_TYPICAL: Duration = Duration::from_millis(10);
/// The bounds of `patience`: never less, so a fast leader's jitter still lets requests gather;
/// never more, so a slow stretch cannot make the client wait on one call for long.
const MIN_PATIENCE: Duration = Duration::from_millis(5);
const MAX_PATIENCE: Duration = Duration::from_secs(1);

/// The lease requests of one client (a `DispatcherClient` and its clones).
#[derive(Default)]
pub(crate) struct LeaseBatcher {
    /// A std mutex: held only to queue or take requests, never across an `.await`.
    queue: Mutex<Queue>,
    /// Set once the dispatcher answered a batch `Unimplemented`.
    unbatched: AtomicBool,
    /// Lease calls sent (a batch is one; its retries are not counted).
    calls: AtomicU64,
}

struct Queue {
    waiting: VecDeque<Waiting>,
    /// The latest call sent and not yet returned: its number and when it was sent.
    latest: Option<(u64, Instant)>,
    /// The number of the next call.
    next_call: u64,
    /// How long calls have lately taken (a moving average).
    typical: Duration,
    /// When the timer armed to send the waiting requests fires, if one is.
    timer: Option<Instant>,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            waiting: VecDeque::new(),
            latest: None,
            next_call: 0,
            typical: FIRST_TYPICAL,
            timer: None,
        }
    }
}

/// One lease request, waiting to be sent or answered.
struct Waiting {
    request: pb::LeaseSplitsRequest,
    /// Keeps the request id in flight until the request is answered.
    _in_flight: InFlight,
    reply: oneshot::Sender<LeaseReply>,
}

impl Waiting {
    fn answer(self, reply: LeaseReply) {
        // The caller may have stopped waiting; the lease is then lost, as at-most-once allows.
        let _ = self.reply.send(reply);
    }
}

/// What the client does next with its waiting requests.
enum Step {
    /// Send these in call number `call`.
    Send { call: u64, batch: Vec<Waiting> },
    /// Look again at this time (unless a returning call comes first).
    WakeAt(Instant),
    /// Nothing: nothing waits, or a call or a timer on its way will look again.
    Idle,
}

impl Queue {
    /// How long the latest call may hold the waiting requests back.
    fn patience(&self) -> Duration {
        (self.typical * 2).clamp(MIN_PATIENCE, MAX_PATIENCE)
    }

    /// Sends what waits when no call younger than `patience` is on its way; otherwise arms a
    /// timer for when the latest call runs out of it.
    fn step(&mut self, now: Instant) -> Step {
        self.waiting.retain(|w| !w.reply.is_closed());
        if self.waiting.is_empty() {
            return Step::Idle;
        }
        let held_until = self.latest.map(|(_, sent)| sent + self.patience());
        match held_until {
            Some(until) if until > now => {
                // A timer in the past belongs to a runtime that is gone: arm another.
                if self.timer.is_some_and(|at| at >= now) {
                    return Step::Idle;
                }
                self.timer = Some(until);
                Step::WakeAt(until)
            }
            _ => {
                let n = self.waiting.len().min(MAX_LEASES_PER_CALL);
                let call = self.next_call;
                self.next_call += 1;
                self.latest = Some((call, now));
                Step::Send {
                    call,
                    batch: self.waiting.drain(..n).collect(),
                }
            }
        }
    }

    /// Call `call`, sent at `sent`, returned at `now`.
    fn returned(&mut self, call: u64, sent: Instant, now: Instant) -> Step {
        let took = now.saturating_duration_since(sent);
        self.typical = (self.typical * 7 + took) / 8;
        if self.latest.is_some_and(|(latest, _)| latest == call) {
            self.latest = None;
        }
        self.step(now)
    }

    /// The timer armed by `step` fired.
    fn woken(&mut self, now: Instant) -> Step {
        self.timer = None;
        self.step(now)
    }
}

impl LeaseBatcher {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().expect("lease queue lock poisoned")
    }
}

impl DispatcherClient {
    /// Sends `request` with the other lease requests of this client that wait, and returns its
    /// answer. `in_flight` is its request id, held until the answer.
    pub(crate) async fn lease_together(
        &self,
        request: pb::LeaseSplitsRequest,
        in_flight: InFlight,
    ) -> LeaseReply {
        let (reply, answer) = oneshot::channel();
        let step = {
            let mut queue = self.lease_batcher().queue();
            queue.waiting.push_back(Waiting {
                request,
                _in_flight: in_flight,
                reply,
            });
            queue.step(Instant::now())
        };
        self.take(step);
        answer.await.unwrap_or_else(|_| {
            Err(RpcError::Unavailable {
                attempts: 0,
                message: "the lease was not sent: the client is shutting down".into(),
            })
        })
    }

    /// How many lease calls this client has sent (a batch counts once; retries of a call are
    /// not counted). With the leases asked for, it tells how many leases a call carried.
    pub fn lease_calls(&self) -> u64 {
        self.lease_batcher().calls.load(Ordering::Relaxed)
    }

    /// Does `step`: a call or a timer runs as a task of its own, and takes the next step when
    /// it ends.
    fn take(&self, step: Step) {
        let client = self.clone();
        match step {
            Step::Idle => {}
            Step::Send { call, batch } => {
                tokio::spawn(async move {
                    let sent = Instant::now();
                    client.send(batch).await;
                    let next = client
                        .lease_batcher()
                        .queue()
                        .returned(call, sent, Instant::now());
                    client.take(next);
                });
            }
            Step::WakeAt(at) => {
                tokio::spawn(async move {
                    tokio::time::sleep_until(at).await;
                    let next = client.lease_batcher().queue().woken(Instant::now());
                    client.take(next);
                });
            }
        }
    }

    /// Sends `batch` in one call (each in its own when it is one request, or the dispatcher
    /// has no batches) and answers each request.
    async fn send(&self, batch: Vec<Waiting>) {
        let batcher = self.lease_batcher();
        if batch.len() == 1 || batcher.unbatched.load(Ordering::Relaxed) {
            return self.lease_each(batch).await;
        }
        let requests = batch.iter().map(|w| w.request).collect();
        batcher.calls.fetch_add(1, Ordering::Relaxed);
        match self.lease_splits_batch(requests).await {
            Ok(replies) => {
                let mut replies = replies.into_iter();
                let sent = batch.len();
                for waiting in batch {
                    let reply = replies.next().unwrap_or_else(|| {
                        Err(RpcError::Status {
                            code: tonic::Code::Internal,
                            message: format!(
                                "the dispatcher answered fewer than the {sent} leases sent"
                            ),
                        })
                    });
                    waiting.answer(reply);
                }
            }
            Err(RpcError::Status {
                code: tonic::Code::Unimplemented,
                ..
            }) => {
                batcher.unbatched.store(true, Ordering::Relaxed);
                self.lease_each(batch).await;
            }
            Err(e) => batch.into_iter().for_each(|w| w.answer(Err(e.clone()))),
        }
    }

    /// Sends each request in a call of its own, all at once.
    async fn lease_each(&self, batch: Vec<Waiting>) {
        let calls = batch.len() as u64;
        self.lease_batcher()
            .calls
            .fetch_add(calls, Ordering::Relaxed);
        join_all(batch.into_iter().map(|waiting| async move {
            let reply = self.lease_splits_once(&waiting.request).await;
            waiting.answer(reply);
        }))
        .await;
    }
}

#[cfg(test)]
#[path = "lease_batcher_tests.rs"]
mod tests;
