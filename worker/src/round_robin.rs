//! `RoundRobin`: serving a task to coordinated consumers in lockstep rounds (tf.data's
//! `RoundRobinTaskRunner`).
//!
//! Consumer `c` asks for element `c` of round `r`. A round is served only when all
//! `num_consumers` requests for it have arrived: then exactly `num_consumers` elements are taken
//! from the task's buffer, one per consumer, so every consumer's step `r` reads from the same
//! worker. If the task cannot fill the round in time (and the requests allow skipping) the whole
//! round is skipped for everyone and no element is consumed. Rounds only move forward: a request
//! for a round before the current one is an error (the consumer restarted under the same job).
//!
//! A fresh runner (the worker restarted) may see consumers that are one round apart, because
//! some got their element of a round from the previous instance and some did not. When the
//! requests of the first round seen plus those of the next one account for every consumer, the
//! laggards are served a partial round, or skip it if the others report they skipped it.
//!
//! A consumer that asks again for the round it was last served (the reply was lost with its
//! connection) gets the same reply: asking for a later round is what acknowledges a round, so
//! each consumer's last reply is kept until then, and a broken connection loses no element.
//!
//! The task's input must be infinite: its end is an error for every later request.

use crate::task_buffer::{contiguous, Taken, TaskBuffer};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a round waits for enough elements when its requests allow skipping.
const SKIP_WAIT: Duration = Duration::from_millis(100);

/// One consumer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoundReply {
    Element(Bytes),
    /// The round was skipped: read the next task.
    Skip,
}

/// Why a request got no element.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoundError {
    /// The task was stopped (deleted, or the worker is shutting down): the consumer retries
    /// elsewhere or later, as after a crash.
    #[error("the round-robin task was stopped")]
    Stopped,
    /// A broken rule or the task's input failed or ended; tf.data's FailedPrecondition texts.
    #[error("{0}")]
    Failed(String),
}

pub type RoundResult = Result<RoundReply, RoundError>;

pub struct RoundRobin {
    num_consumers: u32,
    input: Arc<TaskBuffer>,
    /// A std mutex, never held across an `.await`: filling a round waits outside it.
    state: Mutex<Rounds>,
    /// Serializes round filling (one round at a time, in order).
    filling: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Rounds {
    /// The last round served; `None` until the first.
    current: Option<u64>,
    /// Waiting requests by round, then consumer.
    requests: BTreeMap<u64, BTreeMap<u32, Waiting>>,
    /// Elements taken from the task's buffer but not yet served (a skipped round keeps them).
    buffer: VecDeque<Bytes>,
    /// The task's input ended or failed: every later request gets this.
    error: Option<String>,
    stopped: bool,
    /// Each consumer's last reply and its round, kept until the consumer asks for a later one.
    served: BTreeMap<u32, (u64, RoundReply)>,
}

struct Waiting {
    reply: oneshot::Sender<RoundResult>,
    allow_skip: bool,
    skipped_previous_round: bool,
}

impl RoundRobin {
    pub fn new(num_consumers: u32, input: Arc<TaskBuffer>) -> Arc<RoundRobin> {
        Arc::new(RoundRobin {
            num_consumers,
            input,
            state: Mutex::new(Rounds::default()),
            filling: tokio::sync::Mutex::new(()),
        })
    }

    fn rounds(&self) -> std::sync::MutexGuard<'_, Rounds> {
        self.state.lock().expect("round state lock poisoned")
    }

    /// Element `consumer` of round `round`, once the round is served.
    pub async fn get(
        self: &Arc<Self>,
        consumer: u32,
        round: u64,
        allow_skip: bool,
        skipped_previous_round: bool,
    ) -> RoundResult {
        if consumer >= self.num_consumers {
            return Err(RoundError::Failed(format!(
                "Requesting data for consumer index {consumer}, but the task is configured for \
                 only {} consumers",
                self.num_consumers
            )));
        }
        let (reply, answer) = oneshot::channel();
        {
            let mut rounds = self.rounds();
            if rounds.stopped {
                return Err(RoundError::Stopped);
            }
            if let Some((_, reply)) = rounds.served.get(&consumer).filter(|(r, _)| *r == round) {
                return Ok(reply.clone());
            }
            if let Some(error) = &rounds.error {
                return Err(RoundError::Failed(error.clone()));
            }
            if let Some(current) = rounds.current.filter(|c| round <= *c) {
                return Err(RoundError::Failed(format!(
                    "Consumer {consumer} requested data for round {round}, but the current round \
                     has already reached {current}. This may indicate that the consumer was \
                     restarted with the same iteration name.`"
                )));
            }
            // A retried request replaces the earlier one of the same consumer.
            rounds.requests.entry(round).or_default().insert(
                consumer,
                Waiting {
                    reply,
                    allow_skip,
                    skipped_previous_round,
                },
            );
        }
        let runner = self.clone();
        tokio::spawn(async move { runner.serve_ready_rounds().await });
        answer.await.unwrap_or(Err(RoundError::Stopped))
    }

    /// Fails every waiting and later request with [`RoundError::Stopped`].
    pub fn stop(&self) {
        let mut rounds = self.rounds();
        rounds.stopped = true;
        rounds.requests.clear();
    }

    /// Serves every round whose requests are complete, in order.
    async fn serve_ready_rounds(self: Arc<Self>) {
        let _filling = self.filling.lock().await;
        while let Some((round, waiting, full)) = self.next_ready_round() {
            let allow_skip = waiting.values().all(|w| w.allow_skip);
            let skip_partial = !full && self.next_round_skipped(round);
            let needed = waiting.len();
            let filled = if skip_partial {
                false
            } else {
                self.fill(needed, allow_skip).await
            };
            let mut rounds = self.rounds();
            rounds.current = Some(round);
            if rounds.stopped {
                for (_, w) in waiting {
                    let _ = w.reply.send(Err(RoundError::Stopped));
                }
                continue;
            }
            if let Some(error) = rounds.error.clone() {
                for (_, w) in waiting {
                    let _ = w.reply.send(Err(RoundError::Failed(error.clone())));
                }
                continue;
            }
            if !filled {
                for (consumer, w) in waiting {
                    rounds.served.insert(consumer, (round, RoundReply::Skip));
                    let _ = w.reply.send(Ok(RoundReply::Skip));
                }
                continue;
            }
            let elements: Vec<Bytes> = rounds.buffer.drain(..needed).collect();
            for ((consumer, w), element) in waiting.into_iter().zip(elements) {
                let reply = RoundReply::Element(element);
                rounds.served.insert(consumer, (round, reply.clone()));
                let _ = w.reply.send(Ok(reply));
            }
        }
    }

    /// The first waiting round that can be served: all its consumers asked, or (first round of
    /// a fresh runner) its requests and the next round's together cover every consumer.
    fn next_ready_round(&self) -> Option<(u64, BTreeMap<u32, Waiting>, bool)> {
        let mut rounds = self.rounds();
        let (&first, waiting) = rounds.requests.iter().next()?;
        let n = self.num_consumers as usize;
        let full = waiting.len() >= n;
        let partial = rounds.current.is_none()
            && rounds
                .requests
                .get(&(first + 1))
                .is_some_and(|next| next.len() + waiting.len() == n);
        if !full && !partial {
            return None;
        }
        let waiting = rounds.requests.remove(&first).expect("just seen");
        Some((first, waiting, full))
    }

    fn next_round_skipped(&self, round: u64) -> bool {
        self.rounds()
            .requests
            .get(&(round + 1))
            .is_some_and(|next| next.values().any(|w| w.skipped_previous_round))
    }

    /// Buffers `needed` elements; false if they did not come within `SKIP_WAIT` (when skipping
    /// is allowed) or the input ended (the error is recorded).
    async fn fill(&self, needed: usize, allow_skip: bool) -> bool {
        let deadline = tokio::time::Instant::now() + SKIP_WAIT;
        loop {
            if self.rounds().buffer.len() >= needed {
                return true;
            }
            let missing = needed - self.rounds().buffer.len();
            let next = if allow_skip {
                match tokio::time::timeout_at(deadline, self.input.take(missing)).await {
                    Ok(next) => next,
                    Err(_) => return false,
                }
            } else {
                self.input.take(missing).await
            };
            let mut rounds = self.rounds();
            match next {
                // A round serves one buffer per element (a large tensor's two parts are joined).
                Taken::Elements(elements, _) => {
                    rounds.buffer.extend(elements.encoded().map(contiguous))
                }
                Taken::Error(error) => {
                    rounds.error = Some(error.message);
                    return false;
                }
                Taken::Stopped => {
                    rounds.stopped = true;
                    return false;
                }
                Taken::End => {
                    rounds.error = Some(
                        "Encountered end of sequence on a round-robin read iterator. Please \
                         ensure that the dataset used for round-robin reading has infinite \
                         cardinality, e.g. by adding a .repeat() transformation at the end."
                            .into(),
                    );
                    return false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task_buffer::Producer;

    /// An infinite input that has nothing more yet than `values`, while its producer lives.
    fn input(values: std::ops::Range<u8>) -> (Producer, Arc<TaskBuffer>) {
        let (mut tx, buffer) = TaskBuffer::channel(1024, usize::MAX);
        for v in values {
            assert!(tx.push(&[v], Bytes::new()));
        }
        (tx, buffer)
    }

    fn element(v: u8) -> RoundResult {
        Ok(RoundReply::Element(Bytes::from(vec![v])))
    }

    #[tokio::test]
    async fn a_round_is_served_when_every_consumer_asked() {
        let (_tx, rx) = input(0..10);
        let rr = RoundRobin::new(2, rx);
        let (a, b) = tokio::join!(rr.get(1, 0, true, false), rr.get(0, 0, true, false));
        assert_eq!((a, b), (element(1), element(0)));
        let (a, b) = tokio::join!(rr.get(0, 1, true, false), rr.get(1, 1, true, false));
        assert_eq!((a, b), (element(2), element(3)));
    }

    #[tokio::test]
    async fn rounds_only_move_forward() {
        let (_tx, rx) = input(0..10);
        let rr = RoundRobin::new(1, rx);
        assert_eq!(rr.get(0, 3, true, false).await, element(0));
        assert_eq!(
            rr.get(0, 2, true, false).await,
            Err(RoundError::Failed(
                "Consumer 0 requested data for round 2, but the current round has already \
                 reached 3. This may indicate that the consumer was restarted with the same \
                 iteration name.`"
                    .into()
            ))
        );
        assert_eq!(
            rr.get(2, 4, true, false).await,
            Err(RoundError::Failed(
                "Requesting data for consumer index 2, but the task is configured for only 1 \
                 consumers"
                    .into()
            ))
        );
    }

    /// A reply lost with the consumer's connection is asked for again: the same element, and
    /// nothing more is taken; asking for the next round acknowledges it.
    #[tokio::test]
    async fn a_consumer_asking_again_for_its_last_round_gets_the_same_reply() {
        let (_tx, rx) = input(0..10);
        let rr = RoundRobin::new(2, rx);
        let (a, b) = tokio::join!(rr.get(0, 0, false, false), rr.get(1, 0, false, false));
        assert_eq!((a, b), (element(0), element(1)));
        assert_eq!(rr.get(1, 0, false, false).await, element(1));
        let (a, b) = tokio::join!(rr.get(0, 1, false, false), rr.get(1, 1, false, false));
        assert_eq!((a, b), (element(2), element(3)));
        assert!(
            rr.get(1, 0, false, false).await.is_err(),
            "round 0 was acknowledged"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_without_enough_elements_is_skipped_without_consuming() {
        let (_tx, rx) = input(0..1);
        let rr = RoundRobin::new(2, rx);
        let (a, b) = tokio::join!(rr.get(0, 0, true, false), rr.get(1, 0, true, false));
        assert_eq!((a, b), (Ok(RoundReply::Skip), Ok(RoundReply::Skip)));
    }

    #[tokio::test]
    async fn the_end_of_the_input_is_an_error() {
        let (mut tx, rx) = TaskBuffer::channel(1024, usize::MAX);
        assert!(tx.push(b"x", Bytes::new()));
        tx.finish(Ok(()));
        let rr = RoundRobin::new(1, rx);
        assert_eq!(rr.get(0, 0, false, false).await, element(b'x'));
        let error = rr.get(0, 1, false, false).await.unwrap_err().to_string();
        assert!(error.starts_with("Encountered end of sequence on a round-robin read iterator."));
    }

    #[tokio::test]
    async fn stopping_fails_waiting_requests_as_retryable() {
        let (_tx, rx) = input(0..10);
        let rr = RoundRobin::new(2, rx);
        let waiting = {
            let rr = rr.clone();
            tokio::spawn(async move { rr.get(0, 0, true, false).await })
        };
        while rr.rounds().requests.is_empty() {
            tokio::task::yield_now().await;
        }
        rr.stop();
        assert_eq!(waiting.await.unwrap(), Err(RoundError::Stopped));
        assert_eq!(rr.get(1, 0, true, false).await, Err(RoundError::Stopped));
    }

    #[tokio::test]
    async fn a_fresh_runner_serves_a_partial_round_to_laggards() {
        // Consumer 0 got round 4 from the previous instance; consumer 1 did not.
        let (_tx, rx) = input(0..10);
        let rr = RoundRobin::new(2, rx);
        let ahead = {
            let rr = rr.clone();
            tokio::spawn(async move { rr.get(0, 5, true, false).await })
        };
        assert_eq!(rr.get(1, 4, true, false).await, element(0));
        // Round 5 is a full round, served once consumer 1 asks for it too.
        assert_eq!(rr.get(1, 5, true, false).await, element(2));
        assert_eq!(ahead.await.unwrap(), element(1));
    }
}
