//! `sluice bench`: measures the service's throughput and latencies on loopback, in one run.
//!
//! Dispatchers and workers run as child processes of this same binary (as tf.data service's
//! figures were taken: dispatcher, worker and client in separate processes); the client runs
//! here. Each workload prints one row; `--json` adds one JSON object on the last line with the
//! keys the benchmark history in BENCHMARKS.md uses. Throughputs are elements (or MiB) per second of wall time over a whole epoch.

use crate::cli::BenchArgs;
use crate::process::SluiceProcess;
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Map, Value};
use sluice_client::{DispatcherClient, DispatcherClientExt, DistributeOptions, ShardingPolicy};
use sluice_dataset::{Dataset, ExecOptions, Tensor, Transform};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const STARTUP: Duration = Duration::from_secs(30);
/// Children log errors only: the failover workload kills a leader on purpose.
const CHILD_LOG: &str = "error,openraft=off";

/// A dispatcher quorum and workers as child processes.
struct Cluster {
    _dir: tempfile::TempDir,
    dispatchers: Vec<SluiceProcess>,
    workers: Vec<SluiceProcess>,
    addrs: String,
}

fn free_addrs(n: usize) -> anyhow::Result<Vec<String>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.to_string()))
        .collect::<Result<Vec<_>, _>>()?)
}

impl Cluster {
    fn start(bin: &Path, dispatchers: usize, workers: usize) -> anyhow::Result<Cluster> {
        let dir = tempfile::tempdir()?;
        let addrs = free_addrs(dispatchers)?;
        let peers: Vec<String> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        let peers = peers.join(",");
        let mut procs = Vec::new();
        for id in 1..=dispatchers {
            let data = dir.path().join(format!("n{id}"));
            let args = [
                "--log",
                CHILD_LOG,
                "dispatcher",
                "--id",
                &id.to_string(),
                "--data-dir",
                data.to_str().context("utf-8 path")?,
                "--peers",
                &peers,
            ]
            .map(str::to_string);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            procs.push(SluiceProcess::spawn(bin, &args, STARTUP)?);
        }
        let all = addrs.join(",");
        let workers = (0..workers)
            .map(|_| {
                SluiceProcess::spawn(
                    bin,
                    &[
                        "--log",
                        CHILD_LOG,
                        "worker",
                        "--dispatcher",
                        &all,
                        "--listen",
                        "127.0.0.1:0",
                    ],
                    STARTUP,
                )
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Cluster {
            _dir: dir,
            dispatchers: procs,
            workers,
            addrs: all,
        })
    }

    fn client(&self) -> anyhow::Result<DispatcherClient> {
        Ok(DispatcherClient::new(&self.addrs)?)
    }

    /// The id of the replica that leads (highest term among those claiming it).
    async fn leader(&self) -> anyhow::Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut best: Option<(u64, usize)> = None;
            for (i, addr) in self.addrs.split(',').enumerate() {
                let retry = sluice_client::RetryConfig {
                    retry_timeout: Duration::from_millis(300),
                    ..Default::default()
                };
                let client = DispatcherClient::with_retry(addr, retry)?;
                if let Ok(status) = client.get_status().await {
                    let v: Value = serde_json::from_str(&status)?;
                    let term = v["term"].as_u64().unwrap_or(0);
                    if v["state"] == "Leader" && best.is_none_or(|(t, _)| term > t) {
                        best = Some((term, i));
                    }
                }
            }
            if let Some((_, i)) = best {
                return Ok(i);
            }
            if Instant::now() > deadline {
                bail!("no leader within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Resident set size of a process, in MiB (Linux `/proc`).
fn rss_mib(pid: &str) -> anyhow::Result<f64> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).context("read /proc status")?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS in /proc status")?;
    Ok(kib / 1024.0)
}

/// What an epoch's reader counts of each element: no more than the workload reports, so the
/// tiny workloads' reader does what the local executor's loop does (count).
#[derive(Clone, Copy)]
enum Count {
    Elements,
    /// Rows of batched elements (their first dimension), as `elements`.
    Rows,
    /// Elements, and their bytes.
    Bytes,
}

/// What one epoch measured.
struct Epoch {
    elements: u64,
    /// Counted only with `Count::Bytes`.
    bytes: u64,
    seconds: f64,
    first_element: Duration,
    /// From the last element to the end of input.
    end_of_epoch: Duration,
}

async fn read_epoch(
    client: &DispatcherClient,
    dataset: &Dataset,
    mode: ShardingPolicy,
    options: DistributeOptions,
    count: Count,
    mut on_element: impl FnMut(u64),
) -> anyhow::Result<Epoch> {
    let started = Instant::now();
    let service = client.distribute(dataset, mode, options).await?;
    let mut epoch = service.iter().await?;
    let (mut elements, mut bytes) = (0u64, 0u64);
    let mut first_element = None;
    let mut last = Instant::now();
    let end_of_epoch;
    loop {
        let next = epoch.next().await;
        // The clock is read for the first elements and then every 64th: a read per element was
        // a measurable share of the tiny workloads' CPU. The latency epochs are short enough to
        // be timed element by element.
        let timed = elements < 4096 || elements.is_multiple_of(64);
        let now = if timed || next.is_none() {
            Instant::now()
        } else {
            last
        };
        // Looked at where `next` put it: moving a 64-byte element out of the `Option` and the
        // `Result` costs more than reading a tiny one (store-forwarding stalls).
        let element = match next {
            Some(Ok(ref element)) => element,
            Some(Err(e)) => return Err(e.into()),
            None => {
                end_of_epoch = now - last;
                break;
            }
        };
        first_element.get_or_insert_with(|| now - started);
        last = now;
        match count {
            Count::Elements => elements += 1,
            Count::Rows => elements += rows(element),
            Count::Bytes => {
                elements += 1;
                bytes += element.byte_size() as u64;
            }
        }
        if timed {
            on_element(elements);
        }
    }
    Ok(Epoch {
        elements,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        first_element: first_element.unwrap_or_default(),
        end_of_epoch,
    })
}

/// Rows of a batched element (its first dimension), 1 for a scalar.
fn rows(element: &sluice_dataset::Element) -> u64 {
    match element {
        sluice_dataset::Element::Tensor(t) => t.shape().first().copied().unwrap_or(1) as u64,
        _ => 1,
    }
}

/// One small epoch, so registration, channels and worker tasks are warm before a measurement.
async fn warm_up(client: &DispatcherClient, mode: ShardingPolicy) -> anyhow::Result<()> {
    read_epoch(
        client,
        &Dataset::range(1000),
        mode,
        options(1024),
        Count::Elements,
        |_| {},
    )
    .await
    .map(|_| ())
}

/// An epoch read with a progress bar of `total` elements.
async fn measured(
    client: &DispatcherClient,
    dataset: &Dataset,
    mode: ShardingPolicy,
    options: DistributeOptions,
    count: Count,
    total: u64,
    label: &str,
) -> anyhow::Result<Epoch> {
    let bar = progress(total, label);
    let epoch = read_epoch(client, dataset, mode, options, count, |e| {
        bar.set_position(e)
    })
    .await;
    bar.finish_and_clear();
    epoch
}

fn progress(total: u64, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg:>24} {bar:30.cyan/blue} {pos:>9}/{len:9} {per_sec:>14}")
            .expect("a valid progress template"),
    );
    bar.set_message(label.to_string());
    bar
}

/// `max_outstanding_requests` of the tiny workloads: 65,536 int64 scalars are 768 KiB on the
/// wire. Credits are counted in elements, and with fewer, a fast stream's messages get smaller
/// (4,096 credits: about 2,500 elements a message), which costs about a fifth of the throughput
/// in per-message work and stalls waiting for credits.
const TINY_OUTSTANDING: u32 = 65_536;

/// Epochs read for each tiny row (the local executor's too); the row is their median, as the
/// issue's tf.data figures are medians of 5. An epoch is about half a second, which a busy
/// neighbour on a shared machine moves by a fifth.
const TINY_EPOCHS: usize = 5;

fn tiny_unit() -> String {
    format!("elements/s (median of {TINY_EPOCHS} epochs)")
}

/// The median rate of `TINY_EPOCHS` epochs of `range(n)` (each a new job) read from `workers`
/// workers, each of which produces the whole range (no sharding).
async fn tiny_rate(
    client: &DispatcherClient,
    n: u64,
    workers: u64,
    label: &str,
) -> anyhow::Result<f64> {
    let mut rates = Vec::new();
    for epoch in 1..=TINY_EPOCHS {
        let epoch = measured(
            client,
            &Dataset::range(n as i64),
            ShardingPolicy::Off,
            uncompressed(TINY_OUTSTANDING),
            Count::Elements,
            workers * n,
            &format!("{label} ({epoch}/{TINY_EPOCHS})"),
        )
        .await?;
        rates.push(epoch.elements as f64 / epoch.seconds);
    }
    Ok(median(&mut rates))
}

fn options(outstanding: u32) -> DistributeOptions {
    DistributeOptions {
        max_outstanding_requests: Some(outstanding),
        ..DistributeOptions::default()
    }
}

fn uncompressed(outstanding: u32) -> DistributeOptions {
    DistributeOptions {
        compression: sluice_client::Compression::None,
        ..options(outstanding)
    }
}

/// The workloads `--only` can name, in the order they run.
const WORKLOADS: [&str; 8] = [
    "local", "tiny2w", "tiny1w", "batched", "large", "latency", "dynamic", "failover",
];

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(unknown) = args.only.iter().find(|w| !WORKLOADS.contains(&w.as_str())) {
        bail!(
            "unknown workload '{unknown}'; expected one of {}",
            WORKLOADS.join(", ")
        );
    }
    let want = |name: &str| args.only.is_empty() || args.only.iter().any(|w| w == name);
    let bin: PathBuf = std::env::current_exe().context("locate the sluice binary")?;
    let n = args.elements;
    let mut results = Map::new();
    let mut put = |key: &str, value: f64, unit: &str| {
        println!("{key:<24} {value:>14.1} {unit}");
        results.insert(key.to_string(), json!((value * 10.0).round() / 10.0));
    };

    if want("local") {
        // The local executor alone: the ceiling for the service.
        let mut rates = Vec::new();
        for _ in 0..TINY_EPOCHS {
            let started = Instant::now();
            let mut local = 0u64;
            let dataset = Dataset::range(n as i64);
            for element in sluice_dataset::iterate(dataset.def(), &ExecOptions::default())? {
                element?;
                local += 1;
            }
            rates.push(local as f64 / started.elapsed().as_secs_f64());
        }
        put("tiny_local_eps", median(&mut rates), &tiny_unit());
    }

    if want("tiny2w") {
        let cluster = Cluster::start(&bin, 1, 2)?;
        let client = cluster.client()?;
        // Warm up: registration, channels, worker tasks.
        warm_up(&client, ShardingPolicy::Off).await?;

        let rate = tiny_rate(&client, n, 2, "tiny, 2 workers").await?;
        put("tiny_service_eps_2w", rate, &tiny_unit());
        results_rss(&mut put, &cluster)?;
    }
    if ["tiny1w", "batched", "large", "latency"]
        .iter()
        .any(|w| want(w))
    {
        let cluster = Cluster::start(&bin, 1, 1)?;
        let client = cluster.client()?;
        warm_up(&client, ShardingPolicy::Off).await?;

        if want("tiny1w") {
            let rate = tiny_rate(&client, n, 1, "tiny, 1 worker").await?;
            put("tiny_service_eps_1w", rate, &tiny_unit());
        }

        if want("batched") {
            let batched_n = n * 20;
            let dataset = Dataset::range(batched_n as i64).batch(1024);
            let epoch = measured(
                &client,
                &dataset,
                ShardingPolicy::Off,
                uncompressed(64),
                Count::Rows,
                batched_n,
                "batched, 1 worker",
            )
            .await?;
            put(
                "batched_service_eps_1w",
                epoch.elements as f64 / epoch.seconds,
                "elements/s",
            );
        }

        if want("large") {
            let large = args.large_mib;
            let floats = vec![0.5f32; 262_144];
            let dataset = Dataset::from_slices(Tensor::from_f32s(vec![1, floats.len()], &floats)?)
                .repeat(large);
            let epoch = measured(
                &client,
                &dataset,
                ShardingPolicy::Off,
                uncompressed(16),
                Count::Bytes,
                large,
                "1 MiB float32",
            )
            .await?;
            put(
                "large_mib_s",
                epoch.bytes as f64 / (1024.0 * 1024.0) / epoch.seconds,
                "MiB/s",
            );
        }

        if want("latency") {
            // Latencies of a fresh job: registration to first element, last element to end of
            // input.
            let mut first = Vec::new();
            let mut end = Vec::new();
            for i in 0..5 {
                let epoch = read_epoch(
                    &client,
                    &Dataset::range(100 + i),
                    ShardingPolicy::Dynamic,
                    options(64),
                    Count::Elements,
                    |_| {},
                )
                .await?;
                first.push(epoch.first_element.as_secs_f64() * 1000.0);
                end.push(epoch.end_of_epoch.as_secs_f64() * 1000.0);
            }
            put("first_element_ms", median(&mut first), "ms (median of 5)");
            put("end_of_epoch_ms", median(&mut end), "ms (median of 5)");
        }
    }
    if want("dynamic") || want("failover") {
        let mut cluster = Cluster::start(&bin, 3, 2)?;
        let client = cluster.client()?;
        warm_up(&client, ShardingPolicy::Dynamic).await?;
        if want("dynamic") {
            let epoch = measured(
                &client,
                &Dataset::range(n as i64),
                ShardingPolicy::Dynamic,
                uncompressed(4096),
                Count::Elements,
                n,
                "dynamic, 3-node quorum",
            )
            .await?;
            put(
                "dynamic_eps_quorum",
                epoch.elements as f64 / epoch.seconds,
                "elements/s",
            );
        }
        if want("failover") {
            failover(&mut cluster, &client, &mut put).await?;
        }
    }
    put("client_rss_mib", rss_mib("self")?, "MiB (this process)");
    if let Some(path) = &args.plot {
        let cluster = Cluster::start(&bin, 1, 1)?;
        let client = cluster.client()?;
        let points = sweep(&client).await?;
        std::fs::write(path, plot_svg(&points))
            .with_context(|| format!("write {}", path.display()))?;
        for (size, mib_s, eps) in &points {
            println!("sweep {size:>9} B/element {mib_s:>10.1} MiB/s {eps:>12.0} elements/s");
        }
    }
    if args.json {
        println!("{}", Value::Object(results));
    }
    Ok(())
}

/// Failover: read at a limited rate, SIGKILL the leader a second in; the longest stall.
async fn failover(
    cluster: &mut Cluster,
    client: &DispatcherClient,
    put: &mut impl FnMut(&str, f64, &str),
) -> anyhow::Result<()> {
    let leader = cluster.leader().await?;
    let total = 60_000u64;
    let service = client
        .distribute(
            &Dataset::range(total as i64),
            ShardingPolicy::Dynamic,
            options(64),
        )
        .await?;
    let mut stream = service.iter().await?;
    let started = Instant::now();
    let (mut received, mut longest) = (0u64, Duration::ZERO);
    let mut last = Instant::now();
    let mut killed = false;
    while let Some(element) = stream.next().await {
        element?;
        received += 1;
        longest = longest.max(last.elapsed());
        if !killed && started.elapsed() > Duration::from_secs(1) {
            cluster.dispatchers[leader].kill();
            killed = true;
        }
        // 20,000 elements/s: the reader needs the service to keep up, not to race it.
        let due = started + Duration::from_secs_f64(received as f64 / 20_000.0);
        if due > Instant::now() + Duration::from_millis(1) {
            tokio::time::sleep_until(due.into()).await;
        }
        last = Instant::now();
    }
    anyhow::ensure!(
        received == total,
        "failover epoch: {received} of {total} elements"
    );
    put(
        "failover_stall_ms",
        longest.as_secs_f64() * 1000.0,
        "ms (longest client stall, leader SIGKILLed)",
    );
    Ok(())
}

fn results_rss(put: &mut impl FnMut(&str, f64, &str), cluster: &Cluster) -> anyhow::Result<()> {
    let pid = cluster.workers[0].pid().context("worker pid")?;
    put(
        "worker_rss_mib",
        rss_mib(&pid.to_string())?,
        "MiB (a worker after the tiny epochs)",
    );
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// Throughput against element size (float32 tensors, one worker, no compression): for each size,
/// (bytes per element, MiB/s, elements/s), about 256 MiB per point.
async fn sweep(client: &DispatcherClient) -> anyhow::Result<Vec<(u64, f64, f64)>> {
    let mut points = Vec::new();
    for floats in [16usize, 256, 4096, 65_536, 262_144, 1_048_576] {
        let size = (floats * 4) as u64;
        let count = ((256u64 << 20) / size).clamp(64, 2_000_000);
        let values = vec![0.5f32; floats];
        let dataset =
            Dataset::from_slices(Tensor::from_f32s(vec![1, floats], &values)?).repeat(count);
        let outstanding = ((64u64 << 20) / size).clamp(4, 4096) as u32;
        let epoch = read_epoch(
            client,
            &dataset,
            ShardingPolicy::Off,
            uncompressed(outstanding),
            Count::Bytes,
            |_| {},
        )
        .await?;
        points.push((
            size,
            epoch.bytes as f64 / (1024.0 * 1024.0) / epoch.seconds,
            epoch.elements as f64 / epoch.seconds,
        ));
    }
    Ok(points)
}

/// A log-log SVG of MiB/s against element size.
fn plot_svg(points: &[(u64, f64, f64)]) -> String {
    let (w, h, left, bottom) = (640.0, 400.0, 70.0, 50.0);
    let x = |size: u64| left + ((size as f64).log10() - 1.0) / (7.0 - 1.0) * (w - left - 20.0);
    let y = |mib_s: f64| {
        h - bottom - (mib_s.max(0.1).log10() + 1.0) / (5.0 + 1.0) * (h - bottom - 20.0)
    };
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n\
         <rect width='100%' height='100%' fill='white'/>\n\
         <text x='{}' y='16' text-anchor='middle'>Sluice: throughput against element size (1 worker, loopback)</text>\n",
        w / 2.0
    );
    for exp in 1..=7 {
        let px = x(10u64.pow(exp));
        svg += &format!("<line x1='{px}' y1='20' x2='{px}' y2='{}' stroke='#ddd'/><text x='{px}' y='{}' text-anchor='middle'>1e{exp} B</text>\n", h - bottom, h - bottom + 16.0);
    }
    for exp in -1..=5 {
        let py = y(10f64.powi(exp));
        svg += &format!("<line x1='{left}' y1='{py}' x2='{}' y2='{py}' stroke='#ddd'/><text x='{}' y='{}' text-anchor='end'>1e{exp}</text>\n", w - 20.0, left - 6.0, py + 4.0);
    }
    svg += &format!(
        "<text x='{}' y='{}' text-anchor='middle'>bytes per element</text>\n",
        w / 2.0,
        h - 10.0
    );
    svg += &format!(
        "<text x='16' y='{}' transform='rotate(-90 16 {})' text-anchor='middle'>MiB/s</text>\n",
        h / 2.0,
        h / 2.0
    );
    let path: Vec<String> = points
        .iter()
        .map(|(size, mib_s, _)| format!("{:.1},{:.1}", x(*size), y(*mib_s)))
        .collect();
    svg += &format!(
        "<polyline fill='none' stroke='#1f77b4' stroke-width='2' points='{}'/>\n",
        path.join(" ")
    );
    for (size, mib_s, _) in points {
        svg += &format!("<circle cx='{:.1}' cy='{:.1}' r='4' fill='#1f77b4'><title>{size} B: {mib_s:.1} MiB/s</title></circle>\n", x(*size), y(*mib_s));
    }
    svg + "</svg>\n"
}
