//! One run, phase by phase: setup (schedule, credentials unless `--plain`, proxies, dispatcher
//! processes, a leader, worker processes, clients, the trainer with the trainer nemesis) → fault phase (the nemesis plays the
//! schedule for `--time`) → heal (every link to pass, SIGCONT, restart whatever is down,
//! dispatchers and workers) → final epoch (a fresh client, no faults) → final reads (every
//! node's status once they agree) → checks, `results.json` (with the delivery gaps per fault),
//! `report.html`, the verdict line.
//!
//! Harness failures (a node that never prints READY, no leader at setup) end the run with
//! exit code 2 and are never folded into the system's verdict.

use crate::checker::gaps::{delivery_gaps, DeliveryGaps};
use crate::checker::{self, CheckOptions, CheckResult, Verdict};
use crate::cli::{CheckArgs, RunArgs};
use crate::cluster::{Cluster, ClusterConfig};
use crate::history::{self, History, Kind};
use crate::lease_book::LeaseBook;
use crate::monitor::Monitor;
use crate::nemesis::Nemesis;
use crate::proxy_net::ProxyNet;
use crate::report;
use crate::run_security::RunSecurity;
use crate::schedule::{NemesisKind, Schedule};
use crate::trainer::{self, Trainer, TrainerConfig};
use crate::worker_net::WorkerNet;
use crate::worker_pool::{self, WorkerPids, WorkerPool, WorkerPoolConfig};
use crate::workload::{Client, WorkloadConfig};
use anyhow::{bail, Context};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a run found.
pub struct Outcome {
    pub verdict: Verdict,
    pub results: Vec<CheckResult>,
}

/// `run` as a command: prints the verdict line; returns the exit code.
pub async fn main(args: RunArgs) -> i32 {
    match run(args).await {
        Ok(outcome) => match outcome.verdict {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        },
        Err(e) => {
            println!("unknown: harness failure: {e:#}");
            2
        }
    }
}

/// The workspace root (this crate's parent directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the jepsen crate sits inside the workspace")
        .to_path_buf()
}

/// `--sluice-bin`, or the workspace's `target/debug/sluice`, built if missing.
fn resolve_bin(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(bin) = given {
        if !bin.is_file() {
            bail!("--sluice-bin {} does not exist", bin.display());
        }
        return Ok(bin);
    }
    let root = workspace_root();
    let bin = root.join("target/debug/sluice");
    if !bin.is_file() {
        println!(
            "{} is missing; building it with `cargo build -p sluice`",
            bin.display()
        );
        let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
            .args(["build", "-p", "sluice", "--target-dir"])
            .arg(root.join("target"))
            .current_dir(&root)
            .env_remove("CARGO_TARGET_DIR")
            .status()
            .context("run cargo build -p sluice")?;
        if !status.success() || !bin.is_file() {
            bail!("cargo build -p sluice failed ({status})");
        }
    }
    Ok(bin)
}

fn parse_lease(text: &str) -> anyhow::Result<(u32, u32)> {
    let (a, b) = text
        .split_once(',')
        .context("--split-lease must be FIRST,MAX")?;
    Ok((a.trim().parse()?, b.trim().parse()?))
}

pub async fn run(args: RunArgs) -> anyhow::Result<Outcome> {
    // ---- setup
    let seed = args.seed.unwrap_or_else(rand::random);
    let nemeses: Vec<NemesisKind> = args
        .nemesis
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(str::parse)
        .collect::<Result<_, String>>()
        .map_err(anyhow::Error::msg)?;
    if args.nodes < 1 {
        bail!("--nodes must be at least 1");
    }
    if args.workers < 1 {
        bail!("--workers must be at least 1");
    }
    let split_lease = parse_lease(&args.split_lease)?;
    let out = &args.out;
    if out.exists()
        && std::fs::read_dir(out)
            .context("read --out")?
            .next()
            .is_some()
    {
        bail!("--out {} is not empty", out.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let bin = resolve_bin(args.sluice_bin.clone())?;

    let security = if args.plain {
        RunSecurity::plain()
    } else {
        RunSecurity::generate(&out.join("certs"), args.workers)?
    };
    let schedule = Schedule::generate(seed, args.time, args.nodes, args.workers, &nemeses);
    println!(
        "sluice-jepsen run: seed {seed}, {} nodes, {} workers, {} clients, {:?} of faults, {} delivery, binary {}",
        args.nodes,
        args.workers,
        args.clients,
        args.time,
        history::delivery_name(args.delivery),
        bin.display()
    );
    println!("security: {}", security.describe());
    print!("{}", schedule.describe());
    std::fs::write(
        out.join("schedule.json"),
        serde_json::to_string_pretty(&schedule)?,
    )
    .context("write schedule.json")?;

    let history = History::create(&out.join("history.jsonl"))?;
    history.record(
        "harness",
        Kind::Invoke,
        "setup",
        json!({"seed": seed, "secure": !args.plain,
               "delivery": history::delivery_name(args.delivery)}),
    );
    let addrs = Cluster::pick_addrs(args.nodes)?;
    let worker_addrs = WorkerPool::pick_addrs(args.workers)?;
    // Raft links are proxied at the peer ports; workers reach the dispatchers through fronts,
    // and readers reach workers through reader proxies (see `worker_net`).
    let peer_addrs = addrs.iter().map(|(&id, a)| (id, a.peer)).collect();
    let net = Arc::new(ProxyNet::start(&peer_addrs).await?);
    let pids = WorkerPids::default();
    let client_addrs = addrs.iter().map(|(&id, a)| (id, a.client)).collect();
    let worker_net = Arc::new(WorkerNet::start(&client_addrs, &worker_addrs, pids.clone()).await?);
    let config = ClusterConfig {
        bin: bin.clone(),
        dir: out.clone(),
        election_timeout: args.election_timeout,
        worker_timeout: args.worker_timeout,
        routes: addrs.keys().map(|&id| (id, net.routes_of(id))).collect(),
        advertise: addrs
            .keys()
            .filter_map(|&id| Some((id, worker_net.front(id)?)))
            .collect(),
        server_flags: security.dispatcher_flags(),
        status_security: security.client()?,
    };
    let cluster = Arc::new(Cluster::start(config, &addrs).await?);
    let book = LeaseBook::default();
    let advertised: BTreeMap<u32, (SocketAddr, SocketAddr)> = worker_addrs
        .iter()
        .filter_map(|(&i, &listen)| Some((i, (listen, worker_net.reader_proxy(i)?))))
        .collect();
    let names = advertised
        .iter()
        .map(|(&i, (_, proxy))| (proxy.to_string(), worker_pool::name(i)))
        .collect();
    let stop_monitor = CancellationToken::new();
    let monitor = Arc::new(Monitor::start(
        cluster.clone(),
        history.clone(),
        book.clone(),
        names,
        stop_monitor.clone(),
    ));
    let pool_config = WorkerPoolConfig {
        bin: bin.clone(),
        dir: out.clone(),
        dispatchers: worker_net.fronts(),
        split_lease,
        flags: (1..=args.workers)
            .map(|i| (i, security.worker_flags(i)))
            .collect(),
    };
    let run = Run {
        args: &args,
        bin: &bin,
        seed,
        schedule: &schedule,
        history: &history,
        cluster: &cluster,
        net: &net,
        monitor: &monitor,
        security: &security,
        worker_net: &worker_net,
        pool_config,
        worker_addrs: &advertised,
        pids,
        book,
    };
    let result = drive(run).await;
    stop_monitor.cancel();
    cluster.shutdown().await;
    history.flush()?;
    result?;

    // ---- checks
    let options = CheckOptions {
        max_delivery_gap: args.max_delivery_gap,
        delivery: None,
    };
    check(out, &schedule, &options)
}

/// `check` as a command: the checks of a finished run, again; returns the exit code.
pub fn check_main(args: CheckArgs) -> i32 {
    let schedule = std::fs::read_to_string(args.out.join("schedule.json"))
        .context("read schedule.json")
        .and_then(|text| serde_json::from_str::<Schedule>(&text).context("parse schedule.json"));
    let options = CheckOptions {
        max_delivery_gap: args.max_delivery_gap,
        delivery: args.delivery,
    };
    let outcome = schedule.and_then(|schedule| check(&args.out, &schedule, &options));
    match outcome {
        Ok(outcome) => match outcome.verdict {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        },
        Err(e) => {
            println!("unknown: harness failure: {e:#}");
            2
        }
    }
}

/// Checks the history in `out`, writes `results.json` and `report.html`, prints the verdict.
fn check(out: &Path, schedule: &Schedule, options: &CheckOptions) -> anyhow::Result<Outcome> {
    let seed = schedule.seed;
    let events = history::load(&out.join("history.jsonl"))?;
    let max_delivery_gap = options.max_delivery_gap;
    let results = checker::check_all(&events, schedule, options);
    // The delivery the run is judged by (epochs record their own; they are the run's).
    let delivery = options
        .delivery
        .or_else(|| history::recorded_delivery(&events))
        .map_or("at-most-once (not recorded)", history::delivery_name);
    let verdict = checker::overall(&results);
    let gaps = delivery_gaps(&events);
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json!({
            "seed": seed, "verdict": verdict, "delivery": delivery, "checks": results,
            "max_delivery_gap_ms": max_delivery_gap.map(|d| d.as_millis() as u64),
            "delivery_gaps": gaps_json(&gaps),
        }))?,
    )?;
    std::fs::write(
        out.join("report.html"),
        report::render(&events, schedule, &results, verdict, &gaps, delivery),
    )
    .context("write report.html")?;
    for r in &results {
        println!(
            "  {:<14} {:<8} {}",
            r.name,
            r.verdict.to_string(),
            r.counts
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        for p in &r.problems {
            println!("      {p}");
        }
    }
    let ops = checker::op_counts(&events);
    let count = |r: &[CheckResult], name: &str, key: &str| {
        r.iter()
            .find(|c| c.name == name)
            .and_then(|c| c.counts.get(key).copied())
            .unwrap_or(0)
    };
    println!(
        "{verdict}: seed {seed}, {delivery} delivery, {} of {} faults, {} elements, {} leases, \
         {} duplicates, {} lost ({} with a worker that died or was removed, {} while the worker \
         lived, {} unleased), longest delivery gap {} ms, {} lost writes, {} stale reads, \
         {} ops ({} ok, {} fail, {} info); trainer: {} kills, {} restores, {} of {} epochs \
         complete, {} duplicates, {} lost; see {}",
        count(&results, "coverage", "faults_done"),
        schedule.faults.len(),
        count(&results, "at-most-once", "elements"),
        count(&results, "at-most-once", "leases"),
        count(&results, "at-most-once", "duplicate_elements")
            + count(&results, "at-most-once", "duplicate_leased_splits"),
        count(&results, "loss-bound", "lost_with_worker")
            + count(&results, "loss-bound", "lost_while_worker_lived")
            + count(&results, "loss-bound", "lost_unleased"),
        count(&results, "loss-bound", "lost_with_worker"),
        count(&results, "loss-bound", "lost_while_worker_lived"),
        count(&results, "loss-bound", "lost_unleased"),
        count(&results, "progress", "longest_bounded_gap_ms"),
        count(&results, "no-lost-state", "lost_writes"),
        count(&results, "no-lost-state", "stale_reads"),
        ops.get("ops").unwrap_or(&0),
        ops.get("ok").unwrap_or(&0),
        ops.get("fail").unwrap_or(&0),
        ops.get("info").unwrap_or(&0),
        count(&results, "trainer-exactly-once", "kills"),
        count(&results, "trainer-exactly-once", "restores"),
        count(&results, "trainer-exactly-once", "epochs_complete"),
        count(&results, "trainer-exactly-once", "epochs"),
        count(&results, "trainer-exactly-once", "duplicate_elements"),
        count(&results, "trainer-exactly-once", "lost_elements"),
        out.join("report.html").display()
    );
    Ok(Outcome { verdict, results })
}

/// `results.json`'s `delivery_gaps`: the longest gaps, and per fault the longest gap that
/// began during it.
fn gaps_json(gaps: &DeliveryGaps) -> serde_json::Value {
    json!({
        "longest": gaps.longest,
        "longest_bounded": gaps.longest_bounded,
        "per_fault": gaps.faults.iter().map(|f| json!({
            "fault": f.fault, "kind": f.kind, "on_workers": f.on_workers,
            "start_ms": f.start_ms, "end_ms": f.end_ms,
            "longest_gap_ms": f.longest_gap.map(|g| g.ms()),
            "longest_gap_start_ms": f.longest_gap.map(|g| g.start_ms),
        })).collect::<Vec<_>>(),
    })
}

/// What `drive` works with.
struct Run<'a> {
    args: &'a RunArgs,
    /// The `sluice` binary.
    bin: &'a Path,
    seed: u64,
    schedule: &'a Schedule,
    history: &'a History,
    cluster: &'a Arc<Cluster>,
    net: &'a Arc<ProxyNet>,
    monitor: &'a Arc<Monitor>,
    security: &'a RunSecurity,
    worker_net: &'a Arc<WorkerNet>,
    /// How the workers are started.
    pool_config: WorkerPoolConfig,
    /// Each worker's `(listen, advertised)` addresses.
    worker_addrs: &'a BTreeMap<u32, (SocketAddr, SocketAddr)>,
    /// The live workers' pids, shared with the dispatchers' fronts.
    pids: WorkerPids,
    book: LeaseBook,
}

/// Everything between the cluster's start and its shutdown.
async fn drive(run: Run<'_>) -> anyhow::Result<()> {
    let Run {
        args,
        bin,
        seed,
        schedule,
        history,
        cluster,
        net,
        monitor,
        security,
        worker_net,
        pool_config,
        worker_addrs,
        pids,
        book,
    } = run;
    let Some(leader) = monitor.wait_leader(Duration::from_secs(30)).await else {
        bail!("no leader within 30 s of the start");
    };
    let workers = Arc::new(
        WorkerPool::start(
            pool_config,
            worker_addrs,
            history.clone(),
            pids,
            book.clone(),
        )
        .await
        .context("start the workers")?,
    );
    history.record("harness", Kind::Ok, "setup", json!({"leader": leader}));
    let result = drive_workload(
        Workload {
            args,
            bin,
            seed,
            schedule,
            history,
            cluster,
            net,
            monitor,
            security,
            worker_net,
            book,
        },
        &workers,
    )
    .await;
    // Already done after a final epoch; here for a run that failed before it.
    workers.shutdown().await;
    result
}

/// What the workload phases work with.
struct Workload<'a> {
    args: &'a RunArgs,
    bin: &'a Path,
    seed: u64,
    schedule: &'a Schedule,
    history: &'a History,
    cluster: &'a Arc<Cluster>,
    net: &'a Arc<ProxyNet>,
    monitor: &'a Arc<Monitor>,
    security: &'a RunSecurity,
    worker_net: &'a Arc<WorkerNet>,
    book: LeaseBook,
}

/// From the clients' start to the final reads; the workers are running.
async fn drive_workload(w: Workload<'_>, workers: &Arc<WorkerPool>) -> anyhow::Result<()> {
    let Workload {
        args,
        bin,
        seed,
        schedule,
        history,
        cluster,
        net,
        monitor,
        security,
        worker_net,
        book,
    } = w;
    let config = WorkloadConfig {
        dispatchers: worker_net.fronts(),
        seed,
        splits: args.splits,
        rate: args.rate,
        op_timeout: Duration::from_secs(3),
        epoch_retry: Duration::from_secs(10),
        epoch_timeout: Duration::from_secs(30),
        client_security: security.client()?,
        delivery: args.delivery,
    };
    let stop_clients = CancellationToken::new();
    let mut clients = tokio::task::JoinSet::new();
    for i in 1..=args.clients {
        let client = Client::new(
            &format!("client-{i}"),
            i,
            config.clone(),
            history.clone(),
            book.clone(),
        )?;
        clients.spawn(client.run(stop_clients.clone()));
    }
    let trainer = if schedule.nemeses.contains(&NemesisKind::Trainer) {
        let state_every = trainer::state_every(seed);
        println!(
            "trainer: `sluice read` processes at {} elements/s, a state every {state_every} elements",
            args.trainer_rate
        );
        let config = TrainerConfig {
            bin: bin.to_path_buf(),
            dir: args.out.join("trainer"),
            dispatchers: worker_net.fronts(),
            security_flags: security.client_flags(),
            seed,
            splits: args.splits,
            rate: args.trainer_rate,
            state_every,
            epoch_timeout: Duration::from_secs(60),
        };
        Some(Trainer::start(
            config,
            history.clone(),
            stop_clients.clone(),
        )?)
    } else {
        None
    };

    // ---- fault phase
    println!("fault phase: {:?}", args.time);
    let start = Instant::now();
    let nemesis = Nemesis {
        cluster: cluster.clone(),
        net: net.clone(),
        monitor: monitor.clone(),
        history: history.clone(),
        workers: workers.clone(),
        worker_net: worker_net.clone(),
        trainer: trainer.as_ref().map(|(t, _)| t.clone()),
    };
    nemesis.run(schedule, start, CancellationToken::new()).await;
    tokio::time::sleep_until(start + args.time).await;

    // The clients stop first, so the heal's clock starts only when the heal is done.
    stop_clients.cancel();
    let stopping = async { while clients.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .is_err()
    {
        clients.abort_all();
    }
    if let Some((_, driver)) = trainer {
        // Cancelled with the clients: it kills its process and records the epoch cut short.
        if tokio::time::timeout(Duration::from_secs(10), driver)
            .await
            .is_err()
        {
            println!("the trainer did not stop within 10 s");
        }
    }

    // ---- heal
    history.record("harness", Kind::Invoke, "heal", json!({}));
    net.heal();
    worker_net.heal();
    let mut healed = cluster.heal().await.context("heal")?;
    healed.extend(workers.heal().await.context("heal the workers")?);
    history.record("harness", Kind::Ok, "heal", json!({"actions": healed}));
    println!("healed ({healed:?}); final epoch");

    // ---- final epoch
    let final_config = WorkloadConfig {
        epoch_timeout: Duration::from_millis(checker::PROGRESS_DEADLINE_MS + 5000),
        ..config
    };
    let client = Client::new("final", 0, final_config, history.clone(), book)?;
    let (elements, complete) = client
        .epoch(&format!("final-{seed}"), &CancellationToken::new())
        .await;
    println!("final epoch: {elements} elements, complete: {complete}");
    // The workers stop before the final reads, so the state the nodes must agree on is still.
    workers.shutdown().await;

    // ---- final reads
    final_reads(cluster, history).await;
    Ok(())
}

/// Reads every node's status until all agree (at most 20 s), then records each as a
/// `final-status` event (`info` for a node that did not answer).
async fn final_reads(cluster: &Cluster, history: &History) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let ids: Vec<u64> = cluster.ids().collect();
    loop {
        let views = futures::future::join_all(ids.iter().map(|&id| cluster.status(id))).await;
        let same = views.iter().all(|v| v.is_ok())
            && views.windows(2).all(|w| match (&w[0], &w[1]) {
                (Ok(a), Ok(b)) => {
                    a["applied_index"] == b["applied_index"]
                        && a["iterations"] == b["iterations"]
                        && a["workers"] == b["workers"]
                }
                _ => false,
            });
        if same || Instant::now() >= deadline {
            for (id, view) in ids.iter().zip(views) {
                match view {
                    Ok(status) => history.record(
                        "harness",
                        Kind::Ok,
                        "final-status",
                        json!({"node": id, "status": status}),
                    ),
                    Err(e) => history.record(
                        "harness",
                        Kind::Info,
                        "final-status",
                        json!({"node": id, "error": format!("{e:#}")}),
                    ),
                }
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
