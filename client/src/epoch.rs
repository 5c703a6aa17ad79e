//! The epoch of a reader that is not coordinated, as a pure state machine: events in (a
//! heartbeat reply, a task stream's end or failure, a failed heartbeat, cancellation),
//! decisions out (open these tasks, skip those, tell the streams the iteration finished, send
//! the next heartbeat, end the epoch). No I/O, no clock: `driver` performs the decisions and
//! feeds the events.
//!
//! The rules (tf.data's `DataServiceClient`):
//! - A heartbeat reply lists the iteration's tasks (or says the list known is current). Each
//!   task not seen before is opened if this reader reads it (`reads_task`: its
//!   `target_workers`, and whether the task's worker runs in this process), or else skipped
//!   for good. Every task opened by one reply gets an equal share of `max_outstanding_requests`
//!   as its credits (at least one), counting the tasks opened before.
//! - A finished iteration has nothing left in tasks not opened yet (tf.data updates no tasks
//!   once the iteration finished): from the reply that says so on, no task is opened.
//! - The epoch ends when every task opened has reached its end and the iteration finished; or,
//!   once a task was skipped, when every task opened has ended (at least one was opened): nobody
//!   reads a skipped task, so the iteration may never finish (tf.data's
//!   `should_finish_iteration_ = false`).
//! - A failed task stream or heartbeat ends the epoch with its error; cancellation (the caller
//!   dropped or closed the stream) ends it without one.
//! - At the end, the tasks only this reader reads (`deletes_task_when_done`) are to be deleted
//!   from workers in this process.
//!
//! The reader does not tell parallel_epochs from distributed_epoch: the dispatcher lists the
//! tasks either way, and the workers share out the splits.

use crate::error::ClientError;
pub(crate) use crate::options::Poll;
use crate::options::{deletes_task_when_done, reads_task};
use sluice_proto::dispatcher as pb;
use sluice_rpc::KnownTasks;
use sluice_types::TargetWorkers;
use std::collections::{HashMap, HashSet};

/// A task of a heartbeat reply, and whether its worker runs in this process.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Listed {
    pub task: pb::TaskInfo,
    pub local: bool,
}

/// What happened.
#[derive(Debug)]
pub(crate) enum Event {
    /// A heartbeat reply: the iteration's tasks in the dispatcher's order (`None`: the list
    /// known is current), and whether the iteration finished.
    Heartbeat {
        tasks: Option<Vec<Listed>>,
        iteration_finished: bool,
    },
    /// A heartbeat failed.
    HeartbeatFailed(ClientError),
    /// A task's stream reached the task's end (or gave up a gone worker's task), or failed.
    TaskEnded {
        task_id: u64,
        result: Result<(), ClientError>,
    },
    /// The caller dropped or closed the stream.
    Cancelled,
    /// This reader let go of a task for good (the dispatcher moved its stream to another
    /// worker, where it appears as a new task): it is done with it, without its end.
    Released { task_id: u64 },
}

/// What to do, in order.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Read this task, holding at most `max_credits` credits.
    Open {
        task: pb::TaskInfo,
        max_credits: u32,
    },
    /// A task of a worker this reader does not target: never read.
    Skip { task_id: u64, worker: String },
    /// Tell the open streams the iteration finished (a gone worker's task is then given up).
    IterationFinished,
    /// Send the next heartbeat, describing the task list known so.
    Heartbeat { known_tasks: KnownTasks, poll: Poll },
    /// The epoch is over, with this error if it failed: stop every stream, delete these tasks
    /// from workers in this process, and release the iteration client.
    End {
        error: Option<ClientError>,
        delete_local: Vec<pb::TaskInfo>,
    },
}

/// Where one epoch of a reader that is not coordinated stands.
#[derive(Debug)]
pub(crate) struct Epoch {
    target_workers: TargetWorkers,
    /// `max_outstanding_requests`, shared out between the tasks read.
    outstanding: u32,
    /// The list the last reply gave.
    known_tasks: KnownTasks,
    iteration_finished: bool,
    /// Tasks opened -> whether their stream ended.
    streams: HashMap<u64, bool>,
    /// Tasks opened, in order.
    opened: Vec<pb::TaskInfo>,
    /// Tasks of workers this reader does not target.
    skipped: HashSet<u64>,
    /// Tasks released before they were opened (their stream moved on).
    skipped_for_good: HashSet<u64>,
    ended: bool,
}

impl Epoch {
    pub(crate) fn new(target_workers: TargetWorkers, outstanding: u32) -> Epoch {
        Epoch {
            target_workers,
            outstanding,
            known_tasks: KnownTasks::default(),
            iteration_finished: false,
            streams: HashMap::new(),
            opened: Vec::new(),
            skipped: HashSet::new(),
            skipped_for_good: HashSet::new(),
            ended: false,
        }
    }

    /// The first decision: a heartbeat that asks for the tasks at once.
    pub(crate) fn start(&self) -> Vec<Decision> {
        vec![Decision::Heartbeat {
            known_tasks: self.known_tasks,
            poll: Poll::Now,
        }]
    }

    pub(crate) fn handle(&mut self, event: Event) -> Vec<Decision> {
        if self.ended {
            return Vec::new();
        }
        match event {
            Event::Heartbeat {
                tasks,
                iteration_finished,
            } => self.heartbeat(tasks, iteration_finished),
            Event::HeartbeatFailed(e) => vec![self.end(Some(e))],
            Event::TaskEnded { result: Err(e), .. } => vec![self.end(Some(e))],
            Event::TaskEnded {
                task_id,
                result: Ok(()),
            } => {
                self.streams.insert(task_id, true);
                self.end_if_done().into_iter().collect()
            }
            Event::Cancelled => vec![self.end(None)],
            Event::Released { task_id } => {
                if let Some(done) = self.streams.get_mut(&task_id) {
                    *done = true;
                } else {
                    // Never opened: it is not to be opened any more.
                    self.skipped_for_good.insert(task_id);
                }
                self.end_if_done().into_iter().collect()
            }
        }
    }

    fn heartbeat(&mut self, tasks: Option<Vec<Listed>>, iteration_finished: bool) -> Vec<Decision> {
        let mut decisions = Vec::new();
        let tasks = match tasks {
            Some(tasks) => {
                self.known_tasks = KnownTasks {
                    count: tasks.len() as u32,
                    last: tasks.last().map(|t| t.task.task_id),
                };
                tasks
            }
            None => Vec::new(),
        };
        if iteration_finished && !self.iteration_finished {
            self.iteration_finished = true;
            decisions.push(Decision::IterationFinished);
        }
        let mut new_tasks = Vec::new();
        for Listed { task, local } in tasks {
            if self.iteration_finished
                || self.streams.contains_key(&task.task_id)
                || self.skipped.contains(&task.task_id)
                || self.skipped_for_good.contains(&task.task_id)
            {
                continue;
            }
            if task.moved {
                // Its stream moved to another task, which the list has or will have.
                self.skipped_for_good.insert(task.task_id);
                continue;
            }
            if reads_task(self.target_workers, &task, local) {
                new_tasks.push(task);
            } else {
                self.skipped.insert(task.task_id);
                decisions.push(Decision::Skip {
                    task_id: task.task_id,
                    worker: task.worker_address,
                });
            }
        }
        let read_tasks = (self.streams.len() + new_tasks.len()) as u32;
        let max_credits = (self.outstanding / read_tasks.max(1)).max(1);
        for task in new_tasks {
            self.streams.insert(task.task_id, false);
            self.opened.push(task.clone());
            decisions.push(Decision::Open { task, max_credits });
        }
        match self.end_if_done() {
            Some(end) => decisions.push(end),
            None => decisions.push(Decision::Heartbeat {
                known_tasks: self.known_tasks,
                poll: Poll::Drawn,
            }),
        }
        decisions
    }

    /// The end, when every task opened has ended and the iteration finished (or a task was
    /// skipped and one was opened).
    fn end_if_done(&mut self) -> Option<Decision> {
        let own_tasks_ended = self.streams.values().all(|done| *done);
        let done = own_tasks_ended
            && (self.iteration_finished || (!self.skipped.is_empty() && !self.streams.is_empty()));
        done.then(|| self.end(None))
    }

    fn end(&mut self, error: Option<ClientError>) -> Decision {
        self.ended = true;
        let delete_local = self
            .opened
            .iter()
            .filter(|task| deletes_task_when_done(self.target_workers, task))
            .cloned()
            .collect();
        Decision::End {
            error,
            delete_local,
        }
    }
}

#[cfg(test)]
#[path = "epoch_tests.rs"]
mod tests;
