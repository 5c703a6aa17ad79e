//! The soak: many short anonymous jobs, one after another from a few callers in parallel, and
//! what the quorum keeps of them afterwards.
//!
//! One small dataset (`range(10)`) is registered; each job is created anonymous
//! (distributed_epoch), gets one iteration with one client, and the client is released. A few
//! simulated workers (see `fleet`) lease the splits of the tasks they are given and report them
//! finished, as real workers do for a short epoch. Afterwards: the encoded state and the last
//! snapshot from `sluice status`, and the leader's RSS over what it was before the first job.
//! Whatever the state still holds of finished jobs shows up in these figures.

use crate::fleet::WORKER_POLL;
use crate::fleet_stats::FleetStats;
use crate::hosts::Hosts;
use crate::leader_probe::{LeaderProcess, Target};
use crate::scale::{
    connections, job_request, register_range, spawn_callers, spawn_workers, wait_count,
};
use anyhow::bail;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct SoakConfig {
    pub jobs: u64,
    /// Callers creating jobs in parallel.
    pub callers: usize,
    pub workers: usize,
    /// How long the workers may take to finish the last tasks after the last job.
    pub drain_timeout: Duration,
    /// The dispatchers' `--job-gc-timeout`: after the drain, the soak waits (up to three of
    /// these and ten seconds) for the quorum to remove the finished jobs before it measures.
    pub job_gc_timeout: Duration,
}

impl Default for SoakConfig {
    fn default() -> Self {
        SoakConfig {
            jobs: 100_000,
            callers: 32,
            workers: 2,
            drain_timeout: Duration::from_secs(120),
            job_gc_timeout: Duration::from_secs(300),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct SoakFigures {
    pub jobs_per_s: f64,
    pub tasks_finished: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub state_mib: f64,
    pub snapshot_mib: f64,
    pub leader_rss_before_mib: f64,
    pub leader_rss_after_mib: f64,
    pub leader_rss_ratio: f64,
    /// The leader's RSS when each tenth of the jobs had been started (a cache filling up levels
    /// off; a leak keeps climbing).
    pub leader_rss_by_tenth_mib: Vec<f64>,
    /// Whether another replica led at the end (an election under the load).
    pub leader_changed: bool,
}

/// Runs the soak against `target`.
pub async fn run_soak(target: &Target, config: &SoakConfig) -> anyhow::Result<SoakFigures> {
    if config.callers == 0 || config.workers == 0 {
        bail!("the soak needs at least one caller and one worker");
    }
    let root = target.client()?;
    let dataset = register_range(&root, 10).await?;
    let stats = Arc::new(FleetStats::default());
    let cancel = CancellationToken::new();
    let mut workers = JoinSet::new();
    let hosts = Hosts::per_core()?;
    let pool = connections(target, &hosts, config.callers, 100)?;
    let result = async {
        spawn_workers(
            &mut workers,
            &hosts,
            target,
            config.workers,
            Duration::ZERO,
            &stats,
            &cancel,
        )?;
        let setup = Duration::from_secs(60);
        wait_count(
            &stats.workers_up,
            config.workers,
            setup,
            "workers registered",
            &stats,
        )
        .await?;
        let leader = target.leader().await?;
        let rss_before = leader.rss_mib()?;

        let started = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let curve = tokio::spawn(rss_by_tenth(leader.clone(), next.clone(), config.jobs));
        let mut callers = JoinSet::new();
        spawn_callers(&mut callers, &hosts, &pool, config.callers, |_, client| {
            let (next, stats, dataset, jobs) =
                (next.clone(), stats.clone(), dataset.clone(), config.jobs);
            async move {
                let request = job_request(&dataset, None);
                while next.fetch_add(1, Ordering::Relaxed) < jobs {
                    let job = match client.get_or_create_job(&request).await {
                        Ok(job) => job,
                        Err(e) => {
                            stats.error("get or create job", e);
                            continue;
                        }
                    };
                    match client.get_or_create_iteration(job, 0).await {
                        Ok(it) => {
                            if let Err(e) = client.release_iteration_client(it.client_id).await {
                                stats.error("release iteration client", e);
                            }
                        }
                        Err(e) => stats.error("get or create iteration", e),
                    }
                }
            }
        })?;
        while callers.join_next().await.is_some() {}
        let leader_rss_by_tenth_mib = curve.await.unwrap_or_default();
        let jobs_per_s = config.jobs as f64 / started.elapsed().as_secs_f64();
        // Let the workers get through the last tasks: finished, failed, or deleted by the
        // dispatcher (a task whose iteration lost its only client may never be sent or
        // leased). Settled when none was working at two checks a heartbeat apart.
        let drain = async {
            let mut idle_checks = 0;
            while idle_checks < 2 {
                tokio::time::sleep(WORKER_POLL + Duration::from_millis(500)).await;
                match stats.working_tasks.load(Ordering::Relaxed) {
                    0 => idle_checks += 1,
                    _ => idle_checks = 0,
                }
            }
        };
        // Measured anyway if the workers never settle.
        let _ = tokio::time::timeout(config.drain_timeout, drain).await;
        // Measured anyway if the jobs are not all removed in time: the figures then show it.
        let removal = config.job_gc_timeout * 3 + Duration::from_secs(10);
        let _ = tokio::time::timeout(removal, target.wait_jobs_removed()).await;

        let rss_after = leader.rss_mib()?;
        let sizes = target.sizes(&leader).await?;
        Ok(SoakFigures {
            jobs_per_s,
            tasks_finished: stats.tasks_finished_count(),
            errors: stats.errors(),
            first_error: stats.first_error(),
            state_mib: sizes.state_mib,
            snapshot_mib: sizes.snapshot_mib,
            leader_rss_before_mib: rss_before,
            leader_rss_after_mib: rss_after,
            leader_rss_ratio: rss_after / rss_before,
            leader_rss_by_tenth_mib,
            leader_changed: sizes.leader_changed,
        })
    }
    .await;
    cancel.cancel();
    while workers.join_next().await.is_some() {}
    result
}

/// The leader's RSS each time another tenth of `jobs` was started (sampled every 100 ms).
async fn rss_by_tenth(leader: LeaderProcess, next: Arc<AtomicU64>, jobs: u64) -> Vec<f64> {
    let mut curve = Vec::new();
    while (curve.len() as u64) < 10 {
        let tenths_done = next.load(Ordering::Relaxed).min(jobs) * 10 / jobs.max(1);
        if tenths_done > curve.len() as u64 {
            let Ok(rss) = leader.rss_mib() else {
                break;
            };
            while (curve.len() as u64) < tenths_done {
                curve.push(rss);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    curve
}
