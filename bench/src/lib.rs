//! `sluice bench`: measures the service's throughput and latencies on loopback, in one run.
//!
//! Dispatchers and workers run as child processes of the `sluice` binary (as tf.data service's
//! figures were taken: dispatcher, worker and client in separate processes); the client runs in
//! the calling process. Each workload prints one row; `--json` adds one JSON object on the last
//! line with the keys the benchmark history in BENCHMARKS.md uses. Throughputs are elements (or
//! MiB) per second of wall time over a whole epoch.
//!
//! A crate of its own, so the binary stays argument parsing and one call per subcommand.
//!
//! Layout:
//! - `cluster`: `Cluster`, a dispatcher quorum and workers as child processes; the leader; RSS.
//! - `epoch`: reading one epoch and timing it (the client side of every workload).
//! - `workloads`: the workloads, one function each.
//! - `leader_fault`: the leader SIGSTOPped or cut off mid-epoch (`pause_stall_ms`,
//!   `partition_stall_ms`, ...).
//! - `metrics_overhead`: the same epoch with metrics listeners (scraped) and without.
//! - `reader_state`: readers' states: a restore to its first element, a state's size, a reader
//!   killed and resumed from its state.
//! - `sweep`: `--plot`, throughput against element size as an SVG.
//! - `report`: `Report`, the printed rows and the JSON object.
//! - `scale`, `soak`: the dispatcher under a fleet of simulated workers and clients, and after
//!   many short jobs; `fleet` simulates them, `fleet_stats` records what they saw,
//!   `leader_probe` reads the leader's CPU, memory and state sizes.

mod cluster;
mod delivery;
mod epoch;
mod fleet;
mod fleet_stats;
mod hosts;
mod leader_fault;
mod leader_probe;
mod metrics_overhead;
mod reader_state;
mod report;
mod scale;
mod soak;
mod sweep;
mod workloads;

pub use leader_probe::Target;
pub use scale::{run_scale, ScaleConfig, ScaleFigures};
pub use soak::{run_soak, SoakConfig, SoakFigures};

use anyhow::bail;
use clap::Args;
use cluster::{rss_mib, Cluster};
use epoch::warm_up;
use leader_fault::{leader_fault, LeaderFault};
use report::Report;
use sluice_client::ShardingPolicy;
use sluice_testkit::Credentials;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Print one JSON object with every figure on the last line.
    #[arg(long)]
    pub json: bool,
    /// Elements of the tiny-element workloads (the batched one reads 20 times as many). At 20 M
    /// elements/s, 2,000,000 made an epoch of 0.1 s, in which starting the job was 5%.
    #[arg(long, default_value_t = 10_000_000)]
    pub elements: u64,
    /// 1 MiB elements of the large-element workload.
    #[arg(long, default_value_t = 2048)]
    pub large_mib: u64,
    /// Also sweep element sizes (64 B to 4 MiB) and write an SVG plot of throughput here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Run only these workloads (comma-separated): local, tiny2w, tiny1w, batched, large,
    /// latency, dynamic, pause, partition, failover, scale, metrics, delivery, reader_state. All
    /// but scale, metrics, delivery and reader_state by default (scale takes minutes and both
    /// cores, metrics ten epochs, delivery eighteen epochs and two with a worker killed,
    /// reader_state a quorum of its own and a reader killed: they run only when named).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Scale: simulated workers, heartbeating at the worker's defaults.
    #[arg(long, default_value_t = 1000)]
    pub scale_workers: usize,
    /// Scale: simulated clients, heartbeating at the client's defaults.
    #[arg(long, default_value_t = 10_000)]
    pub scale_clients: usize,
    /// Scale: simulated clients sharing one connection (each worker has its own; real clients
    /// too, but a connection each costs the bench more than the dispatcher).
    #[arg(long, default_value_t = 100)]
    pub scale_clients_per_connection: usize,
    /// Scale: distributed_epoch jobs leasing splits (the clients are spread over them).
    #[arg(long, default_value_t = 100)]
    pub scale_jobs: usize,
    /// Scale: the measured window, after every worker and client is up.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub scale_duration: std::time::Duration,
    /// Scale: splits per iteration.
    #[arg(long, default_value_t = 100_000)]
    pub scale_splits: u64,
    /// Scale: simulated work of a task per split (sets how often tasks lease).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub scale_split_cost: std::time::Duration,
    /// Soak: short anonymous jobs after the scale run (0: no soak).
    #[arg(long, default_value_t = 100_000)]
    pub soak_jobs: u64,
    /// Soak: callers creating jobs in parallel.
    #[arg(long, default_value_t = 32)]
    pub soak_callers: usize,
    /// Soak: the dispatchers' `--job-gc-timeout`. Finished work is removed this long after its
    /// last client left, so the state after the soak holds what the last such window made.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub soak_job_gc_timeout: std::time::Duration,
    /// Run the networked workloads a second time with TLS on every link and a token on every
    /// call; their figures get the suffix `_tls`.
    #[arg(long)]
    pub tls: bool,
}

/// The workloads `--only` can name, in the order they run.
const WORKLOADS: [&str; 14] = [
    "local",
    "tiny2w",
    "tiny1w",
    "batched",
    "large",
    "latency",
    "dynamic",
    "pause",
    "partition",
    "failover",
    "scale",
    "metrics",
    "delivery",
    "reader_state",
];

/// Workloads that run only when named.
const ONLY_WHEN_NAMED: [&str; 4] = ["scale", "metrics", "delivery", "reader_state"];

/// One pass of the networked workloads `args` selects, on clusters with `creds` (TLS and
/// tokens) or without.
async fn run_pass(
    args: &BenchArgs,
    sluice: &Path,
    creds: Option<&Credentials>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let want = |name: &str| wanted(args, name);
    let n = args.elements;
    if want("tiny2w") {
        let cluster = Cluster::start(sluice, 1, 2, creds)?;
        let client = cluster.client()?;
        // Warm up: registration, channels, worker tasks.
        warm_up(&client, ShardingPolicy::Off).await?;
        workloads::tiny(&client, n, 2, "tiny_service_eps_2w", report).await?;
        workloads::worker_rss(&cluster, report)?;
    }
    if ["tiny1w", "batched", "large", "latency"]
        .iter()
        .any(|w| want(w))
    {
        let cluster = Cluster::start(sluice, 1, 1, creds)?;
        let client = cluster.client()?;
        warm_up(&client, ShardingPolicy::Off).await?;
        if want("tiny1w") {
            workloads::tiny(&client, n, 1, "tiny_service_eps_1w", report).await?;
        }
        if want("batched") {
            workloads::batched(&client, n, report).await?;
        }
        if want("large") {
            workloads::large(&client, args.large_mib, report).await?;
        }
        if want("latency") {
            workloads::latency(&client, report).await?;
        }
    }
    if want("dynamic") || want("pause") || want("failover") {
        let mut cluster = Cluster::start(sluice, 3, 2, creds)?;
        let client = cluster.client()?;
        warm_up(&client, ShardingPolicy::Dynamic).await?;
        if want("dynamic") {
            workloads::dynamic(&client, n, report).await?;
        }
        // Before failover, which leaves the quorum a replica short.
        if want("pause") {
            leader_fault(&cluster, &client, LeaderFault::Pause, report).await?;
        }
        if want("failover") {
            workloads::failover(&mut cluster, &client, report).await?;
        }
    }
    if want("partition") {
        let cluster = Cluster::start_proxied(sluice, 3, 2, creds)?;
        let client = cluster.client()?;
        warm_up(&client, ShardingPolicy::Dynamic).await?;
        leader_fault(&cluster, &client, LeaderFault::Partition, report).await?;
    }
    if want("delivery") {
        delivery::run(sluice, n, args.large_mib, creds, report).await?;
    }
    // Its killed reader is a `sluice read` process, which this pass starts without credentials.
    if want("reader_state") && creds.is_none() {
        reader_state::run(sluice, report).await?;
    }
    if want("metrics") && creds.is_none() {
        metrics_overhead::run(sluice, n, report).await?;
    }
    if want("scale") {
        // The three replicas and the simulated fleet share this machine's cores: each replica
        // gets its share, as an operator gives replicas that share a host.
        let threads = replica_threads().to_string();
        let threads = ["--threads", threads.as_str()];
        let cluster = Cluster::start_with(sluice, 3, 0, creds, &threads)?;
        workloads::scale(&cluster.target()?, &scale_config(args), report).await?;
        if args.soak_jobs > 0 {
            // A fresh quorum, so the leader's memory before the soak is a new replica's.
            drop(cluster);
            let gc_timeout = humantime::format_duration(args.soak_job_gc_timeout).to_string();
            let flags = [threads.as_slice(), &["--job-gc-timeout", &gc_timeout]].concat();
            let cluster = Cluster::start_with(sluice, 3, 0, creds, &flags)?;
            let soak = SoakConfig {
                jobs: args.soak_jobs,
                callers: args.soak_callers,
                job_gc_timeout: args.soak_job_gc_timeout,
                ..SoakConfig::default()
            };
            workloads::soak(&cluster.target()?, &soak, report).await?;
        }
    }
    Ok(())
}

/// Runtime threads of each of the scale workload's replicas: a third of the cores, at least
/// one.
fn replica_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 3).max(1))
}

/// Whether `--only` selects `name` (or selects nothing and `name` runs by default).
fn wanted(args: &BenchArgs, name: &str) -> bool {
    match args.only.is_empty() {
        true => !ONLY_WHEN_NAMED.contains(&name),
        false => args.only.iter().any(|w| w == name),
    }
}

fn scale_config(args: &BenchArgs) -> ScaleConfig {
    ScaleConfig {
        workers: args.scale_workers,
        clients: args.scale_clients,
        jobs: args.scale_jobs,
        duration: args.scale_duration,
        splits: args.scale_splits,
        split_cost: args.scale_split_cost,
        callers_per_connection: args.scale_clients_per_connection,
        ..ScaleConfig::default()
    }
}

/// Runs the workloads `args` selects against servers started from `sluice`, the path of the
/// `sluice` binary, and prints the report.
pub async fn run(args: BenchArgs, sluice: &Path) -> anyhow::Result<()> {
    if let Some(unknown) = args.only.iter().find(|w| !WORKLOADS.contains(&w.as_str())) {
        bail!(
            "unknown workload '{unknown}'; expected one of {}",
            WORKLOADS.join(", ")
        );
    }
    let mut report = Report::default();
    if wanted(&args, "local") {
        workloads::local(args.elements, &mut report)?;
    }
    run_pass(&args, sluice, None, &mut report).await?;
    if args.tls {
        // The same workloads again, every link in TLS and every call with a token, so the cost
        // of security is a ratio measured in one run.
        let creds = Credentials::generate()?;
        println!("-- with TLS and tokens");
        report.set_suffix("_tls");
        run_pass(&args, sluice, Some(&creds), &mut report).await?;
        report.set_suffix("");
    }
    report.put("client_rss_mib", rss_mib("self")?, "MiB (this process)");
    if let Some(path) = &args.plot {
        sweep::plot(sluice, path).await?;
    }
    if args.json {
        println!("{}", report.into_json());
    }
    Ok(())
}
