//! The arguments of `sluice-jepsen run` and `sluice-jepsen self-test`.

use crate::history::parse_delivery;
use clap::{Args, Parser, Subcommand};
use sluice_client::Delivery;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "sluice-jepsen",
    about = "Chaos harness: real sluice dispatchers and workers under kills, pauses and partitions, a history, checkers"
)]
pub struct Cli {
    /// Log filter of the harness itself (tracing `EnvFilter` syntax).
    #[arg(long, global = true, default_value = "error")]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// One run: faults for --time, a heal, a final epoch, checks. Exit 0 valid, 1 invalid,
    /// 2 unknown or harness failure.
    Run(RunArgs),
    /// Runs against binaries built with planted bugs (a dispatcher that leases splits twice, a
    /// worker that re-sends an acknowledged element, a worker that skips an element when it
    /// takes a stream over, a dispatcher whose restored checkpoints forget an element taken);
    /// exit 0 only if every run is found invalid.
    SelfTest(SelfTestArgs),
    /// Checks a finished run's history again (with this build's checkers), rewriting its
    /// results.json and report.html. Exit codes as `run`.
    Check(CheckArgs),
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// A run's output directory (its schedule.json and history.jsonl are read).
    #[arg(long)]
    pub out: PathBuf,
    /// As `run --max-delivery-gap`.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_delivery_gap: Option<Duration>,
    /// Judge the run's epochs as this delivery (`exactly-once` or `at-most-once`) instead of
    /// the one its history records; a history that records none (an older build's) is judged
    /// as at-most-once without it.
    #[arg(long, value_parser = parse_delivery)]
    pub delivery: Option<Delivery>,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Length of the fault phase.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "45s")]
    pub time: Duration,
    /// Seed of the fault schedule and the clients' choices (random if omitted; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output directory (created; must be empty): data dirs, logs, history, report.
    #[arg(long)]
    pub out: PathBuf,
    /// Dispatcher processes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// In-process clients.
    #[arg(long, default_value_t = 2)]
    pub clients: u32,
    /// Faults to inject: any of kill, pause, partition, restart (dispatchers), worker-kill,
    /// worker-pause, worker-restart, worker-partition (a worker's links to the dispatchers),
    /// reader-partition (the readers' links to a worker), trainer (a trainer's reading process,
    /// `sluice read` with states, SIGKILLed and restarted from its last state; the trainer
    /// reads only when this is on).
    #[arg(
        long,
        default_value = "kill,pause,partition,restart,worker-kill,worker-pause,worker-restart,worker-partition,reader-partition,trainer"
    )]
    pub nemesis: String,
    /// Fail the run when no element is delivered for longer than this while a reader waits,
    /// in a gap of the fault phase that overlaps no worker fault (e.g. `1.5s`). Without it, the
    /// gaps are only reported.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_delivery_gap: Option<Duration>,
    /// How the workload's jobs deliver: `exactly-once` (every split of a complete epoch
    /// delivered once, whatever the faults) or `at-most-once` (tf.data's: the splits a failed
    /// worker held may be lost).
    #[arg(long, default_value = "exactly-once", value_parser = parse_delivery)]
    pub delivery: Delivery,
    /// The `sluice` binary (default: the workspace's target/debug/sluice, built if missing).
    #[arg(long)]
    pub sluice_bin: Option<PathBuf>,
    /// Dispatcher election timeout (lower bound), passed to every node.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "300ms")]
    pub election_timeout: Duration,
    /// A worker silent this long is removed by the dispatchers (their `--worker-timeout`); below
    /// the longest worker fault (4 s), pauses and partitions of workers also remove them.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub worker_timeout: Duration,
    /// Splits (elements of `range(N)`) per epoch.
    #[arg(long, default_value_t = 1000)]
    pub splits: u64,
    /// Elements per second one client reads at most (0: no limit).
    #[arg(long, default_value_t = 2000.0)]
    pub rate: f64,
    /// Elements per second the trainer reads at most (0: no limit), with the trainer nemesis.
    #[arg(long, default_value_t = 500.0)]
    pub trainer_rate: f64,
    /// A worker's first and largest split lease, `FIRST,MAX`.
    #[arg(long, default_value = "16,64")]
    pub split_lease: String,
    /// Run without TLS and tokens (plain TCP, every caller trusted). By default every port
    /// speaks TLS, replicas authenticate each other with mutual TLS, and every call carries a
    /// token; the certificates and tokens are made in OUT/certs.
    #[arg(long)]
    pub plain: bool,
}

#[derive(Args, Debug, Clone)]
pub struct SelfTestArgs {
    /// Output directory: one subdirectory per planted bug.
    #[arg(long)]
    pub out: PathBuf,
    /// The planted bugs to run against: `dispatcher` (splits leased twice), `worker` (an
    /// element re-sent after its acknowledgement), `resume` (a worker taking over a failed
    /// worker's stream skips one element too many), `restore` (a checkpoint restored for a
    /// killed trainer forgets the last element taken).
    #[arg(long, default_value = "dispatcher,worker,resume,restore")]
    pub planted: String,
    /// Length of the fault phase.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub time: Duration,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run without TLS and tokens (as `run --plain`).
    #[arg(long)]
    pub plain: bool,
}

impl RunArgs {
    /// The defaults of `run`, for the self-test.
    pub fn defaults(out: PathBuf) -> RunArgs {
        let cli = Cli::parse_from(["sluice-jepsen", "run", "--out", "."]);
        match cli.command {
            Command::Run(mut args) => {
                args.out = out;
                args
            }
            Command::SelfTest(_) | Command::Check(_) => unreachable!("parsed a run"),
        }
    }
}
