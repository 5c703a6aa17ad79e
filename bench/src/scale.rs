//! The `scale` workload: a fleet of simulated workers and clients (see `fleet`) against a
//! three-replica quorum, and what the leader pays for them.
//!
//! Workers start first and register; then the jobs are created (distributed_epoch, one named
//! job each, on one registered `range` dataset) and the clients attach to them, spread evenly,
//! the clients of one job after another. Each iteration gets a task on every worker, so the
//! leases come from `jobs × workers` tasks. The fleet runs on `Hosts`, one runtime per core.
//! Once every worker and client is up and the fleet ran `warmup` more, the measured window
//! runs for `duration`: heartbeat latencies (see `fleet_stats`), leases, and the leader's CPU
//! time over the window; at its end the leader's RSS and the sizes from `sluice status` (the
//! encoded state, the last snapshot).
//!
//! Each simulated worker has a connection of its own, as a real one does (its heartbeats and
//! every task's leases go over it). Simulated clients share connections,
//! `callers_per_connection` to each (a connection per client would cost the bench process more
//! than the dispatcher), but each has its own requester id, as separate processes would.

use crate::fleet::{SimClient, SimWorker, FIRST_LEASE};
use crate::fleet_stats::{quantile, sorted, Caller, FleetStats};
use crate::hosts::Hosts;
use crate::leader_probe::Target;
use anyhow::{bail, Context};
use sluice_client::{DispatcherClientExt, RegisterOptions};
use sluice_pipeline::Dataset;
use sluice_rpc::{ClientHeartbeat, DispatcherClient, JobRequest, KnownTasks};
use sluice_types::{ClientId, DatasetId, JobId, ShardingPolicy, TargetWorkers};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Sizes of the scale workload.
#[derive(Clone, Debug)]
pub struct ScaleConfig {
    pub workers: usize,
    pub clients: usize,
    pub jobs: usize,
    /// The measured window.
    pub duration: Duration,
    /// Splits of each iteration (the dataset is `range(splits)`).
    pub splits: u64,
    /// Simulated work per split of a task.
    pub split_cost: Duration,
    /// Simulated clients per gRPC connection.
    pub callers_per_connection: usize,
    /// How long workers may take to register and clients to attach.
    pub setup_timeout: Duration,
    /// How long the whole fleet runs before the window opens: the last clients to attach
    /// answer their first heartbeat at once and start long polls together, a transient the
    /// steady state does not have.
    pub warmup: Duration,
}

impl Default for ScaleConfig {
    fn default() -> Self {
        ScaleConfig {
            workers: 1000,
            clients: 10_000,
            jobs: 100,
            duration: Duration::from_secs(60),
            splits: 100_000,
            split_cost: Duration::from_secs(1),
            callers_per_connection: 100,
            setup_timeout: Duration::from_secs(300),
            warmup: Duration::from_secs(5),
        }
    }
}

impl ScaleConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.workers == 0 || self.clients == 0 || self.jobs == 0 {
            bail!("the scale workload needs at least one worker, client and job");
        }
        if self.workers > 60_000 {
            bail!("at most 60,000 simulated workers (each takes a port number as its address)");
        }
        if self.callers_per_connection == 0 {
            bail!("callers per connection must be at least 1");
        }
        Ok(())
    }
}

/// What one scale run measured.
#[derive(Clone, Debug, Default)]
pub struct ScaleFigures {
    pub heartbeat_p50_ms: f64,
    pub heartbeat_p99_ms: f64,
    pub worker_heartbeat_p50_ms: f64,
    pub worker_heartbeat_p99_ms: f64,
    pub client_heartbeat_p50_ms: f64,
    pub client_heartbeat_p99_ms: f64,
    /// The heartbeat p99 of each second of the window: its median and worst, and how many
    /// seconds had one over 100 ms (a steady tail, or a few bad seconds).
    pub second_p99_median_ms: f64,
    pub second_p99_worst_ms: f64,
    pub seconds_p99_over_100ms: usize,
    pub seconds: usize,
    /// Heartbeats with a latency in the window, and those that brought news instead.
    pub heartbeats: usize,
    pub news_replies: u64,
    pub leases_per_s: f64,
    /// Lease calls the workers sent, and the leases a call carried on average (a worker's
    /// leases asked for while another is on its way go together).
    pub lease_calls_per_s: f64,
    pub leases_per_call: f64,
    /// A lease from asked for to answered. Leases are asked for ahead of need, with slack to
    /// go in one call with the worker's others, so this is not what a task waits.
    pub lease_p50_ms: f64,
    pub lease_p99_ms: f64,
    /// How long a task that had used up its lease waited for its next one: the split leaser
    /// keeps one lease ahead, so mostly zero.
    pub task_wait_p99_ms: f64,
    pub task_wait_max_ms: f64,
    pub splits_per_s: f64,
    pub tasks_finished: u64,
    /// Failed RPCs, setup included.
    pub errors: u64,
    pub first_error: Option<String>,
    /// The leader's CPU over the window, in percent of one core.
    pub leader_cpu_percent: f64,
    pub leader_rss_mib: f64,
    pub state_mib: f64,
    pub snapshot_mib: f64,
    /// Whether another replica led at the end (an election under the load).
    pub leader_changed: bool,
    /// How late a 10 ms timer of the bench's own runtime fired, p99 and worst: the share of
    /// the heartbeat latencies that is the simulated callers' own delay, not the dispatcher's.
    pub bench_lag_p99_ms: f64,
    pub bench_lag_max_ms: f64,
    /// A client heartbeat that may not wait, every 10 ms on a connection of its own: the
    /// leader's answer to one caller that shares nothing with the fleet.
    pub probe_p50_ms: f64,
    pub probe_p99_ms: f64,
}

/// Connections for `callers` simulated callers, `per_connection` to each; the `c`th lives on
/// host `c` (see [`spawn_callers`]).
pub(crate) fn connections(
    target: &Target,
    hosts: &Hosts,
    callers: usize,
    per_connection: usize,
) -> anyhow::Result<Vec<DispatcherClient>> {
    (0..callers.div_ceil(per_connection).max(1))
        .map(|c| {
            let _inside = hosts.of(c).enter();
            target.client()
        })
        .collect()
}

/// Runs `callers` simulated callers in `tasks`, the `i`th on connection `i % pool.len()` and
/// on that connection's host; `caller(i, client)` makes each.
pub(crate) fn spawn_callers<F>(
    tasks: &mut JoinSet<()>,
    hosts: &Hosts,
    pool: &[DispatcherClient],
    callers: usize,
    mut caller: impl FnMut(usize, DispatcherClient) -> F,
) -> anyhow::Result<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    for i in 0..callers {
        let c = i % pool.len();
        hosts.spawn(tasks, c, || Ok(caller(i, pool[c].sharing_connections())))?;
    }
    Ok(())
}

/// Waits until `counter` reaches `n`, or fails after `timeout` naming `what`.
pub(crate) async fn wait_count(
    counter: &AtomicU64,
    n: usize,
    timeout: Duration,
    what: &str,
    stats: &FleetStats,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while counter.load(Ordering::Relaxed) < n as u64 {
        if Instant::now() > deadline {
            bail!(
                "{what}: {} of {n} within {timeout:?} (first error: {})",
                counter.load(Ordering::Relaxed),
                stats.first_error().unwrap_or_else(|| "none".into())
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// One more client of a job, on a connection of its own, heartbeating without waiting.
struct Probe {
    client: DispatcherClient,
    client_id: ClientId,
}

impl Probe {
    async fn attach(target: &Target, job: JobId) -> anyhow::Result<Probe> {
        let client = target.client()?;
        let client_id = client
            .get_or_create_iteration(job, 0)
            .await
            .context("attach the probe")?
            .client_id;
        Ok(Probe { client, client_id })
    }

    /// For `duration`, a heartbeat every 10 ms; their latencies in ms, sorted (failures count
    /// in `stats`).
    async fn run(&self, duration: Duration, stats: &FleetStats) -> Vec<f64> {
        const EVERY: Duration = Duration::from_millis(10);
        let end = Instant::now() + duration;
        let mut known_tasks = KnownTasks::default();
        let mut took = Vec::new();
        while Instant::now() < end {
            let heartbeat = ClientHeartbeat {
                client_id: self.client_id,
                known_tasks,
                current_round: None,
                blocked_round: None,
            };
            let started = Instant::now();
            match self
                .client
                .client_heartbeat(&heartbeat, Duration::ZERO)
                .await
            {
                Ok(reply) => {
                    took.push(started.elapsed().as_secs_f64() * 1000.0);
                    if let Some(tasks) = reply.tasks {
                        known_tasks = KnownTasks::of(&tasks);
                    }
                }
                Err(e) => stats.error("probe heartbeat", e),
            }
            tokio::time::sleep(EVERY).await;
        }
        sorted(took)
    }
}

/// For `duration`, how late each 10 ms sleep on this runtime woke, in ms, sorted.
async fn runtime_lag(duration: Duration) -> Vec<f64> {
    const TICK: Duration = Duration::from_millis(10);
    let end = Instant::now() + duration;
    let mut late = Vec::new();
    while Instant::now() < end {
        let asked = Instant::now();
        tokio::time::sleep(TICK).await;
        late.push(asked.elapsed().saturating_sub(TICK).as_secs_f64() * 1000.0);
    }
    sorted(late)
}

/// Registers `range(splits)`; its id.
pub(crate) async fn register_range(
    client: &DispatcherClient,
    splits: u64,
) -> anyhow::Result<DatasetId> {
    let id = client
        .register_dataset(&Dataset::range(splits as i64), &RegisterOptions::default())
        .await
        .context("register the dataset")?;
    Ok(DatasetId(id))
}

/// A job request on `dataset` (distributed_epoch); named, or anonymous with `None`.
pub(crate) fn job_request(dataset: &DatasetId, name: Option<String>) -> JobRequest {
    JobRequest {
        dataset_id: dataset.clone(),
        sharding: ShardingPolicy::Dynamic,
        job_name: name,
        num_consumers: None,
        use_cross_trainer_cache: false,
        target_workers: TargetWorkers::Auto,
        delivery: Default::default(),
    }
}

/// Starts `n` simulated workers, each with `split_cost` per split and a connection of its own
/// (a worker's heartbeats and its tasks' leases share it, as in a real worker), spread over
/// `hosts`; their clients.
pub(crate) fn spawn_workers(
    tasks: &mut JoinSet<()>,
    hosts: &Hosts,
    target: &Target,
    n: usize,
    split_cost: Duration,
    stats: &Arc<FleetStats>,
    cancel: &CancellationToken,
) -> anyhow::Result<Vec<DispatcherClient>> {
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        hosts.spawn(tasks, i, || {
            let client = target.client()?;
            clients.push(client.clone());
            let worker = SimWorker {
                client,
                address: format!("127.0.0.1:{}", 1024 + i),
                split_cost,
                stats: stats.clone(),
                cancel: cancel.clone(),
            };
            Ok(worker.run())
        })?;
    }
    Ok(clients)
}

/// The lease calls `workers` have sent so far.
fn lease_calls(workers: &[DispatcherClient]) -> u64 {
    workers.iter().map(DispatcherClient::lease_calls).sum()
}

/// Runs the scale workload against `target`.
pub async fn run_scale(target: &Target, config: &ScaleConfig) -> anyhow::Result<ScaleFigures> {
    config.validate()?;
    let root = target.client()?;
    let dataset = register_range(&root, config.splits).await?;
    // While the state is small: the status lists every task.
    let leader = target.leader().await?;
    let stats = Arc::new(FleetStats::default());
    let cancel = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let hosts = Hosts::per_core()?;
    let pool = connections(
        target,
        &hosts,
        config.clients,
        config.callers_per_connection,
    )?;

    let result = async {
        let workers = spawn_workers(
            &mut tasks,
            &hosts,
            target,
            config.workers,
            config.split_cost,
            &stats,
            &cancel,
        )?;
        wait_count(
            &stats.workers_up,
            config.workers,
            config.setup_timeout,
            "workers registered",
            &stats,
        )
        .await?;
        let mut jobs = Vec::new();
        for j in 0..config.jobs {
            let request = job_request(&dataset, Some(format!("scale-{j}")));
            jobs.push(
                root.get_or_create_job(&request)
                    .await
                    .context("create a job")?,
            );
        }
        // The jobs start one after another over the time of a first lease: the first client
        // of a job creates its iteration, and with it a task on every worker, which leases at
        // once. Jobs started all at once would make every task lease in the same second, a
        // burst that real jobs, started at different times, do not make.
        let first_lease = config.split_cost.saturating_mul(FIRST_LEASE);
        spawn_callers(&mut tasks, &hosts, &pool, config.clients, |i, client| {
            let job = i % jobs.len();
            SimClient {
                client,
                job_id: jobs[job],
                start_after: first_lease.mul_f64(job as f64 / jobs.len() as f64),
                stats: stats.clone(),
                cancel: cancel.clone(),
            }
            .run()
        })?;
        wait_count(
            &stats.clients_up,
            config.clients,
            config.setup_timeout,
            "clients heartbeating",
            &stats,
        )
        .await?;

        tokio::time::sleep(config.warmup).await;
        let probe = Probe::attach(target, jobs[0]).await?;
        let cpu_before = leader.cpu_seconds()?;
        let calls_before = lease_calls(&workers);
        let started = Instant::now();
        stats.set_measuring(true);
        let (lag, probed) = tokio::join!(
            runtime_lag(config.duration),
            probe.run(config.duration, &stats)
        );
        stats.set_measuring(false);
        let seconds = started.elapsed().as_secs_f64();
        let cpu = leader.cpu_seconds()? - cpu_before;
        let calls = lease_calls(&workers) - calls_before;
        let leader_rss_mib = leader.rss_mib()?;
        let sizes = target.sizes(&leader).await?;

        let leases = stats.lease_latencies();
        let task_waits = stats.task_waits();
        let per_second = sorted(stats.p99_per_second());
        let (all, workers, clients) = (
            stats.latencies(None),
            stats.latencies(Some(Caller::Worker)),
            stats.latencies(Some(Caller::Client)),
        );
        Ok(ScaleFigures {
            heartbeat_p50_ms: quantile(&all, 0.5),
            heartbeat_p99_ms: quantile(&all, 0.99),
            worker_heartbeat_p50_ms: quantile(&workers, 0.5),
            worker_heartbeat_p99_ms: quantile(&workers, 0.99),
            client_heartbeat_p50_ms: quantile(&clients, 0.5),
            client_heartbeat_p99_ms: quantile(&clients, 0.99),
            second_p99_median_ms: quantile(&per_second, 0.5),
            second_p99_worst_ms: per_second.last().copied().unwrap_or(0.0),
            seconds_p99_over_100ms: per_second.iter().filter(|p99| **p99 > 100.0).count(),
            seconds: per_second.len(),
            heartbeats: all.len(),
            news_replies: stats.news(),
            leases_per_s: stats.leases() as f64 / seconds,
            lease_calls_per_s: calls as f64 / seconds,
            leases_per_call: stats.leases() as f64 / calls.max(1) as f64,
            lease_p50_ms: quantile(&leases, 0.5),
            lease_p99_ms: quantile(&leases, 0.99),
            task_wait_p99_ms: quantile(&task_waits, 0.99),
            task_wait_max_ms: task_waits.last().copied().unwrap_or(0.0),
            splits_per_s: stats.splits() as f64 / seconds,
            tasks_finished: stats.tasks_finished_count(),
            errors: stats.errors(),
            first_error: stats.first_error(),
            leader_cpu_percent: cpu / seconds * 100.0,
            leader_rss_mib,
            state_mib: sizes.state_mib,
            snapshot_mib: sizes.snapshot_mib,
            leader_changed: sizes.leader_changed,
            bench_lag_p99_ms: quantile(&lag, 0.99),
            probe_p50_ms: quantile(&probed, 0.5),
            probe_p99_ms: quantile(&probed, 0.99),
            bench_lag_max_ms: lag.last().copied().unwrap_or(0.0),
        })
    }
    .await;
    cancel.cancel();
    while tasks.join_next().await.is_some() {}
    result
}
