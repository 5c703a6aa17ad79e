//! Leader-only timers: worker expiry, client timeout and iteration garbage collection; and a
//! leader whose state has no fetch key sets one (see `admissions`).
//!
//! The decision is pure: [`Timers::decide`] takes the time (read by the caller), the applied
//! state and the leader's `Liveness`, and returns the updates to propose (`RemoveWorker`,
//! `ReleaseIterationClient`, `GarbageCollectIteration`, and `RemoveIdle` for ended iterations,
//! jobs and datasets nobody used for their timeout). [`TimerLoop`] is the thin shell around
//! it: every check interval it checks whether this replica leads, reads the clocks once, and
//! proposes what `decide` returned. The change is replicated like any other, so every replica
//! agrees on it and it survives failover.
//!
//! The grace period: a new leader has heard from nobody, so the moment it became leader counts
//! as everyone's last contact; nobody is expired before a full timeout of silence towards it.

use crate::admissions;
use crate::config::DispatcherConfig;
use crate::liveness::Liveness;
use crate::proposer::{now_micros, ProposerHandle};
use crate::raft_types::{Raft, StateHandle};
use crate::state::{DispatcherState, Request, Update};
use sluice_types::{ClientId, DatasetId, IterationId, JobId, NodeId, ShardingPolicy};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// One reading of the leader's clocks, taken by the caller of [`Timers::decide`].
#[derive(Clone, Copy, Debug)]
pub struct Now {
    /// Monotonic time, compared with the contacts `Liveness` recorded.
    pub instant: Instant,
    /// Wall clock in microseconds since the Unix epoch, compared with replicated timestamps
    /// (when an iteration lost its last client).
    pub wall_micros: u64,
}

/// The timeouts the leader enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    pub worker_timeout: Duration,
    pub client_timeout: Duration,
    /// `None`: iterations are never collected.
    pub job_gc_timeout: Option<Duration>,
    /// Whether distributed_epoch iterations are collected too.
    pub gc_dynamic_jobs: bool,
    /// `None`: datasets are never removed.
    pub dataset_gc_timeout: Option<Duration>,
}

/// Most ids of each kind one `RemoveIdle` lists, so its entry stays small; more go in further
/// updates of the same check.
pub const MAX_REMOVALS_PER_UPDATE: usize = 1000;

impl Timers {
    pub fn new(config: &DispatcherConfig) -> Self {
        Timers {
            worker_timeout: config.worker_timeout,
            client_timeout: config.client_timeout,
            job_gc_timeout: config.job_gc_timeout,
            gc_dynamic_jobs: config.gc_dynamic_jobs,
            dataset_gc_timeout: config.dataset_gc_timeout,
        }
    }

    /// How long a client that a moving exactly-once stream waits on may be silent before it is
    /// released: its longest heartbeat poll (half the client timeout, at most 10 s) and a worker
    /// timeout more, at most the client timeout. A live client answers such a wait at once (its
    /// poll returns as soon as it is waited on), so silence that long is a client gone.
    pub fn release_wait(&self) -> Duration {
        let longest_poll = (self.client_timeout / 2).min(Duration::from_secs(10));
        (longest_poll + self.worker_timeout).min(self.client_timeout)
    }

    /// How often the timers look: a quarter of the shortest timeout, within [50 ms, 1 s].
    pub fn check_interval(&self) -> Duration {
        let shortest = [
            Some(self.worker_timeout),
            Some(self.client_timeout),
            self.job_gc_timeout,
            self.dataset_gc_timeout,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(Duration::from_secs(1));
        (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }

    /// The updates the timers want at `now`, for a leader elected at `leader_since`. Reads no
    /// clock: everything time-dependent comes in through `now`.
    pub fn decide(
        &self,
        now: Now,
        leader_since: Instant,
        state: &DispatcherState,
        liveness: &Liveness,
    ) -> Vec<Update> {
        let silent = |last: Instant, timeout: Duration| {
            now.instant.saturating_duration_since(last) > timeout
        };
        let mut updates = Vec::new();
        for worker in state.workers() {
            if silent(
                liveness.worker_last_seen(&worker.address, leader_since),
                self.worker_timeout,
            ) {
                updates.push(Update::RemoveWorker {
                    address: worker.address.clone(),
                });
            }
        }
        for (client_id, _) in state.active_clients() {
            let last = liveness.client_last_seen(client_id.0, leader_since);
            // A client that a moving exactly-once stream waits on holds up the stream (and
            // the epoch's end) while it is silent: it is released sooner.
            let holds_up = || !state.tasks_to_release(client_id).is_empty();
            if silent(last, self.client_timeout)
                || (silent(last, self.release_wait()) && holds_up())
            {
                updates.push(Update::ReleaseIterationClient { client_id });
            }
        }
        if let Some(gc_timeout) = self.job_gc_timeout {
            let idle: Vec<IterationId> = state
                .iterations()
                .filter(|it| !it.finished && it.num_clients == 0)
                .filter(|it| {
                    state.job(it.job_id).is_some_and(|j| {
                        j.sharding != ShardingPolicy::Dynamic || self.gc_dynamic_jobs
                    })
                })
                .filter(|it| {
                    it.last_client_released_micros.is_some_and(|released| {
                        now.wall_micros >= released.saturating_add(gc_timeout.as_micros() as u64)
                    })
                })
                .map(|it| it.id)
                .collect();
            updates.extend(
                idle.into_iter()
                    .map(|iteration_id| Update::GarbageCollectIteration { iteration_id }),
            );
        }
        updates.extend(self.removals(now, state));
        updates
    }

    /// What has been idle long enough to be removed from the state, in updates of at most
    /// [`MAX_REMOVALS_PER_UPDATE`] ids of each kind.
    fn removals(&self, now: Now, state: &DispatcherState) -> Vec<Update> {
        if self.job_gc_timeout.is_none() && self.dataset_gc_timeout.is_none() {
            // Nothing can qualify: no need to look at every entity.
            return Vec::new();
        }
        let before = |timeout: Option<Duration>| {
            timeout.map(|t| now.wall_micros.saturating_sub(t.as_micros() as u64))
        };
        // No timeout: nothing qualifies (a cutoff of 0 is older than every timestamp).
        let iterations_before = before(self.job_gc_timeout).unwrap_or(0);
        let datasets_before = before(self.dataset_gc_timeout).unwrap_or(0);
        let iterations: Vec<IterationId> = state
            .iterations()
            .filter(|it| state.iteration_idle(it.id, iterations_before))
            .map(|it| it.id)
            .collect();
        let jobs: Vec<JobId> = state
            .jobs()
            .filter(|job| state.job_idle(job.id, iterations_before))
            .map(|job| job.id)
            .collect();
        let datasets: Vec<DatasetId> = state
            .datasets()
            .filter(|d| state.dataset_idle(&d.id, datasets_before))
            .map(|d| d.id.clone())
            .collect();
        let updates = [iterations.len(), jobs.len(), datasets.len()]
            .into_iter()
            .map(|n| n.div_ceil(MAX_REMOVALS_PER_UPDATE))
            .max()
            .unwrap_or(0);
        (0..updates)
            .map(|i| Update::RemoveIdle {
                iterations_before,
                datasets_before,
                iterations: chunk(&iterations, i),
                jobs: chunk(&jobs, i),
                datasets: chunk(&datasets, i),
            })
            .collect()
    }
}

/// The `i`th run of at most [`MAX_REMOVALS_PER_UPDATE`] of `ids` (empty past the end).
fn chunk<T: Clone>(ids: &[T], i: usize) -> Vec<T> {
    ids.chunks(MAX_REMOVALS_PER_UPDATE)
        .nth(i)
        .map(<[T]>::to_vec)
        .unwrap_or_default()
}

/// The leader's timer task: reads the clocks, asks [`Timers::decide`], proposes.
pub struct TimerLoop {
    pub id: NodeId,
    pub raft: Raft,
    pub state: StateHandle,
    pub proposer: ProposerHandle,
    pub liveness: Arc<Liveness>,
    pub timers: Timers,
}

impl TimerLoop {
    pub async fn run(self, stop: CancellationToken) {
        let mut leader_since: Option<Instant> = None;
        let mut ticker = tokio::time::interval(self.timers.check_interval());
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
            let now = Now {
                instant: Instant::now(),
                wall_micros: now_micros(),
            };
            let leader_since = *leader_since.get_or_insert(now.instant);
            // A leader whose state has no fetch key (a fresh cluster, or a log begun before
            // keys) sets one, so workers learn it before any reader needs it.
            let read_key = || {
                let applied = self.state.read().expect("state lock poisoned");
                admissions::key_of(&applied.state)
            };
            if read_key().is_none() {
                if let Err(e) = admissions::fetch_key(read_key, &self.proposer).await {
                    warn!(node = self.id, error = %e, "setting the fetch key failed");
                    continue;
                }
            }
            let updates = {
                let applied = self.state.read().expect("state lock poisoned");
                let state = &applied.state;
                self.liveness.retain(
                    |w| state.worker(w).is_some(),
                    |c| state.client_iteration(ClientId(c)).is_some(),
                );
                self.timers.decide(now, leader_since, state, &self.liveness)
            };
            for update in updates {
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
}

#[cfg(test)]
#[path = "timers_tests.rs"]
mod tests;
