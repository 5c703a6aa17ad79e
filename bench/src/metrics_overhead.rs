//! `metrics`: what metrics cost. The same epoch (distributed_epoch over `range(n)`, so the
//! dispatcher leases splits and both workers serve) against two identical clusters, one with
//! `--metrics-listen` on every replica and worker and scraped every second, one without, in
//! interleaved rounds (the order alternates, so drift of the machine falls on both). Prints each
//! round, both medians and their ratio (`metrics_overhead_ratio`: on / off; 1.0 is no cost).

use crate::cluster::Cluster;
use crate::epoch::{measured, uncompressed, warm_up, Count};
use crate::report::{median, Report};
use anyhow::Context;
use sluice_client::{DispatcherClient, ShardingPolicy};
use sluice_pipeline::Dataset;
use sluice_testkit::SluiceProcess;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Rounds; each reads one epoch from each cluster.
const ROUNDS: usize = 5;
/// How often the scraper reads every node's `/metrics`, as a Prometheus would.
const SCRAPE_EVERY: Duration = Duration::from_secs(1);
const STARTUP: Duration = Duration::from_secs(30);
const METRICS_FLAG: [&str; 2] = ["--metrics-listen", "127.0.0.1:0"];

/// A three-replica quorum and two workers, with metrics listeners or without.
struct Side {
    cluster: Cluster,
    workers: Vec<SluiceProcess>,
    client: DispatcherClient,
}

impl Side {
    async fn start(sluice: &Path, metrics: bool) -> anyhow::Result<Side> {
        let flags: &[&str] = if metrics { &METRICS_FLAG } else { &[] };
        let cluster = Cluster::start_with(sluice, 3, 0, None, flags)?;
        let all = cluster
            .dispatchers
            .iter()
            .map(|d| d.addr.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let workers = (0..2)
            .map(|_| {
                let mut args = vec!["--log", "error", "worker", "--dispatcher", &all];
                args.extend(["--listen", "127.0.0.1:0"]);
                args.extend(flags);
                SluiceProcess::spawn(sluice, &args, STARTUP)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let client = cluster.client()?;
        warm_up(&client, ShardingPolicy::Dynamic).await?;
        Ok(Side {
            cluster,
            workers,
            client,
        })
    }

    fn metrics_addrs(&self) -> Vec<String> {
        self.cluster
            .dispatchers
            .iter()
            .chain(&self.workers)
            .filter_map(|p| p.metrics_addr.clone())
            .collect()
    }

    async fn epoch(&self, n: u64, label: &str) -> anyhow::Result<f64> {
        let epoch = measured(
            &self.client,
            &Dataset::range(n as i64),
            ShardingPolicy::Dynamic,
            uncompressed(4096),
            Count::Elements,
            n,
            label,
        )
        .await?;
        Ok(epoch.elements as f64 / epoch.seconds)
    }
}

/// One `GET /metrics`; the body's length (what a scraper reads).
async fn scrape(addr: &str) -> anyhow::Result<usize> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    anyhow::ensure!(
        response.starts_with(b"HTTP/1.1 200"),
        "GET /metrics from {addr}"
    );
    Ok(response.len())
}

/// Scrapes every address each `SCRAPE_EVERY` until aborted; counts failures in the log.
async fn scrape_forever(addrs: Vec<String>) {
    let mut tick = tokio::time::interval(SCRAPE_EVERY);
    loop {
        tick.tick().await;
        for addr in &addrs {
            if let Err(e) = scrape(addr).await {
                eprintln!("metrics bench: scrape failed: {e:#}");
            }
        }
    }
}

/// Runs the rounds and reports both throughputs and their ratio.
pub(crate) async fn run(sluice: &Path, n: u64, report: &mut Report) -> anyhow::Result<()> {
    let off = Side::start(sluice, false).await?;
    let on = Side::start(sluice, true).await?;
    let addrs = on.metrics_addrs();
    anyhow::ensure!(
        addrs.len() == 5,
        "every node of the metrics side names its listener"
    );
    let scraper = tokio::spawn(scrape_forever(addrs));
    let (mut off_eps, mut on_eps) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let on_first = round % 2 == 1;
        for metrics in [on_first, !on_first] {
            let (side, figures, label) = match metrics {
                true => (&on, &mut on_eps, "metrics on"),
                false => (&off, &mut off_eps, "metrics off"),
            };
            let eps = side.epoch(n, label).await?;
            println!("metrics round {round}: {label:<12} {eps:>14.1} elements/s");
            figures.push(eps);
        }
    }
    scraper.abort();
    let (off_median, on_median) = (median(&mut off_eps), median(&mut on_eps));
    report.put("metrics_off_eps", off_median, "elements/s (median)");
    report.put(
        "metrics_on_eps",
        on_median,
        "elements/s (median, scraped every second)",
    );
    report.put_ratio("metrics_overhead_ratio", on_median / off_median);
    Ok(())
}
