//! The JSON document `sluice status` prints: this replica's view of the cluster and the state.
//! A member's `addr` (client API) is `null` until the replica has recorded it; its `peer_addr`
//! (Raft) is always known.
//!
//! The lists (datasets, workers, jobs, iterations) come in pages, so one reply stays small
//! however large the state: each list holds at most `page_size` entries after the ones the page
//! token names, and `next_page_token` (`null` on the last page) names where the next page
//! starts. The token is opaque to callers.

use crate::error::DispatcherError;
use crate::raft_types::NodeInfo;
use crate::state::DispatcherState;
use openraft::RaftMetrics;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sluice_types::{DatasetId, IterationId, JobId, NodeId};

/// Entries per list when the caller does not say.
pub const DEFAULT_PAGE_SIZE: usize = 1000;
/// The most entries per list a caller may ask for.
pub const MAX_PAGE_SIZE: usize = 10_000;

/// Where a page starts: the last entry of each list on the page before.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PageToken {
    datasets: Option<DatasetId>,
    workers: Option<String>,
    jobs: Option<JobId>,
    iterations: Option<IterationId>,
}

/// One page request, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusPage {
    pub size: usize,
    pub after: PageToken,
}

impl StatusPage {
    /// From the request's fields: size 0 is the default; a token is one this module made.
    pub fn parse(size: u32, token: &str) -> Result<StatusPage, DispatcherError> {
        let size = match size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n if n > MAX_PAGE_SIZE => {
                return Err(DispatcherError::InvalidArgument(format!(
                    "page_size {n} is over the largest page, {MAX_PAGE_SIZE}"
                )))
            }
            n => n,
        };
        let after = if token.is_empty() {
            PageToken::default()
        } else {
            serde_json::from_str(token).map_err(|e| {
                DispatcherError::InvalidArgument(format!(
                    "page_token is not one a status reply gave: {e}"
                ))
            })?
        };
        Ok(StatusPage { size, after })
    }
}

/// Takes up to `size` entries, and whether more were left.
fn page<T>(entries: impl Iterator<Item = T>, size: usize) -> (Vec<T>, bool) {
    let mut entries = entries.peekable();
    let taken: Vec<T> = entries.by_ref().take(size).collect();
    let more = entries.peek().is_some();
    (taken, more)
}

/// The client address of the leader this replica knows (none during an election), and its term.
pub fn leader_of(metrics: &RaftMetrics<NodeId, NodeInfo>) -> (Option<String>, u64) {
    let leader = metrics
        .current_leader
        .and_then(|l| metrics.membership_config.membership().get_node(&l))
        .and_then(|n| n.client_addr().map(str::to_string));
    (leader, metrics.current_term)
}

pub fn status_json(
    metrics: &RaftMetrics<NodeId, NodeInfo>,
    state: &DispatcherState,
    page_request: &StatusPage,
) -> Value {
    let size = page_request.size;
    let after = &page_request.after;
    let (datasets, datasets_more) = page(state.datasets_after(after.datasets.as_ref()), size);
    let (worker_page, workers_more) = page(state.workers_after(after.workers.as_deref()), size);
    let (job_page, jobs_more) = page(state.jobs_after(after.jobs), size);
    let (iteration_page, iterations_more) = page(state.iterations_after(after.iterations), size);
    // Each list goes on after its last entry on this page; one that is empty here stays where
    // it was (at its end).
    let next_page_token =
        (datasets_more || workers_more || jobs_more || iterations_more).then(|| {
            let token = PageToken {
                datasets: datasets
                    .last()
                    .map(|d| d.id.clone())
                    .or_else(|| after.datasets.clone()),
                workers: worker_page
                    .last()
                    .map(|w| w.address.clone())
                    .or_else(|| after.workers.clone()),
                jobs: job_page.last().map(|j| j.id).or(after.jobs),
                iterations: iteration_page.last().map(|it| it.id).or(after.iterations),
            };
            serde_json::to_string(&token).unwrap_or_default()
        });
    let membership = metrics.membership_config.membership();
    let members: Vec<Value> = membership
        .nodes()
        .map(|(id, node)| {
            json!({
                "id": id,
                "addr": node.client_addr(),
                "peer_addr": node.peer_addr,
                "voter": membership.voter_ids().any(|v| v == *id),
            })
        })
        .collect();
    let (leader_addr, _) = leader_of(metrics);
    let workers: Vec<Value> = worker_page
        .into_iter()
        .map(|w| {
            let active: Vec<u64> = state
                .active_tasks_of_worker(&w.address)
                .iter()
                .map(|t| t.0)
                .collect();
            json!({"address": w.address, "tags": w.tags, "active_tasks": active, "worker_index": state.worker_index(&w.address)})
        })
        .collect();
    let jobs: Vec<Value> = job_page
        .into_iter()
        .map(|j| {
            json!({
                "job_id": j.id.0, "name": j.name, "dataset_id": j.dataset_id.0,
                "sharding_policy": j.sharding.to_string(),
                "num_consumers": j.options.num_consumers,
                "cross_trainer_cache": j.options.use_cross_trainer_cache,
                "target_workers": j.options.target_workers.to_string(),
            })
        })
        .collect();
    let iterations: Vec<Value> = iteration_page
        .into_iter()
        .map(|it| {
            let cursors: Vec<Value> = it
                .cursors
                .iter()
                .map(|c| json!({"repetition": c.repetition, "next": c.next, "num_splits": c.num_splits}))
                .collect();
            json!({
                "iteration_id": it.id.0, "job_id": it.job_id.0, "repetition": it.repetition,
                "tasks": it.tasks.iter().map(|t| t.0).collect::<Vec<_>>(),
                "num_clients": it.num_clients, "finished": it.finished, "split_cursors": cursors,
                "failure": state.iteration_failure(it.id),
                "pending_tasks": it.pending_tasks.iter()
                    .map(|p| json!({"task_id": p.task_id.0, "target_round": p.target_round}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "node": metrics.id,
        "state": format!("{:?}", metrics.state),
        "leader": metrics.current_leader,
        "leader_addr": leader_addr,
        "term": metrics.current_term,
        "last_log_index": metrics.last_log_index,
        "applied_index": metrics.last_applied.map(|l| l.index),
        "snapshot_index": metrics.snapshot.map(|l| l.index),
        "members": members,
        "state_sizes": state.sizes(),
        "datasets": datasets.iter().map(|d| d.id.0.clone()).collect::<Vec<_>>(),
        "workers": workers,
        "static_worker_addresses": state.static_workers(),
        "jobs": jobs,
        "iterations": iterations,
        "next_page_token": next_page_token,
    })
}
