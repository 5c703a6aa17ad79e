//! `sluice-blob-bench`: how long registering a large in-memory array takes, its data travelling
//! as a blob outside the Raft log (uploaded to the leader, which acknowledges once a majority of
//! the replicas hold it), and reading it back under `distributed_epoch`.
//!
//! For each size in `--sizes-mib` it starts a three-replica quorum and `--workers` workers in
//! this process (loopback, temp dirs), builds a `from_slices` array of that many MiB (float32
//! rows of `--row-kib` KiB, row `i` all `i`), and registers it with `distribute`: it prints the
//! registration's seconds and MiB/s, and whether the leader or its term changed meanwhile (a
//! change would mean the upload held up Raft's heartbeats). Then it reads the epoch, checking
//! every row arrives exactly once, and prints the read's seconds and MiB/s (the workers fetch
//! the blob from the dispatcher first).

use std::time::{Duration, Instant};

use clap::Parser;
use sluice_client::{DispatcherClientExt, DistributeOptions, ShardingPolicy};
use sluice_element::{DType, Tensor};
use sluice_pipeline::Dataset;
use sluice_testkit::LocalCluster;

#[derive(Parser)]
#[command(about = "Registration and read time of large in-memory arrays kept as blobs")]
struct Args {
    /// Array sizes to register, MiB, comma-separated.
    #[arg(long, default_value = "64,512,1024", value_delimiter = ',')]
    sizes_mib: Vec<usize>,
    /// Size of one row (element), KiB.
    #[arg(long, default_value_t = 1024)]
    row_kib: usize,
    /// Workers reading the epoch.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Register only; do not read the epoch.
    #[arg(long)]
    no_read: bool,
}

/// Every replica's (id, current leader, term).
fn views(cluster: &LocalCluster) -> Vec<(u64, Option<u64>, u64)> {
    (1..=3)
        .filter_map(|id| cluster.replica(id))
        .map(|replica| {
            let metrics = replica.raft().metrics().borrow().clone();
            (replica.id(), metrics.current_leader, metrics.current_term)
        })
        .collect()
}

fn array(mib: usize, row_bytes: usize) -> anyhow::Result<Tensor> {
    let per_row = (row_bytes / 4).max(1);
    let rows = ((mib << 20) / (per_row * 4)).max(1);
    let mut data = Vec::with_capacity(rows * per_row * 4);
    for i in 0..rows {
        let value = (i as f32).to_le_bytes();
        for _ in 0..per_row {
            data.extend_from_slice(&value);
        }
    }
    Ok(Tensor::from_raw(
        DType::Float32,
        vec![rows, per_row],
        data.into(),
    )?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!(
        "{:>8} {:>10} {:>9} {:>14} {:>8} {:>9}",
        "MiB", "register_s", "MiB/s", "leader/term", "read_s", "MiB/s"
    );
    for mib in args.sizes_mib {
        let tensor = array(mib, args.row_kib << 10)?;
        let rows = tensor.shape()[0];
        let cluster = LocalCluster::start(3, args.workers).await?;
        cluster.wait_for_leader(Duration::from_secs(30)).await?;
        let before = views(&cluster);
        let client = cluster.client();
        let dataset = Dataset::from_slices(tensor);
        let started = Instant::now();
        let service = client
            .distribute(
                &dataset,
                ShardingPolicy::Dynamic,
                DistributeOptions::default(),
            )
            .await?;
        let register = started.elapsed().as_secs_f64();
        let after = views(&cluster);
        let unchanged = if after == before {
            "unchanged"
        } else {
            "CHANGED"
        };
        let (read, read_rate) = if args.no_read {
            ("-".to_string(), "-".to_string())
        } else {
            let started = Instant::now();
            let mut epoch = service.iter().await?;
            let mut seen = vec![false; rows];
            while let Some(element) = epoch.next().await {
                let element = element?;
                let data = element
                    .as_tensor()
                    .and_then(|t| t.raw_data())
                    .ok_or_else(|| anyhow::anyhow!("a row is not a float32 tensor"))?;
                let i = f32::from_le_bytes(data[..4].try_into()?) as usize;
                anyhow::ensure!(i < rows && !seen[i], "row {i} twice or out of range");
                seen[i] = true;
            }
            anyhow::ensure!(seen.iter().all(|s| *s), "rows missing");
            let took = started.elapsed().as_secs_f64();
            (format!("{took:.2}"), format!("{:.0}", mib as f64 / took))
        };
        println!(
            "{:>8} {:>10.2} {:>9.0} {:>14} {:>8} {:>9}",
            mib,
            register,
            mib as f64 / register,
            unchanged,
            read,
            read_rate
        );
        drop(service);
        drop(dataset);
        cluster.shutdown().await;
    }
    Ok(())
}
