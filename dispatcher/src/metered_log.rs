//! `MeteredLog`: the proposer's log with group commit and split leases measured, for a replica
//! started with a metrics listener (without one the proposer writes to Raft directly).
//!
//! It wraps any `LogWriter`: the number of requests per entry is observed as the entry is
//! submitted, the commit latency (submit to committed and applied) and each committed split
//! lease as its outcomes arrive. It never changes an entry or an outcome.

use crate::dispatcher_metrics::DispatcherMetrics;
use crate::proposer::LogWriter;
use crate::raft_error::RaftFailure;
use crate::state::{Outcome, Outcomes, Proposal, Update};
use sluice_types::{IterationId, TaskId};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

pub struct MeteredLog<W> {
    inner: W,
    metrics: Arc<DispatcherMetrics>,
}

impl<W> MeteredLog<W> {
    pub fn new(inner: W, metrics: Arc<DispatcherMetrics>) -> Self {
        MeteredLog { inner, metrics }
    }
}

/// The entry's committed outcomes, once measured.
pub type MeteredCommit = Pin<Box<dyn Future<Output = Result<Outcomes, RaftFailure>> + Send>>;

impl<W: LogWriter + Sync> LogWriter for MeteredLog<W> {
    type Committed = MeteredCommit;

    async fn submit(&self, proposal: Proposal) -> Result<MeteredCommit, RaftFailure> {
        // Where the entry's lease requests are, to find their outcomes.
        let leases: Vec<(usize, IterationId, TaskId)> = proposal
            .requests
            .iter()
            .enumerate()
            .filter_map(|(i, request)| match request.update {
                Update::LeaseSplits(lease) => Some((i, lease.iteration_id, lease.task_id)),
                _ => None,
            })
            .collect();
        self.metrics.observe_entry(proposal.requests.len());
        let start = Instant::now();
        let committed = self.inner.submit(proposal).await?;
        let metrics = self.metrics.clone();
        Ok(Box::pin(async move {
            let outcomes = committed.await;
            if let Ok(Outcomes(outcomes)) = &outcomes {
                metrics.observe_commit(start.elapsed());
                for (i, iteration, task) in leases {
                    if let Some(Outcome::Splits(lease)) = outcomes.get(i) {
                        metrics.observe_lease(iteration, task, lease);
                    }
                }
            }
            outcomes
        }))
    }
}
