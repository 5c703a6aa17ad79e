//! `LeaseBatcher`: the lease requests of one client's callers, sent together.
//!
//! A worker runs many tasks, and each task's split leaser asks for its next lease while the
//! current one runs. Every lease is a call to the leader, and at scale it is the calls, more than
//! the log entries, that the leader spends its time on: the proposer already puts concurrent
//! leases into one entry, but each call is decoded, authenticated and answered on its own. So a
//! client has at most one lease call on its way: requests made meanwhile wait, and go together in
//! the next call (`LeaseSplitsBatch`, up to `MAX_LEASES_PER_CALL` of them). A request that finds
//! nothing on its way is sent at once, as a plain `LeaseSplits`. Under light load nothing waits;
//! the slower the leader answers, the more leases each call carries, so the calls per lease fall
//! as the load rises.
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
use tokio::sync::oneshot;

type LeaseReply = Result<pb::LeaseSplitsResponse, RpcError>;

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

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// Whether a sender task runs; it sends until nothing waits.
    sending: bool,
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

impl LeaseBatcher {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().expect("lease queue lock poisoned")
    }

    /// Queues a request; true when no sender runs and the caller must start one.
    fn push(&self, waiting: Waiting) -> bool {
        let mut queue = self.queue();
        queue.waiting.push_back(waiting);
        !std::mem::replace(&mut queue.sending, true)
    }

    /// The next requests to send, oldest first; `None` when none waits, and the sender ends.
    fn next_batch(&self) -> Option<Vec<Waiting>> {
        let mut queue = self.queue();
        queue.waiting.retain(|w| !w.reply.is_closed());
        if queue.waiting.is_empty() {
            queue.sending = false;
            return None;
        }
        let n = queue.waiting.len().min(MAX_LEASES_PER_CALL);
        Some(queue.waiting.drain(..n).collect())
    }
}

/// A running sender. One dropped before it is `done` (its runtime shut down) leaves no request
/// waiting for it (their callers get an error) and lets the next request start another.
struct Sending<'a> {
    batcher: &'a LeaseBatcher,
    /// Set when the sender found nothing waiting, which ended it (`next_batch`).
    done: bool,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut queue = self.batcher.queue();
            queue.sending = false;
            queue.waiting.clear();
        }
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
        let waiting = Waiting {
            request,
            _in_flight: in_flight,
            reply,
        };
        if self.lease_batcher().push(waiting) {
            tokio::spawn(self.clone().send_leases());
        }
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

    /// Sends what waits, one call at a time, until nothing waits.
    async fn send_leases(self) {
        let batcher = self.lease_batcher();
        let mut sending = Sending {
            batcher,
            done: false,
        };
        while let Some(batch) = batcher.next_batch() {
            if batch.len() == 1 || batcher.unbatched.load(Ordering::Relaxed) {
                self.lease_each(batch).await;
                continue;
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
        sending.done = true;
    }

    /// Sends each request in a call of its own, all at once.
    async fn lease_each(&self, batch: Vec<Waiting>) {
        let calls = batch.len() as u64;
        self.lease_batcher().calls.fetch_add(calls, Ordering::Relaxed);
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
