//! Split leases of distributed_epoch iterations: each split index of a provider and repetition
//! is handed out at most once (the cursor only moves forward).
//!
//! `check_lease` is the whole validation of a lease request. `apply` runs it, and so does the
//! leader's handler before it proposes, so a request that would be refused never costs a log
//! entry.

use super::DispatcherState;
use crate::state::update::{Outcome, Rejection, RequestId};
use sluice_types::{LeaseRequest, ShardingPolicy, SplitLease};

impl DispatcherState {
    /// Whether `lease` would be served: the iteration is distributed_epoch, the task is its
    /// and still runs, the provider exists and the repetition is at most one past the
    /// provider's. A request whose id has a recorded outcome passes: its retry gets that
    /// outcome.
    pub fn check_lease(
        &self,
        id: Option<RequestId>,
        lease: &LeaseRequest,
    ) -> Result<(), Rejection> {
        if id.is_some_and(|id| self.requests.has_outcome(id)) {
            return Ok(());
        }
        let LeaseRequest {
            iteration_id,
            provider,
            repetition,
            task_id,
            ..
        } = *lease;
        let iteration = self
            .iterations
            .get(&iteration_id)
            .ok_or_else(|| Rejection::NotFound(format!("Iteration id {iteration_id} not found")))?;
        let dynamic = self
            .jobs
            .get(&iteration.job_id)
            .is_some_and(|job| job.sharding == ShardingPolicy::Dynamic);
        if !dynamic {
            return Err(Rejection::FailedPrecondition(format!(
                "Cannot get split for iteration {iteration_id}, since it is not a \
                 distributed_epoch iteration."
            )));
        }
        let task = self
            .tasks
            .get(&task_id)
            .filter(|task| task.iteration_id == iteration_id)
            .ok_or_else(|| {
                Rejection::NotFound(format!(
                    "Task {task_id} of iteration {iteration_id} not found"
                ))
            })?;
        // Splits leased to a task that will not run them would be lost.
        if task.finished {
            let why = if task.dropped {
                "was dropped (its worker was removed or its iteration collected)"
            } else {
                "has finished"
            };
            return Err(Rejection::FailedPrecondition(format!(
                "Task {task_id} of iteration {iteration_id} {why}; it gets no more splits"
            )));
        }
        let cursor = iteration.cursors.get(provider as usize).ok_or_else(|| {
            Rejection::InvalidArgument(format!(
                "split provider index {provider} out of range: iteration {iteration_id} has {}",
                iteration.cursors.len()
            ))
        })?;
        cursor.check(repetition)
    }

    /// The answer to a lease that `check_lease` passed, when it asks for a repetition its
    /// provider has left behind: the end of that repetition's splits. A cursor only moves
    /// forward, so no later entry can change that answer, and the leader gives it from its
    /// applied state without a log entry: a worker whose passes got no split (the other workers
    /// took them) catches up with the provider one call per repetition, not one commit each.
    /// `None` when the lease is to be applied, and for a request whose outcome is recorded (its
    /// retry gets that outcome).
    pub fn lease_of_past_repetition(
        &self,
        id: Option<RequestId>,
        lease: &LeaseRequest,
    ) -> Option<SplitLease> {
        if id.is_some_and(|id| self.requests.has_outcome(id)) {
            return None;
        }
        let cursor = self
            .iterations
            .get(&lease.iteration_id)?
            .cursors
            .get(lease.provider as usize)?;
        (lease.repetition < cursor.repetition).then_some(SplitLease {
            repetition: lease.repetition,
            start: 0,
            end: 0,
            end_of_splits: true,
        })
    }

    pub(super) fn lease_splits(&mut self, lease: &LeaseRequest) -> Result<Outcome, Rejection> {
        self.check_lease(None, lease)?;
        let iteration_id = lease.iteration_id;
        let cursor = self
            .iterations
            .get_mut(&iteration_id)
            .and_then(|iteration| iteration.cursors.get_mut(lease.provider as usize))
            .ok_or_else(|| Rejection::NotFound(format!("Iteration id {iteration_id} not found")))?;
        let granted = cursor.lease(lease.repetition, u64::from(lease.max_splits))?;
        self.record_lease(lease.task_id, lease.provider, &granted);
        Ok(Outcome::Splits(granted))
    }
}
