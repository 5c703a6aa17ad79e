//! `sluice demo`: the main job on a fresh machine.
//!
//! Starts a three-replica dispatcher quorum and two workers in this process (real gRPC on
//! loopback, TLS and tokens on every link, a temp data dir per replica), generates a TFRecord
//! data set, reads one distributed epoch of it at a limited rate, kills the leader mid-epoch,
//! and prints a summary:
//! elements, duplicates, missing, the longest stall the client saw, and the new leader. Then it
//! restarts the killed replica and waits until it has caught up. Exits non-zero if any record
//! was delivered twice or lost.

use crate::cli::DemoArgs;
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use sluice_client::{DispatcherClientExt, DistributeOptions, ShardingPolicy};
use sluice_formats::tfrecord::TfRecordWriter;
use sluice_pipeline::Dataset;
use sluice_testkit::LocalCluster;
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;

/// Writes `files` TFRecord files of `records` records `"<file>:<record>"` each.
fn generate(dir: &Path, files: u64, records: u64) -> anyhow::Result<()> {
    for f in 0..files {
        let path = dir.join(format!("part-{f:05}.tfrecord"));
        let mut writer =
            TfRecordWriter::create(&path).with_context(|| format!("create {}", path.display()))?;
        for r in 0..records {
            writer.write_record(format!("{f}:{r}").as_bytes())?;
        }
        writer.flush()?;
    }
    Ok(())
}

/// The `(file, record)` a demo record names.
fn parse_record(element: &sluice_element::Element, records: u64) -> anyhow::Result<u64> {
    let json = element.to_json();
    let text = json.as_str().context("a demo record is a string")?;
    let (f, r) = text
        .split_once(':')
        .context("a demo record is FILE:RECORD")?;
    Ok(f.parse::<u64>()? * records + r.parse::<u64>()?)
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.files == 0 || args.records == 0 {
        bail!("--files and --records must be positive");
    }
    let total = args.files * args.records;
    println!("Sluice demo: a three-replica dispatcher quorum, two workers, one distributed epoch");
    println!(
        "of {total} records in {} TFRecord files; the leader is killed mid-epoch.\n",
        args.files
    );

    // Secure as a production cluster is: TLS on every link (client API, Raft peer listeners,
    // workers' ports) and a token on every call, from certificates made as `sluice certs` does.
    let mut cluster = LocalCluster::start_secure(3, 2)
        .await
        .context("start the local cluster")?;
    // The replicas and workers read files only below their data root.
    let data = cluster.data_root().to_path_buf();
    generate(&data, args.files, args.records)?;
    let first_leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    println!(
        "quorum: {}   leader: replica {first_leader}",
        cluster.dispatcher_addrs()
    );
    println!(
        "workers: {}, {}",
        cluster.worker_addr(0),
        cluster.worker_addr(1)
    );
    println!("security: TLS on every link (Raft peers with mutual TLS), a token on every call\n");

    let pattern = format!("{}/*.tfrecord", data.display());
    let options = DistributeOptions {
        max_outstanding_requests: Some(64),
        ..DistributeOptions::default()
    };
    let service = cluster
        .client()
        .distribute(
            &Dataset::files(&pattern).tfrecord(),
            ShardingPolicy::Dynamic,
            options,
        )
        .await?;
    let mut epoch = service.iter().await?;

    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40.cyan/blue} {pos:>7}/{len:7} {per_sec:>12} {msg}")
            .expect("a valid progress template"),
    );
    let mut counts = vec![0u8; total as usize];
    let mut received = 0u64;
    let (mut longest_stall, mut stall_at) = (Duration::ZERO, 0u64);
    let kill_at = total * 2 / 5;
    let mut killed = None;
    let started = Instant::now();
    let mut last = Instant::now();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(60), epoch.next())
            .await
            .context("no element for 60 s")?;
        let Some(element) = next else { break };
        let index = parse_record(&element?, args.records)?;
        counts[index as usize] = counts[index as usize].saturating_add(1);
        received += 1;
        if last.elapsed() > longest_stall {
            (longest_stall, stall_at) = (last.elapsed(), received);
        }
        bar.inc(1);
        if received == kill_at {
            let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
            bar.set_message(format!("killed leader {leader}"));
            cluster.kill(leader).await?;
            killed = Some(leader);
        }
        if args.rate > 0.0 {
            tokio::time::sleep_until(
                started + Duration::from_secs_f64(received as f64 / args.rate),
            )
            .await;
        }
        last = Instant::now();
    }
    bar.finish();
    let elapsed = started.elapsed();
    let new_leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let duplicates = counts.iter().filter(|c| **c > 1).count();
    let missing = counts.iter().filter(|c| **c == 0).count();

    let caught_up = match killed {
        Some(node) => {
            cluster.restart(node).await?;
            let started = Instant::now();
            cluster
                .wait_caught_up(node, Duration::from_secs(30))
                .await?;
            format!(
                "replica {node} restarted and caught up in {} ms",
                started.elapsed().as_millis()
            )
        }
        None => "no replica was killed (the epoch ended first)".into(),
    };
    println!("\nsummary");
    println!(
        "  elements      {received} of {total} in {:.2} s ({:.0}/s)",
        elapsed.as_secs_f64(),
        received as f64 / elapsed.as_secs_f64()
    );
    println!("  duplicates    {duplicates}");
    println!("  missing       {missing}");
    println!(
        "  longest stall {} ms (before element {stall_at})",
        longest_stall.as_millis()
    );
    match killed {
        Some(node) => println!("  leader        replica {node} killed at element {kill_at}; new leader: replica {new_leader}"),
        None => println!("  leader        replica {new_leader}"),
    }
    println!("  recovery      {caught_up}");
    cluster.shutdown().await;
    if duplicates > 0 || missing > 0 {
        bail!("{duplicates} records delivered twice, {missing} missing");
    }
    Ok(())
}
