//! `TaskRemover`: the leader's barrier for removing a task from a coordinated iteration.
//!
//! A consumer that cannot reach a task's worker asks for the task's removal with the round it is
//! stuck in. The task is removed only when every consumer of the iteration asked for the same
//! round within `WAIT`: then no consumer reads the task in that round or later, so the consumers
//! stay in lockstep. Each caller waits (up to `WAIT`) for the others. The barrier is leader-local
//! soft state, as in tf.data: after a leader change the consumers simply ask again.

use crate::error::DispatcherError;
use crate::proposer::ProposerHandle;
use crate::state::Rejection;
use crate::state_reader::StateReader;
use sluice_types::TaskId;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// How long a request waits for the other consumers.
pub const WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct TaskRemover {
    /// Per task, the round being voted on, who asked, and a signal set once all asked. A std
    /// mutex: it is never held across an `.await`.
    votes: Mutex<HashMap<TaskId, Vote>>,
}

struct Vote {
    round: u64,
    consumers: BTreeSet<u32>,
    agreed: watch::Sender<bool>,
}

/// What one consumer's request came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every consumer asked for this round: the caller proposes the removal.
    Remove,
    /// Another consumer completed the vote (and proposes it).
    Agreed,
    /// Not every consumer asked in time, or they asked for different rounds.
    Keep,
}

impl TaskRemover {
    /// One consumer's `MaybeRemoveTask`: looks up the task's coordinated job, votes, and
    /// proposes the removal when this request completed the vote. True when the task is (being)
    /// removed.
    pub async fn maybe_remove(
        &self,
        reader: &StateReader,
        proposer: &ProposerHandle,
        task_id: TaskId,
        consumer: u32,
        round: u64,
    ) -> Result<bool, DispatcherError> {
        reader.linearizable().await?;
        let num_consumers = reader.read(|s| {
            let task = s.task(task_id)?;
            let iteration = s.iteration(task.iteration_id)?;
            Some(s.job(iteration.job_id)?.options.num_consumers)
        });
        let num_consumers = match num_consumers {
            None => return Err(Rejection::NotFound(format!("Task {task_id} not found")).into()),
            Some(None) => {
                return Err(Rejection::FailedPrecondition(
                    "MaybeRemoveTask called on a non-round-robin task.".into(),
                )
                .into())
            }
            Some(Some(n)) => n,
        };
        match self.request(task_id, consumer, round, num_consumers).await {
            Decision::Remove => {
                reader.check_quorum()?;
                proposer.remove_task(task_id).await?;
                Ok(true)
            }
            Decision::Agreed => Ok(true),
            Decision::Keep => Ok(false),
        }
    }

    pub async fn request(
        &self,
        task: TaskId,
        consumer: u32,
        round: u64,
        num_consumers: u32,
    ) -> Decision {
        let mut agreed = {
            let mut votes = self.votes.lock().expect("votes lock poisoned");
            let vote = votes.entry(task).or_insert_with(|| Vote {
                round,
                consumers: BTreeSet::new(),
                agreed: watch::channel(false).0,
            });
            if vote.consumers.is_empty() {
                vote.round = vote.round.max(round);
            }
            if vote.round != round {
                return Decision::Keep;
            }
            vote.consumers.insert(consumer);
            if vote.consumers.len() >= num_consumers as usize {
                let _ = vote.agreed.send(true);
                votes.remove(&task);
                return Decision::Remove;
            }
            vote.agreed.subscribe()
        };
        let waited = tokio::time::timeout(WAIT, agreed.wait_for(|done| *done)).await;
        if matches!(waited, Ok(Ok(_))) {
            return Decision::Agreed;
        }
        let mut votes = self.votes.lock().expect("votes lock poisoned");
        if let Some(vote) = votes.get_mut(&task) {
            vote.consumers.remove(&consumer);
            if vote.consumers.is_empty() {
                votes.remove(&task);
            }
        }
        Decision::Keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn removal_needs_every_consumer_in_the_same_round() {
        let remover = std::sync::Arc::new(TaskRemover::default());
        let first = {
            let remover = remover.clone();
            tokio::spawn(async move { remover.request(TaskId(1), 0, 5, 2).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(remover.request(TaskId(1), 1, 4, 2).await, Decision::Keep);
        assert_eq!(remover.request(TaskId(1), 1, 5, 2).await, Decision::Remove);
        assert_eq!(first.await.unwrap(), Decision::Agreed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_request_times_out() {
        let remover = TaskRemover::default();
        assert_eq!(remover.request(TaskId(1), 0, 5, 2).await, Decision::Keep);
        // The vote was withdrawn: a later pair in another round can agree.
        let remover = std::sync::Arc::new(remover);
        let other = {
            let remover = remover.clone();
            tokio::spawn(async move { remover.request(TaskId(1), 0, 7, 2).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(remover.request(TaskId(1), 1, 7, 2).await, Decision::Remove);
        assert_eq!(other.await.unwrap(), Decision::Agreed);
    }
}
