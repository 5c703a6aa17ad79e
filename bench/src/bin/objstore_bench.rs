//! `sluice-objstore-bench`: how fast TFRecord files read from an S3-compatible store, beside the
//! same files on local disk, in this process's executor (the reading a worker does for a files
//! source, without the service around it).
//!
//! It writes `--objects` TFRecord files of `--object-mib` MiB (records of `--record-kib` KiB) to
//! a temp dir and to a bucket of moto's S3 server (`moto[server]` from PyPI; its Python is
//! `$SLUICE_MOTO_PYTHON`, else `python3`), then reads every record of them:
//!
//! - `local`: the files on local disk (just written, so from the page cache);
//! - `s3`: the objects through moto on loopback;
//! - `s3+LATENCY`: the same through a proxy adding `--latency-ms` to every round trip (half each
//!   way), as a store in another zone or region would;
//!
//! each one file after another (`files(pattern).tfrecord()`) and with `--parallel` files at a
//! time (`interleave(element_tfrecord(), cycle_length=N, num_parallel_calls=N)` over the file
//! names). It prints one row per run: seconds, MiB/s and records/s. moto is a Python server, so
//! the `s3` rows measure it as much as Sluice: they bound what a real store's reads would cost.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use sluice_element::{pb, Element, Tensor};
use sluice_executor::ExecOptions;
use sluice_formats::tfrecord::TfRecordWriter;
use sluice_pipeline::{Dataset, Transform};
use sluice_testkit::{DelayProxy, MotoServer};

#[derive(Parser)]
#[command(
    about = "Read throughput of TFRecord files from local disk and from an S3-compatible store"
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
    /// Files read at a time by the interleaved runs.
    #[arg(long, default_value_t = 16)]
    parallel: u64,
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

    let moto = MotoServer::start()?;
    for (name, value) in moto.env() {
        std::env::set_var(name, value);
    }
    // Two buckets with the same objects: a store's client is built once per bucket, from the
    // environment as it is then, so the second is reached through the proxy.
    let proxy = DelayProxy::start(
        ([127, 0, 0, 1], moto.port()).into(),
        Duration::from_millis(args.latency_ms) / 2,
    )?;
    let started = Instant::now();
    for bucket in ["bench-direct", "bench-latency"] {
        moto.create_bucket(bucket)?;
        if bucket == "bench-latency" {
            std::env::set_var("AWS_ENDPOINT", format!("http://{}", proxy.addr()));
        }
        for i in 0..args.objects {
            let url = format!("s3://{bucket}/data/part-{i:05}.tfrecord");
            sluice_formats::write_object(&url, file.clone())?;
        }
    }
    println!(
        "wrote {:.0} MiB to moto in {:.1} s",
        2.0 * mib,
        started.elapsed().as_secs_f64()
    );

    println!(
        "{:<14} {:<26} {:>8} {:>9} {:>10}",
        "source", "reading", "seconds", "MiB/s", "records/s"
    );
    let latency = format!("s3+{}ms", args.latency_ms);
    for (source, root) in [
        ("local", local.as_str()),
        ("s3", "s3://bench-direct/data"),
        (latency.as_str(), "s3://bench-latency/data"),
    ] {
        let names: Vec<String> = (0..args.objects)
            .map(|i| format!("{root}/part-{i:05}.tfrecord"))
            .collect();
        let sequential = Dataset::files(&format!("{root}/*.tfrecord")).tfrecord();
        let interleaved = Dataset::from_slices(Tensor::from_strings(
            vec![names.len()],
            names.iter().map(|n| n.clone().into()).collect(),
        )?)
        .parallel_interleave(
            Dataset::element_tfrecord(pb::RecordCompression::None),
            args.parallel,
            1,
            args.parallel,
        );
        let parallel = format!("interleave, {} at a time", args.parallel);
        for (reading, dataset) in [
            ("one file at a time", sequential),
            (parallel.as_str(), interleaved),
        ] {
            let (records, bytes, seconds) = read_all(dataset)?;
            anyhow::ensure!(
                records == args.objects * records_per_file,
                "{source}, {reading}: read {records} records, not {}",
                args.objects * records_per_file
            );
            println!(
                "{:<14} {:<26} {:>8.2} {:>9.0} {:>10.0}",
                source,
                reading,
                seconds,
                bytes as f64 / (1 << 20) as f64 / seconds,
                records as f64 / seconds
            );
        }
    }
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

/// Reads `dataset` in this process: records, their bytes, and the seconds taken (the pattern's
/// expansion, which lists the bucket, included).
fn read_all(dataset: Dataset) -> anyhow::Result<(usize, usize, f64)> {
    let started = Instant::now();
    let def = dataset.into_def();
    let (mut records, mut bytes) = (0, 0);
    for element in sluice_executor::iterate(&def, &ExecOptions::default())? {
        let Element::Tensor(t) = element? else {
            anyhow::bail!("a record is a scalar string");
        };
        bytes += t.strings().map_or(0, |s| s.iter().map(|b| b.len()).sum());
        records += 1;
    }
    Ok((records, bytes, started.elapsed().as_secs_f64()))
}
