//! The epoch of a coordinated reader, as a pure state machine: where the consumer stands in the
//! rounds over the iteration's tasks, which request goes out next, and when the epoch ends.
//! Events in (a heartbeat reply, a free permit, a worker's reply, an element delivered, a
//! failure, cancellation), decisions out (send this request, deliver this element, send the
//! next heartbeat, end the epoch). No I/O, no clock: `coordinated` performs the decisions and
//! feeds the events.
//!
//! The rules (see `coordinated` for the protocol):
//! - Round `r` is one pass over the iteration's tasks in the dispatcher's order; in it the
//!   consumer asks each task with `starting_round ≤ r` that was not removed for its element of
//!   round `r`. Requests go out strictly in that order, at most one per task and at most
//!   `max_outstanding_requests` at once; nothing goes out once the iteration finished.
//! - A heartbeat reply's `block_round` stops the consumer before that round, unless it is in it
//!   already (the dispatcher then moves the target later); none lifts the limit. While a task
//!   is pending (a `block_round`), the next heartbeat goes out after `PENDING_REFRESH` and
//!   does not wait for news; otherwise after none, waiting the reader's drawn poll.
//! - A reply's task list replaces the one known: tasks no longer listed are dropped (keeping the
//!   position in the round: past the last task is the next round's start), new ones appended.
//! - A worker's reply: an element is delivered; a skip is reported with the task's next
//!   request; a removed task is never asked again.
//! - The epoch ends once the iteration finished and no request is outstanding; a failed request,
//!   heartbeat or element ends it with the error; cancellation ends it without one.

use crate::epoch::Poll;
use crate::error::ClientError;
use sluice_proto::dispatcher as pb;
use sluice_rpc::KnownTasks;
use std::time::Duration;

/// How soon a consumer heartbeats again while a task is pending (it must report its rounds).
pub(crate) const PENDING_REFRESH: Duration = Duration::from_millis(20);

/// What one request came to.
#[derive(Debug)]
pub(crate) enum Reply {
    Element(bytes::Bytes),
    Skip,
    /// The dispatcher removed the task: skip it from now on.
    Removed,
}

/// What happened.
#[derive(Debug)]
pub(crate) enum Event {
    /// A heartbeat reply: the iteration's tasks in the dispatcher's order (`None`: the list
    /// known is current), whether the iteration finished, and the round a pending task joins at.
    Heartbeat {
        tasks: Option<Vec<pb::TaskInfo>>,
        iteration_finished: bool,
        block_round: Option<u64>,
    },
    /// A permit is free: the next request, if the order allows one.
    Permit,
    /// A task's request came back (replies arrive in request order).
    Replied {
        task_id: u64,
        reply: Result<Reply, ClientError>,
    },
    /// The element of the last reply reached the caller's channel.
    Delivered,
    /// A heartbeat failed, or an element did not decode.
    Failed(ClientError),
    /// The caller dropped or closed the stream, or went away.
    Cancelled,
}

/// A request for this consumer's element of `round` from a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub task_id: u64,
    pub address: String,
    pub round: u64,
    /// The task's previous request was answered with a skip.
    pub skipped_previous_round: bool,
}

/// The next heartbeat: what it reports, and when it goes out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Heartbeat {
    pub known_tasks: KnownTasks,
    pub current_round: u64,
    pub blocked_round: Option<u64>,
    /// How long to wait before sending it.
    pub after: Duration,
    pub poll: Poll,
}

/// What to do, in order.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Send this request (with the free permit).
    Request(Request),
    /// Hand the element to the caller (with the reply's permit), then report `Delivered`.
    Deliver(bytes::Bytes),
    Heartbeat(Heartbeat),
    /// The epoch is over, with this error if it failed.
    End(Option<ClientError>),
}

#[derive(Debug)]
struct Task {
    task_id: u64,
    address: String,
    starting_round: u64,
    /// A request to this task is outstanding (strict order: one at a time per task).
    in_use: bool,
    removed: bool,
    skipped_previous_round: bool,
}

/// Where a coordinated consumer stands.
#[derive(Debug)]
pub(crate) struct Rounds {
    max_outstanding: u32,
    /// The iteration's tasks in the dispatcher's order (the same for every consumer).
    tasks: Vec<Task>,
    current_round: u64,
    next_task_index: usize,
    /// The round this consumer must not start yet (a task is pending for it).
    round_limit: Option<u64>,
    iteration_finished: bool,
    /// Requests sent and not answered yet.
    in_flight: usize,
    ended: bool,
}

impl Rounds {
    pub(crate) fn new(max_outstanding: u32) -> Rounds {
        Rounds {
            max_outstanding,
            tasks: Vec::new(),
            current_round: 0,
            next_task_index: 0,
            round_limit: None,
            iteration_finished: false,
            in_flight: 0,
            ended: false,
        }
    }

    /// The first decision: a heartbeat at once.
    pub(crate) fn start(&self) -> Vec<Decision> {
        vec![self.heartbeat(Duration::ZERO, Poll::Now)]
    }

    /// Whether a request may go out (the iteration goes on, the limit is not reached); which
    /// one is `Event::Permit`'s to decide.
    pub(crate) fn may_request(&self) -> bool {
        !self.ended && !self.iteration_finished && self.in_flight < self.max_outstanding as usize
    }

    pub(crate) fn handle(&mut self, event: Event) -> Vec<Decision> {
        if self.ended {
            return Vec::new();
        }
        match event {
            Event::Heartbeat {
                tasks,
                iteration_finished,
                block_round,
            } => {
                self.iteration_finished = iteration_finished;
                let pending = self.apply_heartbeat(tasks, block_round);
                if let Some(end) = self.end_if_done() {
                    return vec![end];
                }
                vec![if pending {
                    self.heartbeat(PENDING_REFRESH, Poll::Now)
                } else {
                    self.heartbeat(Duration::ZERO, Poll::Drawn)
                }]
            }
            Event::Permit => match self.may_request() {
                true => self
                    .next_request()
                    .map(Decision::Request)
                    .into_iter()
                    .collect(),
                false => Vec::new(),
            },
            Event::Replied { task_id, reply } => {
                self.in_flight = self.in_flight.saturating_sub(1);
                let mut task = self.tasks.iter_mut().find(|t| t.task_id == task_id);
                if let Some(task) = task.as_deref_mut() {
                    task.in_use = false;
                }
                match (reply, task) {
                    (Err(e), _) => return vec![self.end(Some(e))],
                    (Ok(Reply::Element(bytes)), _) => return vec![Decision::Deliver(bytes)],
                    (Ok(Reply::Skip), Some(task)) => task.skipped_previous_round = true,
                    (Ok(Reply::Removed), Some(task)) => task.removed = true,
                    (Ok(_), None) => {}
                }
                self.end_if_done().into_iter().collect()
            }
            Event::Delivered => self.end_if_done().into_iter().collect(),
            Event::Failed(e) => vec![self.end(Some(e))],
            Event::Cancelled => vec![self.end(None)],
        }
    }

    fn end_if_done(&mut self) -> Option<Decision> {
        (self.iteration_finished && self.in_flight == 0).then(|| self.end(None))
    }

    fn end(&mut self, error: Option<ClientError>) -> Decision {
        self.ended = true;
        Decision::End(error)
    }

    fn heartbeat(&self, after: Duration, poll: Poll) -> Decision {
        Decision::Heartbeat(Heartbeat {
            // The list mirrors the dispatcher's, in its order.
            known_tasks: KnownTasks {
                count: self.tasks.len() as u32,
                last: self.tasks.last().map(|t| t.task_id),
            },
            current_round: self.current_round,
            blocked_round: self.round_limit,
            after,
            poll,
        })
    }

    /// The next request in strict round order, or `None` if the next task in order is busy,
    /// the round is blocked, or no task can be read.
    fn next_request(&mut self) -> Option<Request> {
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
            let index = self.next_task_index;
            let task = &self.tasks[index];
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
                let task = &mut self.tasks[index];
                task.in_use = true;
                self.in_flight += 1;
                return Some(Request {
                    task_id: task.task_id,
                    address: task.address.clone(),
                    round,
                    skipped_previous_round: std::mem::take(&mut task.skipped_previous_round),
                });
            }
        }
        None
    }

    /// Takes in the dispatcher's task list and blocked round; true while a task is pending.
    fn apply_heartbeat(&mut self, tasks: Option<Vec<pb::TaskInfo>>, block: Option<u64>) -> bool {
        match block {
            // Already in that round: the dispatcher will move the target later.
            Some(block) if self.current_round >= block => {}
            Some(block) => self.round_limit = Some(block),
            None => self.round_limit = None,
        }
        let Some(listed_tasks) = tasks else {
            // The list is unchanged.
            return block.is_some();
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
            self.tasks.push(Task {
                task_id: info.task_id,
                address: info.worker_address,
                starting_round: info.starting_round,
                in_use: false,
                removed: false,
                skipped_previous_round: false,
            });
        }
        block.is_some()
    }
}

#[cfg(test)]
#[path = "rounds_tests.rs"]
mod tests;
