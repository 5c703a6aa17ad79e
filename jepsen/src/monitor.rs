//! `Monitor`: polls every node's `GetStatus` a few times a second and records each change of
//! leader in the history (`process: monitor, f: leader`). The nemesis asks it who leads when a
//! fault aims at "the leader"; the report draws its events.
//!
//! From the leader's view it also records each job's iteration once (`f: iteration`, which ties
//! the readers' jobs to the workers' leases) and every change of the registered workers
//! (`f: worker-registered`, `f: worker-removed`): a worker the dispatcher removed loses the
//! splits it held, as a dead one does. A removal and re-registration between two polls goes
//! unseen here; the loss checker also reads it from the worker's leases (a new task of the same
//! iteration).
//!
//! A leader is a node whose own status says `Leader`, the highest term winning (a restarted node
//! may claim an old term for a moment). A paused or partitioned node may still believe it
//! leads; that is why the term decides, and why this view is only a hint, never checked.

use crate::cluster::{leader_of, Cluster};
use crate::history::{History, Kind};
use crate::lease_book::LeaseBook;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const POLL: Duration = Duration::from_millis(250);

pub struct Monitor {
    leader: watch::Receiver<Option<(u64, u64)>>,
}

impl Monitor {
    /// `workers`: each worker's name by the address it registers under.
    pub fn start(
        cluster: Arc<Cluster>,
        history: History,
        book: LeaseBook,
        workers: BTreeMap<String, String>,
        cancel: CancellationToken,
    ) -> Monitor {
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            let mut last: Option<(u64, u64)> = None;
            let mut registered: Option<BTreeSet<String>> = None;
            loop {
                let ids: Vec<u64> = cluster.ids().collect();
                let views: Vec<Value> =
                    futures::future::join_all(ids.iter().map(|&id| cluster.status(id)))
                        .await
                        .into_iter()
                        .filter_map(Result::ok)
                        .collect();
                let leader = leader_of(views.iter().cloned());
                let leader_view = leader.and_then(|(node, term)| {
                    views.iter().find(|v| {
                        v["node"].as_u64() == Some(node) && v["term"].as_u64() == Some(term)
                    })
                });
                if let Some(view) = leader_view {
                    record_iterations(view, &book, &history);
                    let now = worker_addresses(view);
                    if let Some(before) = &registered {
                        record_worker_changes(before, &now, &workers, &history);
                    }
                    registered = Some(now);
                }
                if let Some((node, term)) = leader.filter(|_| leader != last) {
                    history.record(
                        "monitor",
                        Kind::Ok,
                        "leader",
                        json!({"node": node, "term": term}),
                    );
                    last = leader;
                }
                let _ = tx.send(leader);
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        });
        Monitor { leader: rx }
    }

    /// The leader seen by the last poll.
    pub fn leader(&self) -> Option<u64> {
        self.leader.borrow().map(|(node, _)| node)
    }

    /// Waits up to `timeout` for a leader.
    pub async fn wait_leader(&self, timeout: Duration) -> Option<u64> {
        let mut rx = self.leader.clone();
        let found = tokio::time::timeout(timeout, rx.wait_for(|l| l.is_some())).await;
        match found {
            Ok(Ok(l)) => l.map(|(node, _)| node),
            _ => None,
        }
    }
}

/// Records each job's iteration the first time the leader's view shows it.
fn record_iterations(view: &Value, book: &LeaseBook, history: &History) {
    let jobs: HashMap<u64, &str> = view["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| Some((j["job_id"].as_u64()?, j["name"].as_str()?)))
        .collect();
    for it in view["iterations"].as_array().into_iter().flatten() {
        let (Some(iteration), Some(job)) = (
            it["iteration_id"].as_u64(),
            it["job_id"].as_u64().and_then(|j| jobs.get(&j)),
        ) else {
            continue;
        };
        if book.set_iteration(job, iteration) {
            history.record(
                "monitor",
                Kind::Ok,
                "iteration",
                json!({"job": job, "iteration": iteration}),
            );
        }
    }
}

/// The addresses of the workers the view lists.
fn worker_addresses(view: &Value) -> BTreeSet<String> {
    view["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["address"].as_str().map(str::to_string))
        .collect()
}

fn record_worker_changes(
    before: &BTreeSet<String>,
    now: &BTreeSet<String>,
    names: &BTreeMap<String, String>,
    history: &History,
) {
    let name = |address: &String| names.get(address).cloned().unwrap_or_default();
    for address in before.difference(now) {
        history.record(
            "monitor",
            Kind::Ok,
            "worker-removed",
            json!({"worker": name(address), "address": address}),
        );
    }
    for address in now.difference(before) {
        history.record(
            "monitor",
            Kind::Ok,
            "worker-registered",
            json!({"worker": name(address), "address": address}),
        );
    }
}
