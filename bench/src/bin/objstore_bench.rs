//! `sluice-objstore-bench`: how fast a `distributed_epoch` reads TFRecord files from an
//! S3-compatible store, beside the same files on local disk, through a running service.
//!
//! It writes `--objects` TFRecord files of `--object-mib` MiB (records of `--record-kib` KiB) to
//! a temp dir and to two buckets of a local S3 server: moto's (`moto[server]` from PyPI; its
//! Python is `$SLUICE_MOTO_PYTHON`, else `python3`) or, with `--server s3s-fs`, the `s3s-fs`
//! crate's (its program is `$SLUICE_S3S_FS`, else `s3s-fs` on the PATH). It then
//! starts a dispatcher and a worker in this process (the worker's data roots are the temp dir
//! and both buckets) and reads every record of the files as one `distributed_epoch` each:
//!
//! - `local`: the files on local disk (just written, so from the page cache);
//! - `s3`: the objects through the S3 server on loopback;
//! - `s3+LATENCY`: the same through a proxy adding `--latency-ms` to every round trip (half each
//!   way) between the service and the store, as a store in another zone or region would;
//!
//! each as a user would write it: the files' splits handed out by the dispatcher and read one
//! file after another, the next few started ahead (`files(pattern).tfrecord()`), and the file names' splits read
//! `--parallel` files at a time (`files(pattern).names().interleave(TFRecordDataset,
//! cycle_length=N, num_parallel_calls=N)`). Each run prints a row (seconds, MiB/s, records/s);
//! the last lines are the ratios of the same run: `s3` against `local`, `s3+LATENCY` against
//! `s3`. The S3 servers are local programs, so the `s3` rows measure them as much as Sluice.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use sluice_client::{Compression, DispatcherClientExt, DistributeOptions, ShardingPolicy};
use sluice_element::{pb, Element};
use sluice_formats::tfrecord::TfRecordWriter;
use sluice_pipeline::{Dataset, Transform};
use sluice_testkit::{DelayProxy, LocalCluster, MotoServer, S3sFs};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Server {
    /// The `s3s-fs` crate's server (Rust, files on disk).
    S3sFs,
    /// moto's server (Python, in memory).
    Moto,
}

#[derive(Parser)]
#[command(
    about = "distributed_epoch throughput of TFRecord files from local disk and from an S3-compatible store"
)]
struct Args {
    /// Files (objects) to write and read.
    #[arg(long, default_value_t = 256)]
    objects: usize,
    /// Size of each file, MiB.
    #[arg(long, default_value_t = 4)]
    object_mib: usize,
    /// Size of each record, KiB.
    #[arg(long, default_value_t = 64)]
    record_kib: usize,
    /// Round-trip latency the proxy adds, milliseconds.
    #[arg(long, default_value_t = 20)]
    latency_ms: u64,
    /// Files read at a time by the interleaved epochs.
    #[arg(long, default_value_t = 16)]
    parallel: u64,
    /// The S3 server. moto by default: s3s-fs (0.14) streams a GET in 4 KiB reads of tokio's
    /// file, each on a blocking thread, and served loopback reads at a fifth of moto's rate.
    #[arg(long, value_enum, default_value_t = Server::Moto)]
    server: Server,
}

/// The running S3 server, kept until the end.
enum Store {
    S3sFs(S3sFs),
    Moto(MotoServer),
}

impl Store {
    fn start(server: Server) -> anyhow::Result<Store> {
        Ok(match server {
            Server::S3sFs => Store::S3sFs(S3sFs::start()?),
            Server::Moto => Store::Moto(MotoServer::start()?),
        })
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Store::S3sFs(s) => s.env(),
            Store::Moto(m) => m.env(),
        }
    }

    fn port(&self) -> u16 {
        match self {
            Store::S3sFs(s) => s.port(),
            Store::Moto(m) => m.port(),
        }
    }

    fn create_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        match self {
            Store::S3sFs(s) => s.create_bucket(bucket),
            Store::Moto(m) => m.create_bucket(bucket),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let records_per_file = (args.object_mib << 10) / args.record_kib.max(1);
    anyhow::ensure!(
        records_per_file > 0,
        "--record-kib must not exceed --object-mib"
    );
    let file = one_file(records_per_file, args.record_kib << 10)?;
    let mib = (args.objects * file.len()) as f64 / (1 << 20) as f64;
    println!(
        "{} files of {:.2} MiB ({} records of {} KiB each), {:.0} MiB in all",
        args.objects,
        file.len() as f64 / (1 << 20) as f64,
        records_per_file,
        args.record_kib,
        mib
    );

    let dir = tempfile::tempdir()?;
    for i in 0..args.objects {
        std::fs::write(dir.path().join(format!("part-{i:05}.tfrecord")), &file)?;
    }
    let local = dir.path().to_str().context("a UTF-8 temp dir")?.to_string();

    let store = Store::start(args.server)?;
    for (name, value) in store.env() {
        std::env::set_var(name, value);
    }
    // Two buckets with the same objects: a store's client is built once per bucket, from the
    // environment as it is then, so the second is reached through the proxy.
    let proxy = DelayProxy::start(
        ([127, 0, 0, 1], store.port()).into(),
        Duration::from_millis(args.latency_ms) / 2,
    )?;
    let started = Instant::now();
    for bucket in ["bench-direct", "bench-latency"] {
        store.create_bucket(bucket)?;
        if bucket == "bench-latency" {
            std::env::set_var("AWS_ENDPOINT", format!("http://{}", proxy.addr()));
        }
        for i in 0..args.objects {
            let url = format!("s3://{bucket}/data/part-{i:05}.tfrecord");
            sluice_formats::write_object(&url, file.clone())?;
        }
    }
    println!(
        "wrote {:.0} MiB to the S3 server in {:.1} s",
        2.0 * mib,
        started.elapsed().as_secs_f64()
    );

    let runtime = tokio::runtime::Runtime::new()?;
    let roots: Vec<PathBuf> = [
        local.as_str(),
        "s3://bench-direct/data",
        "s3://bench-latency/data",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let cluster = runtime.block_on(async {
        let dispatcher_roots = roots.clone();
        let mut cluster = LocalCluster::start_with(1, 0, move |config| {
            config.data_roots.extend(dispatcher_roots.iter().cloned())
        })
        .await?;
        cluster
            .add_worker_with(|config| config.data_roots.extend(roots))
            .await?;
        anyhow::Ok(cluster)
    })?;
    let client = cluster.client();

    println!(
        "{:<14} {:<30} {:>8} {:>9} {:>10}",
        "source", "distributed_epoch", "seconds", "MiB/s", "records/s"
    );
    let latency = format!("s3+{}ms", args.latency_ms);
    let parallel = format!("interleave, {} at a time", args.parallel);
    // MiB/s by (source, reading), for the ratios.
    let mut rates = Vec::new();
    for (source, root) in [
        ("local", local.as_str()),
        ("s3", "s3://bench-direct/data"),
        (latency.as_str(), "s3://bench-latency/data"),
    ] {
        let pattern = format!("{root}/*.tfrecord");
        let sequential = Dataset::files(&pattern).tfrecord();
        let interleaved = Dataset::files(&pattern).names().parallel_interleave(
            Dataset::element_tfrecord(pb::RecordCompression::None),
            args.parallel,
            1,
            args.parallel,
        );
        for (reading, dataset) in [
            ("one file at a time", sequential),
            (parallel.as_str(), interleaved),
        ] {
            let (records, bytes, seconds) = runtime.block_on(read_epoch(&client, &dataset))?;
            anyhow::ensure!(
                records == args.objects * records_per_file,
                "{source}, {reading}: read {records} records, not {}",
                args.objects * records_per_file
            );
            let rate = bytes as f64 / (1 << 20) as f64 / seconds;
            println!(
                "{:<14} {:<30} {:>8.2} {:>9.0} {:>10.0}",
                source,
                reading,
                seconds,
                rate,
                records as f64 / seconds
            );
            rates.push(rate);
        }
    }
    // rates: local (2), s3 (2), s3+latency (2), each sequential then interleaved.
    for (i, reading) in ["one file at a time", parallel.as_str()]
        .into_iter()
        .enumerate()
    {
        println!(
            "{reading}: s3/local {:.2}, {latency}/s3 {:.2}",
            rates[2 + i] / rates[i],
            rates[4 + i] / rates[2 + i]
        );
    }
    drop(cluster);
    Ok(())
}

/// A TFRecord file of `records` records of `size` bytes each.
fn one_file(records: usize, size: usize) -> anyhow::Result<Vec<u8>> {
    let mut writer = TfRecordWriter::new(Vec::new());
    let mut record = vec![0u8; size];
    for r in 0..records {
        record[..8].copy_from_slice(&(r as u64).to_le_bytes());
        writer.write_record(&record)?;
    }
    Ok(writer.into_inner()?)
}

/// Reads `dataset` as one `distributed_epoch` (uncompressed: the figures are of the reading,
/// not of snappy): records, their bytes, and the seconds taken (registration, which lists the
/// bucket, included).
async fn read_epoch(
    client: &sluice_client::DispatcherClient,
    dataset: &Dataset,
) -> anyhow::Result<(usize, usize, f64)> {
    let started = Instant::now();
    let options = DistributeOptions {
        compression: Compression::None,
        ..DistributeOptions::default()
    };
    let service = client
        .distribute(dataset, ShardingPolicy::Dynamic, options)
        .await?;
    let mut epoch = service.iter().await?;
    let (mut records, mut bytes) = (0, 0);
    while let Some(element) = epoch.next().await {
        let Element::Tensor(t) = element? else {
            anyhow::bail!("a record is a scalar string");
        };
        bytes += t.strings().map_or(0, |s| s.iter().map(|b| b.len()).sum());
        records += 1;
    }
    Ok((records, bytes, started.elapsed().as_secs_f64()))
}
