//! `DispatcherOps`: what a replica serves on its metrics listener (`--metrics-listen`): its
//! metrics, its readiness, and the status page with its data.
//!
//! Readiness ("serving"): the leader serves while a quorum acknowledged it within the quorum
//! lease (the longest election timeout: past it, a new leader may be serving elsewhere); a
//! follower serves when it knows a current leader
//! and has applied every entry it knows committed (its journal's commit index), so a load
//! balancer or a Kubernetes readiness probe sends nobody to a replica that is electing or
//! catching up. Anything else is not serving, with the reason.
//!
//! The status page's data is this replica's own applied state (`cluster_status`, the JSON of
//! `sluice status`, first page), with its role and, on a follower, the leader it follows. A
//! follower's picture may lag the leader's by what it has not applied yet; it never asks the
//! leader, so the page works on a replica cut off from the quorum too.

use crate::cluster_status::{status_json, StatusPage, DEFAULT_PAGE_SIZE};
use crate::dispatcher_metrics::DispatcherMetrics;
use crate::metered_log::MeteredLog;
use crate::proposer::{BatchLimits, ProposerHandle};
use crate::raft_types::{NodeInfo, Raft, StateHandle, TypeConfig};
use crate::state_reader::unacknowledged_leader_ms;
use openraft::storage::RaftLogStorage;
use openraft::RaftMetrics;
use openraft::ServerState;
use serde_json::{json, Value};
use sluice_journal::LogStore;
use sluice_ops::prometheus_client::registry::Registry;
use sluice_ops::{BoxFuture, OpsError, OpsNode, OpsServer, RpcMetrics, RpcMetricsLayer};
use sluice_types::{NodeId, TaskId};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The status page, served as it is (no framework, nothing downloaded).
const STATUS_PAGE: &str = include_str!("status_page.html");

/// A replica's metrics, made before its servers start (their RPC layer and the proposer's log
/// need them); all `None` without a metrics listener.
pub struct OpsSetup {
    listener: Option<TcpListener>,
    registry: Registry,
    rpc: Option<Arc<RpcMetrics>>,
    metrics: Option<Arc<DispatcherMetrics>>,
}

impl OpsSetup {
    /// Binds `listen` (when set) and registers the replica's metrics.
    pub async fn bind(listen: Option<&str>) -> Result<OpsSetup, OpsError> {
        let mut registry = Registry::default();
        let Some(listen) = listen else {
            return Ok(OpsSetup {
                listener: None,
                registry,
                rpc: None,
                metrics: None,
            });
        };
        let listener = OpsServer::bind(listen).await?;
        let rpc = RpcMetrics::register(&mut registry);
        let metrics = DispatcherMetrics::register(&mut registry);
        Ok(OpsSetup {
            listener: Some(listener),
            registry,
            rpc: Some(rpc),
            metrics: Some(metrics),
        })
    }

    /// The layer measuring RPCs on the replica's gRPC servers.
    pub fn rpc_layer(&self) -> RpcMetricsLayer {
        RpcMetricsLayer::new(self.rpc.clone())
    }

    /// The proposer, on a log that measures group commit when metrics are on; its callers wait
    /// `commit_timeout` for a commit.
    pub fn proposer(&self, raft: &Raft, commit_timeout: Duration) -> ProposerHandle {
        let proposer = match &self.metrics {
            Some(metrics) => ProposerHandle::spawn_with(
                MeteredLog::new(raft.clone(), metrics.clone()),
                BatchLimits::default(),
            ),
            None => ProposerHandle::spawn(raft.clone()),
        };
        proposer.with_commit_timeout(commit_timeout)
    }

    /// Starts the listener, if there is one, until `shutdown`.
    pub fn serve(
        self,
        raft: Raft,
        state: StateHandle,
        log: LogStore<TypeConfig>,
        quorum_lease: Duration,
        shutdown: CancellationToken,
    ) -> Result<Option<OpsServer>, OpsError> {
        let (Some(listener), Some(metrics)) = (self.listener, self.metrics) else {
            return Ok(None);
        };
        let node = DispatcherOps {
            registry: self.registry,
            metrics,
            raft,
            state,
            log,
            quorum_lease,
        };
        OpsServer::serve(listener, Arc::new(node), shutdown).map(Some)
    }
}

pub struct DispatcherOps {
    registry: Registry,
    metrics: Arc<DispatcherMetrics>,
    raft: Raft,
    state: StateHandle,
    /// A clone of the journal's log store: the commit index is read from it.
    log: LogStore<TypeConfig>,
    /// How long a leader serves without a quorum's acknowledgement.
    quorum_lease: Duration,
}

impl DispatcherOps {
    /// The commit index this replica knows (persisted by openraft as it learns it).
    async fn committed(&self) -> Result<Option<u64>, String> {
        let mut log = self.log.clone();
        let committed = log
            .read_committed()
            .await
            .map_err(|e| format!("read the commit index: {e}"))?;
        Ok(committed.map(|c| c.index))
    }

    async fn readiness_now(&self) -> Result<(), String> {
        let metrics = self.raft.metrics().borrow().clone();
        self.readiness(&metrics, self.committed().await?)
    }

    /// Whether this replica serves, given its Raft metrics and the commit index it knows.
    fn readiness(
        &self,
        metrics: &RaftMetrics<NodeId, NodeInfo>,
        committed: Option<u64>,
    ) -> Result<(), String> {
        if let Err(e) = &metrics.running_state {
            return Err(format!("raft stopped: {e}"));
        }
        if metrics.state == ServerState::Leader {
            return match unacknowledged_leader_ms(metrics, self.quorum_lease) {
                Some(ms) => Err(format!(
                    "leader without a quorum: none acknowledged it for {ms} ms"
                )),
                None => Ok(()),
            };
        }
        let Some(leader) = metrics.current_leader else {
            return Err(format!(
                "no known leader (this replica is a {:?} in term {})",
                metrics.state, metrics.current_term
            ));
        };
        let applied = metrics.last_applied.as_ref().map(|l| l.index);
        match committed {
            Some(committed) if applied < Some(committed) => Err(format!(
                "catching up: applied index {} of committed {committed} (leader {leader})",
                applied.map_or("none".into(), |a| a.to_string())
            )),
            _ => Ok(()),
        }
    }

    async fn status(&self) -> Value {
        let raft = self.raft.metrics().borrow().clone();
        let page = StatusPage {
            size: DEFAULT_PAGE_SIZE,
            after: Default::default(),
        };
        let mut json = {
            let applied = self.state.read().expect("state lock poisoned");
            status_json(&raft, &applied.state, &page)
        };
        let role = role(raft.state);
        json["role"] = role.into();
        // One read of the journal's commit index serves both fields.
        let committed = self.committed().await;
        json["commit_index"] = committed.clone().ok().flatten().into();
        json["serving"] = match committed.and_then(|c| self.readiness(&raft, c)) {
            Ok(()) => Value::Null,
            Err(reason) => reason.into(),
        };
        // What the leader knows of each member's log (matched index); others know only their own.
        let matched = raft.replication.clone().unwrap_or_default();
        if let Some(members) = json["members"].as_array_mut() {
            for member in members {
                let id = member["id"].as_u64();
                let member_role = match (id == raft.current_leader, member["voter"].as_bool()) {
                    (true, _) => "leader",
                    (false, Some(true)) => "follower",
                    (false, _) => "learner",
                };
                member["role"] = member_role.into();
                member["this_replica"] = (id == Some(raft.id)).into();
                if let Some(id) = id {
                    if let Some(log_id) = matched.get(&id) {
                        member["matched_index"] = log_id.map(|l| l.index).into();
                    }
                }
            }
        }
        if let Some(workers) = json["workers"].as_array_mut() {
            for worker in workers {
                let splits: u64 = worker["active_tasks"]
                    .as_array()
                    .map(|tasks| {
                        tasks
                            .iter()
                            .filter_map(Value::as_u64)
                            .map(|t| self.metrics.splits_of_task(TaskId(t)))
                            .sum()
                    })
                    .unwrap_or(0);
                worker["splits_leased"] = json!(splits);
            }
        }
        json
    }
}

fn role(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shut down",
    }
}

impl OpsNode for DispatcherOps {
    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn refresh(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let committed = self.committed().await.ok().flatten();
            let raft = self.raft.metrics().borrow().clone();
            self.metrics.set_raft(&raft, committed);
            let applied = self.state.read().expect("state lock poisoned");
            self.metrics.set_state(&applied.state);
        })
    }

    fn readiness(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(self.readiness_now())
    }

    fn status_json(&self) -> Option<BoxFuture<'_, Value>> {
        Some(Box::pin(self.status()))
    }

    fn status_page(&self) -> Option<&'static str> {
        Some(STATUS_PAGE)
    }
}
