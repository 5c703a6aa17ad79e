//! `DispatcherMetrics`: what one replica exports on `/metrics` beside the per-RPC metrics.
//!
//! Three kinds of values, each with one source:
//! - Raft's (term, leadership, log, commit and apply indexes) and the applied state's sizes
//!   (workers, clients, jobs, iterations, datasets, tasks) are gauges set at scrape time
//!   (`set_raft`, `set_state`), so nothing on the request path touches them.
//! - Group commit (commit latency, requests per entry) and split leases are observed as entries
//!   commit, by `MeteredLog` around the proposer's log. Only the leader proposes, so only the
//!   leader counts leases; after a leader change the new leader's counters go on (sum the
//!   replicas' `rate()` in queries).
//! - Lease counters carry an `iteration` label; a series is dropped once its iteration has left
//!   the applied state (`set_state`), so the label's values stay as many as live iterations.
//!
//! The per-task split counts behind the status page's splits per worker are kept here too
//! (not exported: a worker's own `/metrics` has its elements), and dropped with their task.

use crate::raft_types::NodeInfo;
use crate::state::DispatcherState;
use openraft::{RaftMetrics, ServerState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use sluice_types::{IterationId, NodeId, SplitLease, TaskId};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IterationLabels {
    pub iteration: u64,
}

#[derive(Debug)]
pub struct DispatcherMetrics {
    term: Gauge,
    is_leader: Gauge,
    leader_id: Gauge,
    last_log_index: Gauge,
    commit_index: Gauge,
    applied_index: Gauge,
    voters: Gauge,
    workers: Gauge,
    clients: Gauge,
    jobs: Gauge,
    iterations: Gauge,
    datasets: Gauge,
    tasks: Gauge,
    commit_latency: Histogram,
    requests_per_entry: Histogram,
    split_leases: Family<IterationLabels, Counter>,
    splits_leased: Family<IterationLabels, Counter>,
    /// Leases counted per iteration and task. A std mutex: held for a few map operations,
    /// never across `.await`.
    leased: Mutex<Leased>,
}

#[derive(Debug, Default)]
struct Leased {
    /// Iterations with lease series.
    iterations: BTreeSet<u64>,
    /// Splits leased to each task (for the status page's splits per worker).
    splits_by_task: HashMap<u64, u64>,
}

fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let gauge = Gauge::default();
    registry.register(name, help, gauge.clone());
    gauge
}

impl DispatcherMetrics {
    /// Registers every metric of a replica in `registry`.
    pub fn register(registry: &mut Registry) -> Arc<DispatcherMetrics> {
        let metrics = DispatcherMetrics {
            term: gauge(registry, "sluice_raft_term", "Raft term this replica is in"),
            is_leader: gauge(registry, "sluice_raft_is_leader", "1 on the leader, else 0"),
            leader_id: gauge(
                registry,
                "sluice_raft_leader_id",
                "Node id of the leader this replica knows, -1 when none",
            ),
            last_log_index: gauge(
                registry,
                "sluice_raft_last_log_index",
                "Index of the last entry in this replica's log",
            ),
            commit_index: gauge(
                registry,
                "sluice_raft_commit_index",
                "Index of the last entry this replica knows committed",
            ),
            applied_index: gauge(
                registry,
                "sluice_raft_applied_index",
                "Index of the last entry applied to this replica's state",
            ),
            voters: gauge(
                registry,
                "sluice_raft_voters",
                "Voting members in the membership",
            ),
            workers: gauge(
                registry,
                "sluice_workers",
                "Workers registered (applied state)",
            ),
            clients: gauge(
                registry,
                "sluice_clients",
                "Iteration clients (applied state)",
            ),
            jobs: gauge(registry, "sluice_jobs", "Jobs (applied state)"),
            iterations: gauge(registry, "sluice_iterations", "Iterations (applied state)"),
            datasets: gauge(
                registry,
                "sluice_datasets",
                "Datasets registered (applied state)",
            ),
            tasks: gauge(registry, "sluice_tasks", "Tasks (applied state)"),
            commit_latency: Histogram::new(sluice_ops::latency_buckets()),
            requests_per_entry: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            split_leases: Family::default(),
            splits_leased: Family::default(),
            leased: Mutex::new(Leased::default()),
        };
        register_observed(registry, &metrics);
        Arc::new(metrics)
    }

    fn leased(&self) -> std::sync::MutexGuard<'_, Leased> {
        self.leased.lock().expect("lease metrics lock poisoned")
    }

    /// One entry proposed with `requests` requests.
    pub fn observe_entry(&self, requests: usize) {
        self.requests_per_entry.observe(requests as f64);
    }

    /// One entry committed and applied `elapsed` after it was proposed.
    pub fn observe_commit(&self, elapsed: Duration) {
        self.commit_latency.observe(elapsed.as_secs_f64());
    }

    /// A lease of splits committed for `task` of `iteration`.
    pub fn observe_lease(&self, iteration: IterationId, task: TaskId, lease: &SplitLease) {
        let labels = IterationLabels {
            iteration: iteration.0,
        };
        let splits = lease.end.saturating_sub(lease.start);
        self.split_leases.get_or_create(&labels).inc();
        self.splits_leased.get_or_create(&labels).inc_by(splits);
        let mut leased = self.leased();
        leased.iterations.insert(iteration.0);
        *leased.splits_by_task.entry(task.0).or_default() += splits;
    }

    /// Splits leased to `task` by this replica (while it led).
    pub fn splits_of_task(&self, task: TaskId) -> u64 {
        self.leased()
            .splits_by_task
            .get(&task.0)
            .copied()
            .unwrap_or(0)
    }

    /// Raft's view, and the commit index read from the journal.
    pub fn set_raft(&self, metrics: &RaftMetrics<NodeId, NodeInfo>, committed: Option<u64>) {
        let index = |i: Option<u64>| i.map_or(-1, |i| i as i64);
        self.term.set(metrics.current_term as i64);
        self.is_leader
            .set(i64::from(metrics.state == ServerState::Leader));
        self.leader_id
            .set(metrics.current_leader.map_or(-1, |l| l as i64));
        self.last_log_index.set(index(metrics.last_log_index));
        self.applied_index
            .set(index(metrics.last_applied.map(|l| l.index)));
        self.commit_index.set(index(committed));
        let voters = metrics.membership_config.membership().voter_ids().count();
        self.voters.set(voters as i64);
    }

    /// The applied state's sizes; drops the lease series of iterations and the counts of
    /// tasks it no longer has.
    pub fn set_state(&self, state: &DispatcherState) {
        let sizes = state.sizes();
        self.workers.set(sizes.workers as i64);
        self.clients.set(sizes.clients as i64);
        self.jobs.set(sizes.jobs as i64);
        self.iterations.set(sizes.iterations as i64);
        self.datasets.set(sizes.datasets as i64);
        self.tasks.set(sizes.tasks as i64);
        let mut leased = self.leased();
        let gone: Vec<u64> = leased
            .iterations
            .iter()
            .copied()
            .filter(|id| state.iteration(IterationId(*id)).is_none())
            .collect();
        for id in gone {
            leased.iterations.remove(&id);
            let labels = IterationLabels { iteration: id };
            self.split_leases.remove(&labels);
            self.splits_leased.remove(&labels);
        }
        leased
            .splits_by_task
            .retain(|task, _| state.task(TaskId(*task)).is_some());
    }
}

/// Registers the histograms and counters observed as entries commit.
fn register_observed(registry: &mut Registry, m: &DispatcherMetrics) {
    registry.register(
        "sluice_raft_commit_latency_seconds",
        "Time from proposing a log entry to its commit and apply on the leader",
        m.commit_latency.clone(),
    );
    registry.register(
        "sluice_raft_requests_per_entry",
        "Requests gathered into one log entry by group commit",
        m.requests_per_entry.clone(),
    );
    registry.register(
        "sluice_split_leases",
        "Split leases granted, by iteration (leader only)",
        m.split_leases.clone(),
    );
    registry.register(
        "sluice_splits_leased",
        "Splits handed out in leases, by iteration (leader only)",
        m.splits_leased.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_series_of_an_iteration_the_state_no_longer_has_are_dropped() {
        let mut registry = Registry::default();
        let metrics = DispatcherMetrics::register(&mut registry);
        let lease = |start, end| SplitLease {
            repetition: 0,
            start,
            end,
            end_of_splits: false,
        };
        metrics.observe_lease(IterationId(7), TaskId(1), &lease(0, 8));
        metrics.observe_lease(IterationId(7), TaskId(1), &lease(8, 24));
        let encoded = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
            text
        };
        let text = encoded(&registry);
        assert!(
            text.contains("sluice_splits_leased_total{iteration=\"7\"} 24"),
            "{text}"
        );
        assert!(
            text.contains("sluice_split_leases_total{iteration=\"7\"} 2"),
            "{text}"
        );
        assert_eq!(metrics.splits_of_task(TaskId(1)), 24);

        metrics.set_state(&DispatcherState::default());
        let text = encoded(&registry);
        assert!(!text.contains("iteration=\"7\""), "{text}");
        assert_eq!(metrics.splits_of_task(TaskId(1)), 0);
    }
}
