//! The JSON document `sluice status` prints: this replica's view of the cluster and the state.
//! A member's `addr` (client API) is `null` until the replica has recorded it; its `peer_addr`
//! (Raft) is always known.

use crate::ids::NodeId;
use crate::raft_types::NodeInfo;
use crate::state::DispatcherState;
use openraft::RaftMetrics;
use serde_json::{json, Value};

pub fn status_json(metrics: &RaftMetrics<NodeId, NodeInfo>, state: &DispatcherState) -> Value {
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
    let leader_addr = metrics
        .current_leader
        .and_then(|l| membership.get_node(&l))
        .and_then(|n| n.client_addr().map(str::to_string));
    let workers: Vec<Value> = state
        .workers()
        .map(|w| {
            let active: Vec<u64> = state
                .active_tasks_of_worker(&w.address)
                .map(|t| t.id.0)
                .collect();
            json!({"address": w.address, "tags": w.tags, "active_tasks": active, "worker_index": state.worker_index(&w.address)})
        })
        .collect();
    let jobs: Vec<Value> = state
        .jobs()
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
    let iterations: Vec<Value> = state
        .iterations()
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
        "datasets": state.datasets().map(|d| d.id.0.clone()).collect::<Vec<_>>(),
        "workers": workers,
        "static_worker_addresses": state.static_workers(),
        "jobs": jobs,
        "iterations": iterations,
    })
}
