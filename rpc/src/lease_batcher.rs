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
//! A request that finds nothing waiting is sent from its caller's own task; a call that carries
//! other callers' requests runs in a task of its own, so that no caller's giving up drops the
//! others' requests.
//!
//! Each request keeps its own request id, taken when it was made and in flight until it is
//! answered, so a batch retried after a lost reply is answered from the leases recorded for it.
//! An error of the whole call (the retry deadline passed) is every request's error; a refusal is
//! its own request's alone. A request whose caller stopped waiting before it was sent is not
//! sent. A dispatcher older than the batch call answers it `Unimplemented`: the client then sends
//! every lease in a call of its own, as it did before.
//!
//! A lease asked for ahead of need (a split leaser's next lease, asked for while the current one
//! runs) may carry *slack*: how long it may wait for company. It is not sent on its own before
//! its slack has passed, but it goes with any call sent meanwhile. A worker whose tasks each keep
//! a lease ahead thus sends about one call per slack, whatever its number of tasks, instead of
//! one per lease.

use crate::dispatcher_client::DispatcherClient;
use crate::error::RpcError;
use crate::request_ids::InFlight;
use futures::future::join_all;
use sluice_proto::dispatcher as pb;
use sluice_proto::MAX_LEASES_PER_CALL;
use std::collections::VecDeque;
use std::future::Future;
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

/// The lease requests of one client (a `DispatcherClient` and its clones, which own it), and
/// the calls that send them. Calls go through the owning client.
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
    /// The call that holds the waiting requests back: the latest sent, while it has not
    /// returned and is within its patience.
    holding: Option<u64>,
    /// The number of the next call.
    next_call: u64,
    /// How long calls have lately taken (a moving average).
    typical: Duration,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            waiting: VecDeque::new(),
            holding: None,
            next_call: 0,
            typical: FIRST_TYPICAL,
        }
    }
}

/// One lease request, waiting to be sent or answered.
struct Waiting {
    request: pb::LeaseSplitsRequest,
    /// When it goes, with or without company (when it was asked for, plus its slack).
    due: Instant,
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

/// A call to send: its number, its requests, and how long it may hold the next ones back.
struct Call {
    number: u64,
    batch: Vec<Waiting>,
    patience: Duration,
}

impl Queue {
    /// How long a call may hold the waiting requests back.
    fn patience(&self) -> Duration {
        (self.typical * 2).clamp(MIN_PATIENCE, MAX_PATIENCE)
    }

    /// The next call at `now`, when a waiting request is due (or a call's worth wait) and no
    /// call holds them back. It takes the requests not yet due too: they go early, in company.
    fn step(&mut self, now: Instant) -> Option<Call> {
        // Checked first: a request queued behind a call costs no scan of the queue.
        if self.holding.is_some() {
            return None;
        }
        // One pass: drops the requests whose callers gave up (their request ids are then no
        // longer in flight), and finds whether one of the rest is due.
        let mut due = false;
        self.waiting.retain(|w| {
            let wanted = !w.reply.is_closed();
            due |= wanted && w.due <= now;
            wanted
        });
        if self.waiting.len() < MAX_LEASES_PER_CALL && !due {
            return None;
        }
        let number = self.next_call;
        self.next_call += 1;
        self.holding = Some(number);
        let n = self.waiting.len().min(MAX_LEASES_PER_CALL);
        Some(Call {
            number,
            batch: self.waiting.drain(..n).collect(),
            patience: self.patience(),
        })
    }

    /// Call `number` no longer holds the waiting requests back at `now`: it ran out of
    /// patience, or its task ended.
    fn release(&mut self, number: u64, now: Instant) -> Option<Call> {
        if self.holding == Some(number) {
            self.holding = None;
        }
        self.step(now)
    }

    /// Call `number` returned after `took`, at `now`.
    fn returned(&mut self, number: u64, took: Duration, now: Instant) -> Option<Call> {
        self.typical = (self.typical * 7 + took) / 8;
        self.release(number, now)
    }
}

impl LeaseBatcher {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().expect("lease queue lock poisoned")
    }

    /// How many lease calls were sent (a batch counts once; retries of a call are not counted).
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Sends `request` through `client` (whose batcher this is) with the other lease requests
    /// that wait, and returns its answer. `in_flight` is its request id, held until the answer.
    /// The request may wait up to `slack` for company before it is sent.
    pub(crate) async fn lease(
        &self,
        client: &DispatcherClient,
        request: pb::LeaseSplitsRequest,
        in_flight: InFlight,
        slack: Duration,
    ) -> LeaseReply {
        let (reply, mut answer) = oneshot::channel();
        let now = Instant::now();
        let due = now + slack;
        let call = {
            let mut queue = self.queue();
            queue.waiting.push_back(Waiting {
                request,
                due,
                _in_flight: in_flight,
                reply,
            });
            queue.step(now)
        };
        match call {
            // Nothing else waited: the caller sends its own request, in its own task.
            Some(Call {
                number,
                mut batch,
                patience,
            }) if batch.len() == 1 => {
                let own = batch.pop().expect("one request");
                let reply = self
                    .hold(
                        client,
                        number,
                        patience,
                        self.lease_one(client, &own.request),
                    )
                    .await;
                drop(own);
                return reply;
            }
            call => start(client, call),
        }
        // Sent in a call with others, or, once due, in the next call that goes. (A request
        // due at once was due at the step above.)
        let due_passed = tokio::time::sleep_until(due);
        tokio::pin!(due_passed);
        let mut stepped_when_due = slack.is_zero();
        let answered = loop {
            tokio::select! {
                answered = &mut answer => break answered,
                () = &mut due_passed, if !stepped_when_due => {
                    stepped_when_due = true;
                    let call = self.queue().step(Instant::now());
                    start(client, call);
                }
            }
        };
        answered.unwrap_or_else(|_| {
            Err(RpcError::Unavailable {
                attempts: 0,
                message: "the lease was not sent: the client is shutting down".into(),
            })
        })
    }

    /// Runs call `number` (`sending`). Once it has run out of patience, and when it returns,
    /// the requests waiting meanwhile go in the next call.
    async fn hold<R>(
        &self,
        client: &DispatcherClient,
        number: u64,
        patience: Duration,
        sending: impl Future<Output = R>,
    ) -> R {
        // A call dropped before it returned (its caller gave up, its runtime shut down) lets
        // the next requests go.
        let holding = Holding(client, number);
        let sent = Instant::now();
        tokio::pin!(sending);
        let reply = match tokio::time::timeout(patience, &mut sending).await {
            Ok(reply) => reply,
            Err(_) => {
                let next = self.queue().release(number, Instant::now());
                start(client, next);
                sending.await
            }
        };
        std::mem::forget(holding);
        let next = self
            .queue()
            .returned(number, sent.elapsed(), Instant::now());
        start(client, next);
        reply
    }

    /// Sends `batch` in one call (each in its own when it is one request, or the dispatcher
    /// has no batches) and answers each request.
    async fn send(&self, client: &DispatcherClient, batch: Vec<Waiting>) {
        if batch.len() == 1 || self.unbatched.load(Ordering::Relaxed) {
            return self.lease_each(client, batch).await;
        }
        let requests = batch.iter().map(|w| w.request).collect();
        self.calls.fetch_add(1, Ordering::Relaxed);
        match client.lease_splits_batch(requests).await {
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
                self.unbatched.store(true, Ordering::Relaxed);
                self.lease_each(client, batch).await;
            }
            Err(e) => batch.into_iter().for_each(|w| w.answer(Err(e.clone()))),
        }
    }

    /// Sends each request in a call of its own, all at once.
    async fn lease_each(&self, client: &DispatcherClient, batch: Vec<Waiting>) {
        join_all(batch.into_iter().map(|waiting| async move {
            let reply = self.lease_one(client, &waiting.request).await;
            waiting.answer(reply);
        }))
        .await;
    }

    /// One request in a call of its own.
    async fn lease_one(
        &self,
        client: &DispatcherClient,
        request: &pb::LeaseSplitsRequest,
    ) -> LeaseReply {
        self.calls.fetch_add(1, Ordering::Relaxed);
        client.lease_splits_once(request).await
    }
}

/// Sends `call` through `client` from a task of its own: its requests are other callers', and
/// must not depend on one of them waiting. (The task holds a clone of the client, and so its
/// batcher.)
fn start(client: &DispatcherClient, call: Option<Call>) {
    let Some(Call {
        number,
        batch,
        patience,
    }) = call
    else {
        return;
    };
    let client = client.clone();
    tokio::spawn(async move {
        let batcher = client.lease_batcher();
        let sent = batcher.send(&client, batch);
        batcher.hold(&client, number, patience, sent).await;
    });
}

/// Releases its call's hold on the waiting requests if the call is dropped before it returned
/// (its caller gave up, or its runtime shut down).
struct Holding<'a>(&'a DispatcherClient, u64);

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        let next = self
            .0
            .lease_batcher()
            .queue()
            .release(self.1, Instant::now());
        // Outside a runtime the requests are dropped, and their callers told.
        if tokio::runtime::Handle::try_current().is_ok() {
            start(self.0, next);
        }
    }
}

#[cfg(test)]
#[path = "lease_batcher_tests.rs"]
mod tests;
