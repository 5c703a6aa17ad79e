//! `SimWorker` and `SimClient`: workers and clients simulated as tokio tasks in the bench
//! process, talking the dispatcher's real gRPC API through `sluice_rpc`'s client.
//!
//! They do what the real ones do towards the dispatcher, without data: a worker heartbeats with
//! the tasks it holds (long poll, the worker's default), starts a lease loop for each new task
//! and drops the tasks it is told to delete; a task leases splits of its distributed_epoch
//! iteration as the worker's split leaser sizes them (first 8, doubling while a lease is used up
//! in less than 100 ms), spends `split_cost` per split on average instead of running a pipeline,
//! and reports itself finished once the splits ran out. A client attaches to its job's iteration,
//! heartbeats (long poll, the client's default) and, when the iteration finished, releases it
//! and attaches to the next repetition, as an epoch loop does. Nobody reads elements: the
//! workers' addresses are never dialled.

use crate::fleet_stats::{Caller, FleetStats};
use rand::Rng;
use sluice_client::{HeartbeatWaits, HEARTBEAT_POLL};
use sluice_rpc::{lease_slack, ClientHeartbeat, DispatcherClient, KnownTasks, WorkerHeartbeat};
use sluice_types::{IterationId, JobId, LeaseRequest, TaskId, WorkerId};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// The long poll of workers' heartbeats (their default).
pub(crate) const WORKER_POLL: Duration = Duration::from_secs(1);
/// The worker's split leaser: first lease, largest lease, and the time a lease should last
/// before the next one doubles.
pub(crate) const FIRST_LEASE: u32 = 8;
const MAX_LEASE: u32 = 1 << 16;
const LEASE_TARGET: Duration = Duration::from_millis(100);
/// After a failed call, as the real worker does before its next heartbeat.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// The time a lease's splits take, as a multiple of `split_cost` times their number: drawn
/// for each lease, as real splits differ in size and workers in speed. With the same time for
/// every lease, the tasks of the jobs, all started together, would lease in lockstep forever:
/// a third of the time at three times the mean rate, then almost not at all.
const WORK_SPREAD: std::ops::Range<f64> = 0.5..1.5;

pub(crate) struct SimWorker {
    pub(crate) client: DispatcherClient,
    pub(crate) address: String,
    /// Simulated time a task spends on one split.
    pub(crate) split_cost: Duration,
    pub(crate) stats: Arc<FleetStats>,
    pub(crate) cancel: CancellationToken,
}

impl SimWorker {
    pub(crate) async fn run(self) {
        let me = Arc::new(self);
        // A worker's lease loops by task id: a loop dropped from here, or with the map when
        // the worker ends however it ends, is aborted.
        let mut held: HashMap<u64, AbortOnDropHandle<()>> = HashMap::new();
        let mut first = true;
        while !me.cancel.is_cancelled() {
            let heartbeat = WorkerHeartbeat {
                worker: WorkerId(me.address.clone()),
                current_tasks: held.keys().map(|t| TaskId(*t)).collect(),
                tags: Vec::new(),
                // One process for the whole run, as a real worker's.
                incarnation: 1,
            };
            let started = Instant::now();
            let reply = tokio::select! {
                _ = me.cancel.cancelled() => break,
                reply = me.client.worker_heartbeat(&heartbeat, WORKER_POLL) => reply,
            };
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    me.stats.error("worker heartbeat", e);
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
            };
            let news = !reply.new_tasks.is_empty() || !reply.tasks_to_delete.is_empty();
            me.stats
                .heartbeat(Caller::Worker, started, WORKER_POLL, news);
            if first {
                me.stats.workers_up.fetch_add(1, Ordering::Relaxed);
                first = false;
            }
            for task in reply.new_tasks {
                let (task_id, iteration_id) =
                    (TaskId(task.task_id), IterationId(task.iteration_id));
                held.entry(task.task_id).or_insert_with(|| {
                    let working = Working::start(&me.stats);
                    AbortOnDropHandle::new(tokio::spawn(me.clone().lease_loop(
                        task_id,
                        iteration_id,
                        working,
                    )))
                });
            }
            for task_id in reply.tasks_to_delete {
                held.remove(&task_id);
            }
        }
    }

    /// Leases the task's splits until they run out, then reports the task finished. As the
    /// worker's split leaser does, it keeps one lease ahead: the next lease is asked for as
    /// soon as a lease arrives, with the slack the leaser gives it, while the task works
    /// through the splits it has. It never waits on the cancel token: its worker aborts it
    /// (100,000 loops registering with one token at every lease and every sleep cost the bench a
    /// few percent of its CPU).
    async fn lease_loop(
        self: Arc<Self>,
        task_id: TaskId,
        iteration_id: IterationId,
        _working: Working,
    ) {
        let request = |max_splits| LeaseRequest {
            iteration_id,
            task_id,
            provider: 0,
            repetition: 0,
            max_splits,
        };
        let mut size = FIRST_LEASE;
        // The first lease: the task has nothing to do until it arrives.
        let asked = Instant::now();
        let mut next = self.client.lease_splits(&request(size)).await;
        let mut lasted = asked.elapsed();
        loop {
            let lease = match next {
                Ok(lease) => lease,
                Err(e) => {
                    // A real task fails here; its splits are lost (at-most-once).
                    self.stats.error("lease splits", e);
                    return;
                }
            };
            let splits = lease.end.saturating_sub(lease.start);
            self.stats.lease(splits);
            if lease.end_of_splits {
                break;
            }
            let work = self.split_cost.saturating_mul(splits as u32);
            if work < LEASE_TARGET {
                size = (size * 2).min(MAX_LEASE);
            }
            let work = work.mul_f64(rand::rng().random_range(WORK_SPREAD));
            // The next lease, asked for ahead while this one's splits are worked through.
            let asked = Instant::now();
            let ahead = async {
                let lease = self
                    .client
                    .lease_splits_ahead(&request(size), lease_slack(lasted))
                    .await;
                self.stats.lease_answered(asked.elapsed());
                (lease, Instant::now())
            };
            let worked = async {
                tokio::time::sleep(work).await;
                Instant::now()
            };
            let ((lease, arrived), done) = tokio::join!(ahead, worked);
            self.stats
                .task_waited(arrived.saturating_duration_since(done));
            lasted = asked.elapsed();
            next = lease;
        }
        let worker = WorkerId(self.address.clone());
        let finished = [task_id];
        match self.client.worker_update(&worker, &finished).await {
            Ok(()) => self.stats.task_finished(),
            Err(e) => self.stats.error("worker update", e),
        }
    }
}

/// Counts a task's lease loop in `FleetStats::working_tasks` while it runs (until it ends,
/// fails or is aborted).
struct Working(Arc<FleetStats>);

impl Working {
    fn start(stats: &Arc<FleetStats>) -> Working {
        stats.working_tasks.fetch_add(1, Ordering::Relaxed);
        Working(stats.clone())
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.0.working_tasks.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) struct SimClient {
    pub(crate) client: DispatcherClient,
    pub(crate) job_id: JobId,
    /// When to attach, from the start of the fleet.
    pub(crate) start_after: Duration,
    pub(crate) stats: Arc<FleetStats>,
    pub(crate) cancel: CancellationToken,
}

impl SimClient {
    pub(crate) async fn run(self) {
        let mut repetition = 0;
        let mut up = false;
        tokio::select! {
            _ = self.cancel.cancelled() => return,
            _ = tokio::time::sleep(self.start_after) => {}
        }
        while !self.cancel.is_cancelled() {
            let iteration = tokio::select! {
                _ = self.cancel.cancelled() => return,
                iteration = self.client.get_or_create_iteration(self.job_id, repetition) => iteration,
            };
            let client_id = match iteration {
                Ok(iteration) => iteration.client_id,
                Err(e) => {
                    self.stats.error("get or create iteration", e);
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
            };
            let finished = self.heartbeat_until_finished(client_id, &mut up).await;
            if !finished {
                return;
            }
            let released = tokio::select! {
                _ = self.cancel.cancelled() => return,
                released = self.client.release_iteration_client(client_id) => released,
            };
            if let Err(e) = released {
                self.stats.error("release iteration client", e);
            }
            repetition += 1;
        }
    }

    /// Heartbeats as the client's epoch loop does; true once the iteration finished, false when
    /// cancelled. The first reply ever counts the client as up (`up`).
    async fn heartbeat_until_finished(
        &self,
        client_id: sluice_types::ClientId,
        up: &mut bool,
    ) -> bool {
        let mut known_tasks = KnownTasks::default();
        // The first heartbeat of an epoch does not wait.
        let mut poll = Duration::ZERO;
        let mut waits = HeartbeatWaits::new(HEARTBEAT_POLL);
        loop {
            let heartbeat = ClientHeartbeat {
                client_id,
                known_tasks,
                current_round: None,
                blocked_round: None,
            };
            let started = Instant::now();
            let reply = tokio::select! {
                _ = self.cancel.cancelled() => return false,
                reply = self.client.client_heartbeat(&heartbeat, poll) => reply,
            };
            match reply {
                Ok(reply) => {
                    if !*up {
                        self.stats.clients_up.fetch_add(1, Ordering::Relaxed);
                        *up = true;
                    }
                    let news = reply.iteration_finished
                        || reply.block_round.is_some()
                        || reply.tasks.is_some();
                    self.stats.heartbeat(Caller::Client, started, poll, news);
                    if reply.iteration_finished {
                        return true;
                    }
                    if let Some(tasks) = reply.tasks {
                        known_tasks = KnownTasks::of(&tasks);
                    }
                    poll = waits.draw();
                }
                Err(e) => {
                    self.stats.error("client heartbeat", e);
                    tokio::select! {
                        _ = self.cancel.cancelled() => return false,
                        _ = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            }
        }
    }
}
