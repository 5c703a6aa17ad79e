//! Leader-only timers: worker expiry, client timeout and iteration garbage collection.
//!
//! Every `check_interval` the replica checks whether it leads; if so, it compares the state
//! with its `Liveness` and the clock, and *proposes* updates (`RemoveWorker`,
//! `ReleaseIterationClient`, `GarbageCollectIteration`). The decision is the leader's; the change
//! is replicated like any other, so every replica agrees on it and it survives failover.

use crate::config::DispatcherConfig;
use crate::ids::{IterationId, NodeId};
use crate::liveness::Liveness;
use crate::proposer::ProposerHandle;
use crate::state::{Request, ShardingPolicy, Update};
use crate::types::{Raft, StateHandle};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub struct Timers {
    pub id: NodeId,
    pub raft: Raft,
    pub state: StateHandle,
    pub proposer: ProposerHandle,
    pub liveness: Arc<Liveness>,
    pub config: DispatcherConfig,
}

impl Timers {
    /// How often the timers look: a quarter of the shortest timeout, within [50 ms, 1 s].
    fn check_interval(&self) -> Duration {
        let shortest = [
            Some(self.config.worker_timeout),
            Some(self.config.client_timeout),
            self.config.job_gc_timeout,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(Duration::from_secs(1));
        (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }

    pub async fn run(self, stop: CancellationToken) {
        let mut leader_since: Option<Instant> = None;
        let mut ticker = tokio::time::interval(self.check_interval());
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let leads = {
                let metrics = self.raft.metrics();
                let m = metrics.borrow();
                m.state.is_leader() && m.current_leader == Some(self.id)
            };
            if !leads {
                leader_since = None;
                continue;
            }
            let grace_start = *leader_since.get_or_insert_with(Instant::now);
            for update in self.decide(grace_start) {
                info!(
                    node = self.id,
                    update = update.kind(),
                    ?update,
                    "timer proposes"
                );
                if let Err(e) = self.proposer.propose(Request { id: None, update }).await {
                    warn!(node = self.id, error = %e, "timer proposal failed");
                    break;
                }
            }
        }
    }

    /// The updates the timers want now (pure apart from reading clocks and soft state).
    fn decide(&self, grace_start: Instant) -> Vec<Update> {
        let now = Instant::now();
        let wall = crate::proposer::now_micros();
        let applied = self.state.read().expect("state lock poisoned");
        let state = &applied.state;
        self.liveness.retain(
            |w| state.worker(w).is_some(),
            |c| state.client_iteration(crate::ids::ClientId(c)).is_some(),
        );
        let mut updates = Vec::new();
        for worker in state.workers() {
            let last = self.liveness.worker_last_seen(&worker.address, grace_start);
            if now.duration_since(last) > self.config.worker_timeout {
                updates.push(Update::RemoveWorker {
                    address: worker.address.clone(),
                });
            }
        }
        for (client_id, _) in state.active_clients() {
            let last = self.liveness.client_last_seen(client_id.0, grace_start);
            if now.duration_since(last) > self.config.client_timeout {
                updates.push(Update::ReleaseIterationClient { client_id });
            }
        }
        if let Some(gc_timeout) = self.config.job_gc_timeout {
            let idle: Vec<IterationId> = state
                .iterations()
                .filter(|it| !it.finished && it.num_clients == 0)
                .filter(|it| {
                    state.job(it.job_id).is_some_and(|j| {
                        j.sharding != ShardingPolicy::Dynamic || self.config.gc_dynamic_jobs
                    })
                })
                .filter(|it| {
                    it.last_client_released_micros.is_some_and(|released| {
                        wall >= released.saturating_add(gc_timeout.as_micros() as u64)
                    })
                })
                .map(|it| it.id)
                .collect();
            updates.extend(
                idle.into_iter()
                    .map(|iteration_id| Update::GarbageCollectIteration { iteration_id }),
            );
        }
        updates
    }
}
