//! The subcommands other than `demo`: each builds its config from the arguments and runs one
//! library component.

use crate::cli::{
    AdminCommand, CertsArgs, ClientSecurityArgs, DispatcherArgs, ReadArgs, RegisterArgs,
    StatusArgs, WorkerArgs,
};
use anyhow::{bail, Context};
use sluice_client::{
    Compression, CrossTrainerCache, Delivery, DispatcherClient, DispatcherClientExt,
    DistributeOptions, RegisterOptions, RetryConfig, ShardingPolicy,
};
use sluice_dispatcher::{DispatcherConfig, DispatcherHandle};
use sluice_pipeline::Transform;
use sluice_security::Role;
use sluice_worker::{LeaseEvent, LeaseObserver, PoolConfig, WorkerConfig, WorkerHandle};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Prints the one `READY <role> <address> [extra]` line tests and harnesses wait for; the third
/// field is always the address clients use (`extra` follows it: a dispatcher's
/// `peer=HOST:PORT`, then `metrics=HOST:PORT` on a node with a metrics listener).
fn ready(role: &str, addr: std::net::SocketAddr, extra: Option<String>) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match extra {
        Some(extra) => writeln!(stdout, "READY {role} {addr} {extra}")?,
        None => writeln!(stdout, "READY {role} {addr}")?,
    }
    stdout.flush()?;
    Ok(())
}

/// Runs one write to stdout. A closed stdout (the far end of a pipe has gone, as `head` does once
/// it has its lines) is not an error: the command stops quietly, as Unix tools do. Returns
/// whether stdout is still open.
fn still_open(written: std::io::Result<()>) -> anyhow::Result<bool> {
    match written {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(anyhow::Error::new(e).context("write to stdout")),
    }
}

/// Prints one result line (register, status, admin).
fn print_line(line: impl std::fmt::Display) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    still_open(writeln!(stdout, "{line}").and_then(|()| stdout.flush()))?;
    Ok(())
}

/// A token cancelled on SIGINT or SIGTERM.
fn stop_on_signal() -> CancellationToken {
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        token.cancel();
    });
    stop
}

pub async fn dispatcher(args: DispatcherArgs) -> anyhow::Result<()> {
    register_test_functions();
    let id = args.id.resolve()?;
    let peers = DispatcherConfig::parse_peers(&args.peers).map_err(anyhow::Error::msg)?;
    // With a peer list and no --peer-listen, take Raft traffic at this node's entry in it.
    let peer_listen = match (args.peer_listen, peers.get(&id)) {
        (Some(peer_listen), _) => peer_listen,
        (None, Some(peer_addr)) => peer_addr.clone(),
        (None, None) => DispatcherConfig::default().peer_listen,
    };
    let config = DispatcherConfig {
        id,
        listen: args.listen,
        peer_listen,
        advertise_address: args.advertise_address,
        data_dir: args.data_dir,
        cluster_id: args.cluster_id,
        init: args.init,
        peers,
        join: args.join,
        init_check_wait: args.init_check_wait,
        raft_routes: DispatcherConfig::parse_peers(&args.raft_routes)
            .map_err(anyhow::Error::msg)?,
        heartbeat_interval: args.heartbeat_interval,
        election_timeout: (args.election_timeout, args.election_timeout * 2),
        snapshot_logs_since_last: args.snapshot_every,
        worker_timeout: args.worker_timeout,
        client_timeout: args.client_timeout,
        job_gc_timeout: args.job_gc_timeout,
        gc_dynamic_jobs: args.gc_dynamic_jobs,
        dataset_gc_timeout: args.dataset_gc_timeout,
        worker_addresses: DispatcherConfig::parse_worker_addresses(&args.worker_addresses),
        security: args.security.load()?,
        data_roots: args.data_roots,
        object_store_config: args.object_store_config,
        max_definition_size: args.max_definition_size,
        max_blob_store_size: args.max_blob_store_size,
        blob_gc_grace: args.blob_gc_grace,
        max_pipeline_ops: args.pipeline_limits.max_pipeline_ops,
        max_pipeline_depth: args.pipeline_limits.max_pipeline_depth,
        metrics_listen: args.metrics_listen,
        ..DispatcherConfig::default()
    };
    let handle = DispatcherHandle::start(config).await?;
    let mut extra = format!("peer={}", handle.peer_addr());
    if let Some(metrics) = handle.metrics_addr() {
        extra.push_str(&format!(" metrics={metrics}"));
    }
    ready("dispatcher", handle.addr(), Some(extra))?;
    handle.run_until(stop_on_signal()).await?;
    Ok(())
}

/// What a worker's task thread calls when its pipeline has ended: mimalloc (this binary's
/// allocator) gives the pages it freed back to the OS. Without it, a worker whose task filled a
/// 1 GiB budget and failed stayed at 1 GiB resident; the allocator's own delayed purging, made
/// immediate for every free instead, cost large elements two thirds of their throughput.
fn release_freed_memory() {
    // SAFETY: mi_collect takes no pointers; `true` also purges what other threads freed.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    register_test_functions();
    let defaults = WorkerConfig::default();
    let config = WorkerConfig {
        dispatcher: args.dispatcher,
        listen: args.listen,
        tags: args.tags,
        advertise_address: args.advertise_address,
        cross_trainer_cache_size_bytes: args.cross_trainer_cache_size,
        memory_budget_bytes: args
            .memory_budget
            .unwrap_or_else(sluice_worker::config::default_memory_budget),
        memory_reserve_bytes: args.memory_reserve,
        release_memory: Some(release_freed_memory),
        data_roots: args.data_roots,
        object_store_config: args.object_store_config,
        compress_local_readers: args.compress_local_readers,
        share_memory_with_local_readers: !args.no_shared_memory,
        security: args.security.load()?,
        python: args.python.map(|python| {
            let mut pool = PoolConfig::with_cores(python);
            pool.executors = args.python_executors.unwrap_or(pool.executors);
            pool
        }),
        split_lease: args.split_lease.unwrap_or(defaults.split_lease),
        lease_observer: args.print_leases.then(lease_printer),
        metrics_listen: args.metrics_listen,
        max_pipeline_ops: args.pipeline_limits.max_pipeline_ops,
        max_pipeline_depth: args.pipeline_limits.max_pipeline_depth,
        state_dir: args.state_dir,
        ..defaults
    };
    let handle = WorkerHandle::start(config).await?;
    let extra = handle.metrics_addr().map(|m| format!("metrics={m}"));
    ready("worker", handle.addr(), extra)?;
    handle.run_until(stop_on_signal()).await;
    Ok(())
}

/// Debug builds only, and only with `SLUICE_TEST_ABORT_FUNCTION=1` in the environment: the map
/// function `abort_worker`, which aborts the process running it. The tests use it to crash a
/// worker from inside a task; no release build has it.
fn register_test_functions() {
    #[cfg(debug_assertions)]
    if std::env::var_os("SLUICE_TEST_ABORT_FUNCTION").is_some_and(|v| v == "1") {
        sluice_pipeline::FunctionRegistry::global().register_map(
            "abort_worker",
            Arc::new(|spec: &sluice_element::ElementSpec| Ok(spec.clone())),
            Arc::new(|_| std::process::abort()),
        );
    }
}

/// `--print-leases`: every split lease as one `LEASE <json>` line on stdout, written whole and
/// flushed, so a harness reading the pipe sees each lease before the worker can die after it.
fn lease_printer() -> LeaseObserver {
    LeaseObserver(Arc::new(|lease: LeaseEvent| {
        let line = serde_json::json!({
            "worker": lease.worker, "task": lease.task_id, "iteration": lease.iteration_id,
            "provider": lease.provider, "repetition": lease.repetition,
            "start": lease.start, "end": lease.end, "end_of_splits": lease.end_of_splits,
        });
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "LEASE {line}");
        let _ = stdout.flush();
    }))
}

fn distribute_options(
    job_name: Option<String>,
    max_outstanding_requests: Option<i64>,
    compression: &str,
) -> anyhow::Result<DistributeOptions> {
    let max_outstanding_requests = match max_outstanding_requests {
        None | Some(-1) => None,
        Some(k) if k > 0 && k <= i64::from(u32::MAX) => Some(k as u32),
        Some(_) => bail!("max_outstanding_requests must be positive or -1"),
    };
    Ok(DistributeOptions {
        job_name,
        max_outstanding_requests,
        compression: compression.parse::<Compression>()?,
        ..DistributeOptions::default()
    })
}

/// A client of `dispatcher` presenting `security` as `role`.
fn dispatcher_client(
    dispatcher: &str,
    retry: RetryConfig,
    security: &ClientSecurityArgs,
    role: Role,
) -> anyhow::Result<DispatcherClient> {
    Ok(DispatcherClient::connect(
        dispatcher,
        retry,
        security.load(role)?,
    )?)
}

pub async fn read(args: ReadArgs) -> anyhow::Result<()> {
    register_test_functions();
    let client = dispatcher_client(
        &args.dispatcher,
        RetryConfig::default(),
        &args.security,
        Role::Client,
    )?;
    let mode: ShardingPolicy = args.mode.parse()?;
    let mut options = distribute_options(
        args.job_name,
        args.max_outstanding_requests,
        &args.compression,
    )?;
    options.consumer_index = args.consumer_index;
    options.num_consumers = args.num_consumers;
    options.target_workers = args.target_workers.parse()?;
    options.delivery = args.delivery.parse()?;
    // Refused before reading, not at the first state: the dispatcher would refuse the state.
    if args.state_every.is_some() || args.resume.is_some() {
        if options.job_name.is_none() {
            bail!(
                "--state-every and --resume need a named job (--job-name): a resumed reader \
                 finds its epoch by the job's name"
            );
        }
        if options.delivery == Delivery::AtMostOnce {
            bail!(
                "--state-every and --resume need a job that delivers exactly once, and \
                 --delivery at-most-once was given"
            );
        }
    }
    if args.cross_trainer_cache || args.trainer_id.is_some() {
        // An empty trainer id is refused by `distribute`, with tf.data's message.
        let trainer_id = args.trainer_id.clone().unwrap_or_default();
        options.cross_trainer_cache = Some(CrossTrainerCache::new(trainer_id));
    }
    let mut service = match (&args.dataset, &args.dataset_id) {
        (Some(expr), _) => {
            let dataset = sluice_pipeline::parse(expr)?;
            client.distribute(&dataset, mode, options).await?
        }
        (None, Some(id)) => client.from_dataset_id(mode, id, options).await?,
        (None, None) => bail!("either --dataset or --dataset-id is required"),
    };
    if let Some(local) = &args.local {
        for op in sluice_pipeline::parse_ops(local)? {
            service = service.push_op(op);
        }
    }
    if let Some(path) = &args.resume {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the state in {}", path.display()))?;
        let state: sluice_client::ReaderState = serde_json::from_str(&text)
            .with_context(|| format!("the state in {} is not a reader state", path.display()))?;
        service.load_state(state)?;
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let started = tokio::time::Instant::now();
    let mut count = 0u64;
    'epochs: for _ in 0..args.epochs {
        let mut epoch = service.iter().await?;
        while let Some(element) = epoch.next().await {
            let element = element?;
            if !args.count && !still_open(writeln!(out, "{}", element.to_json()))? {
                return Ok(());
            }
            count += 1;
            if let (Some(every), Some(path)) = (args.state_every, &args.state_file) {
                if every > 0 && epoch.position().is_multiple_of(every) {
                    if !still_open(out.flush())? {
                        return Ok(());
                    }
                    let state = epoch.state().await?;
                    write_atomically(path, &serde_json::to_vec(&state)?)?;
                }
            }
            if args.take.is_some_and(|take| count >= take) {
                // The process exits next: the dispatcher is told this reader is gone now (a
                // dropped stream's release runs on the runtime, which does not outlive it), so
                // the job's iteration is not kept for it until its client times out.
                epoch.close(Duration::from_secs(2)).await;
                break 'epochs;
            }
            if let Some(rate) = args.rate.filter(|r| *r > 0.0) {
                // Pace in steps of at least a millisecond: a sleep (and flush) per element
                // would cap the rate below what was asked.
                let due = started + Duration::from_secs_f64(count as f64 / rate);
                if due > tokio::time::Instant::now() + Duration::from_millis(1) {
                    if !still_open(out.flush())? {
                        return Ok(());
                    }
                    tokio::time::sleep_until(due).await;
                }
            }
        }
    }
    if args.count {
        let written = writeln!(out, "{}", serde_json::json!({ "elements": count }));
        if !still_open(written)? {
            return Ok(());
        }
    }
    still_open(out.flush())?;
    Ok(())
}

/// Replaces `path` with `bytes`: written beside it, synced, then renamed over it, so a reader
/// killed meanwhile leaves the previous state whole.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)
        .with_context(|| format!("writing the state to {}", tmp.display()))?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("replacing the state in {}", path.display()))?;
    Ok(())
}

pub async fn register(args: RegisterArgs) -> anyhow::Result<()> {
    register_test_functions();
    let client = dispatcher_client(
        &args.dispatcher,
        RetryConfig::default(),
        &args.security,
        Role::Client,
    )?;
    let dataset = sluice_pipeline::parse(&args.dataset)?;
    let options = RegisterOptions {
        compression: args.compression.parse()?,
        dataset_id: args.dataset_id,
    };
    let id = client.register_dataset(&dataset, &options).await?;
    print_line(id)?;
    Ok(())
}

/// Asks every given replica for its status; prints the leader's view (or the first answer) with
/// each replica's own summary under `nodes`.
pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let mut views = Vec::new();
    for addr in args
        .dispatcher
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        let retry = RetryConfig {
            retry_timeout: Duration::from_secs(2),
            ..RetryConfig::default()
        };
        let client = dispatcher_client(addr, retry, &args.security, Role::Client)?;
        let view = client.get_status().await;
        views.push((addr.to_string(), view));
    }
    let mut nodes = Vec::new();
    let mut chosen: Option<serde_json::Value> = None;
    for (addr, view) in views {
        match view {
            Ok(response) => {
                let json: serde_json::Value =
                    serde_json::from_str(&response).context("status json")?;
                nodes.push(serde_json::json!({
                    "addr": addr, "node": json["node"], "state": json["state"], "term": json["term"],
                    "applied_index": json["applied_index"], "leader": json["leader"],
                }));
                // A restarted replica may still believe it leads an old term: the leader with
                // the highest term wins.
                let term = |v: &serde_json::Value| v["term"].as_u64().unwrap_or(0);
                let leads = |v: &serde_json::Value| v["state"] == "Leader";
                let better = match &chosen {
                    None => true,
                    Some(c) => leads(&json) && (!leads(c) || term(&json) > term(c)),
                };
                if better {
                    chosen = Some(json);
                }
            }
            Err(e) => nodes.push(serde_json::json!({"addr": addr, "error": e.to_string()})),
        }
    }
    let Some(mut status) = chosen else {
        bail!(
            "no dispatcher answered: {}",
            serde_json::Value::Array(nodes)
        );
    };
    status["nodes"] = serde_json::Value::Array(nodes);
    print_line(serde_json::to_string_pretty(&status)?)?;
    Ok(())
}

/// Membership changes; prints the voters afterwards as a JSON array.
pub async fn admin(command: AdminCommand) -> anyhow::Result<()> {
    let voters = match command {
        AdminCommand::AddNode(args) => {
            dispatcher_client(
                &args.dispatcher,
                RetryConfig::default(),
                &args.security,
                Role::Admin,
            )?
            .add_node_within(args.id, &args.peer_addr, Some(args.catch_up_timeout))
            .await?
        }
        AdminCommand::RemoveNode(args) => {
            dispatcher_client(
                &args.dispatcher,
                RetryConfig::default(),
                &args.security,
                Role::Admin,
            )?
            .remove_node_with(args.id, args.force)
            .await?
        }
    };
    print_line(serde_json::json!({ "voters": voters }))?;
    Ok(())
}

/// Writes a cluster's credentials; prints each file written.
pub fn certs(args: CertsArgs) -> anyhow::Result<()> {
    let written = sluice_security::certs::generate(&sluice_security::certs::CertsPlan {
        out: args.out,
        hosts: args.hosts,
        worker_hosts: args.worker_hosts,
        workers: args.workers,
        days: args.days,
    })?;
    for path in written {
        print_line(path.display())?;
    }
    Ok(())
}
