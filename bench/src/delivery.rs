//! `delivery`: exactly once against at most once, on the same build and in one run.
//!
//! Throughput: `distributed_epoch` epochs of the tiny (`range(n)`), batched
//! (`range(20 n).batch(1024)`) and 1 MiB (`from_slices` of 8 rows of 1 MiB, repeated)
//! workloads, on a three-replica quorum with two workers,
//! each delivery in turn for three rounds (each going first in every other round): the median
//! rate of each, and exactly once's as a share of at most once's (`delivery_<workload>_ratio`).
//! Each epoch prints a line: its rate, its first element, and its last element's wait for the
//! end.
//!
//! A worker killed: an epoch of `range(n)` read by one reader while a worker is SIGKILLed a
//! third of the way through, with each delivery: the elements missing and repeated
//! (`delivery_kill_missing_exactly_once` must be 0, as must the repeats), and how long the epoch
//! took (the dispatchers remove a silent worker after 2 s here).

use crate::cluster::Cluster;
use crate::epoch::{measured, uncompressed, Count, Input};
use crate::report::{median, Report};
use sluice_client::{
    Compression, Delivery, DispatcherClient, DispatcherClientExt, DistributeOptions,
    RegisterOptions,
};
use sluice_element::Tensor;
use sluice_pipeline::{Dataset, Transform};
use sluice_testkit::Credentials;
use sluice_types::ShardingPolicy;
use std::path::Path;
use std::time::Instant;

const ROUNDS: usize = 3;

/// Float32 values of a 1 MiB element.
const LARGE_FLOATS: usize = 262_144;
/// Rows of the 1 MiB workload's source, each a split, per repetition: a definition of 8 MiB,
/// below the dispatchers' default `--max-definition-size`, registered once. With one row,
/// every element was a repetition of its own, and the epoch measured how fast workers move from
/// one repetition's splits to the next (a Raft commit each), not how elements of 1 MiB are
/// delivered.
const LARGE_ROWS: u64 = 8;

fn with(delivery: Delivery, options: DistributeOptions) -> DistributeOptions {
    DistributeOptions {
        delivery,
        ..options
    }
}

/// One workload: its dataset, how it is read and counted, its unit.
struct Workload {
    key: &'static str,
    dataset: Dataset,
    /// Registered once, before its epochs, which read it by id: a definition of megabytes is
    /// not staged through the Raft log again for every epoch.
    register_once: bool,
    outstanding: u32,
    count: Count,
    total: u64,
    unit: &'static str,
}

pub(crate) async fn run(
    sluice: &Path,
    n: u64,
    large_mib: u64,
    creds: Option<&Credentials>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let cluster = Cluster::start_with(sluice, 3, 2, creds, &["--worker-timeout", "2s"])?;
    let client = cluster.client()?;
    crate::epoch::warm_up(&client, ShardingPolicy::Dynamic).await?;
    let floats = vec![0.5f32; LARGE_ROWS as usize * LARGE_FLOATS];
    let workloads = [
        Workload {
            key: "tiny",
            dataset: Dataset::range(n as i64),
            register_once: false,
            outstanding: 4096,
            count: Count::Elements,
            total: n,
            unit: "elements/s",
        },
        Workload {
            key: "batched",
            dataset: Dataset::range((20 * n) as i64).batch(1024),
            register_once: false,
            outstanding: 64,
            count: Count::Rows,
            total: 20 * n,
            unit: "elements/s",
        },
        Workload {
            key: "large",
            dataset: Dataset::from_slices(Tensor::from_f32s(
                vec![LARGE_ROWS as usize, LARGE_FLOATS],
                &floats,
            )?)
            .repeat(large_mib.div_ceil(LARGE_ROWS)),
            register_once: true,
            outstanding: 16,
            count: Count::Bytes,
            total: large_mib.div_ceil(LARGE_ROWS) * LARGE_ROWS,
            unit: "MiB/s",
        },
    ];
    for workload in &workloads {
        let registered = match workload.register_once {
            true => Some(
                client
                    .register_dataset(
                        &workload.dataset,
                        &RegisterOptions {
                            compression: Compression::None,
                            ..RegisterOptions::default()
                        },
                    )
                    .await?,
            ),
            false => None,
        };
        let input = match &registered {
            Some(id) => Input::Registered(id),
            None => Input::Dataset(&workload.dataset),
        };
        let mut rates = [Vec::new(), Vec::new()];
        for round in 1..=ROUNDS {
            let mut order = [(0, Delivery::ExactlyOnce), (1, Delivery::AtMostOnce)];
            // Each goes first in every other round: on a machine whose load drifts during a
            // run, the one always second would always get the drift (an epoch of the batched
            // workload is half a minute here).
            if round % 2 == 0 {
                order.reverse();
            }
            for (i, delivery) in order {
                let epoch = measured(
                    &client,
                    input,
                    ShardingPolicy::Dynamic,
                    with(delivery, uncompressed(workload.outstanding)),
                    workload.count,
                    workload.total,
                    &format!("{} {delivery} ({round}/{ROUNDS})", workload.key),
                )
                .await?;
                let amount = match workload.count {
                    Count::Bytes => epoch.bytes as f64 / (1024.0 * 1024.0),
                    _ => epoch.elements as f64,
                };
                rates[i].push(amount / epoch.seconds);
                println!(
                    "delivery round {round}: {:<8} {:<14} {:>14.1} {} in {:.2} s (first element \
                     {:.1} ms, last element to end {:.1} ms)",
                    workload.key,
                    delivery.name(),
                    amount / epoch.seconds,
                    workload.unit,
                    epoch.seconds,
                    epoch.first_element.as_secs_f64() * 1e3,
                    epoch.end_of_epoch.as_secs_f64() * 1e3,
                );
            }
        }
        let exactly = median(&mut rates[0]);
        let at_most = median(&mut rates[1]);
        report.put(
            &format!("delivery_{}_exactly_once", workload.key),
            exactly,
            workload.unit,
        );
        report.put(
            &format!("delivery_{}_at_most_once", workload.key),
            at_most,
            workload.unit,
        );
        report.put_ratio(
            &format!("delivery_{}_ratio", workload.key),
            exactly / at_most,
        );
    }
    drop(cluster);
    for delivery in [Delivery::ExactlyOnce, Delivery::AtMostOnce] {
        let mut cluster = Cluster::start_with(sluice, 3, 2, creds, &["--worker-timeout", "2s"])?;
        let client = cluster.client()?;
        let (missing, repeated, seconds) =
            epoch_with_a_worker_killed(&mut cluster, &client, n, delivery).await?;
        report.put(
            &format!("delivery_kill_missing_{}", delivery.name()),
            missing as f64,
            "elements",
        );
        report.put(
            &format!("delivery_kill_repeated_{}", delivery.name()),
            repeated as f64,
            "elements",
        );
        report.put(
            &format!("delivery_kill_epoch_s_{}", delivery.name()),
            seconds,
            "s",
        );
    }
    Ok(())
}

/// Reads `range(n)` under `delivery`, SIGKILLing the first worker a third of the way: the
/// elements missing, those repeated, and the epoch's seconds.
async fn epoch_with_a_worker_killed(
    cluster: &mut Cluster,
    client: &DispatcherClient,
    n: u64,
    delivery: Delivery,
) -> anyhow::Result<(u64, u64, f64)> {
    let started = Instant::now();
    // Few elements in flight, so the killed worker holds many of the epoch's splits.
    let options = with(delivery, uncompressed(64));
    let service = client
        .distribute(&Dataset::range(n as i64), ShardingPolicy::Dynamic, options)
        .await?;
    let mut epoch = service.iter().await?;
    let mut seen = vec![0u8; n as usize];
    let mut read = 0u64;
    while let Some(element) = epoch.next().await {
        let value = element?
            .as_i64()
            .ok_or_else(|| anyhow::anyhow!("range elements are int64 scalars"))?;
        let slot = seen
            .get_mut(value as usize)
            .ok_or_else(|| anyhow::anyhow!("value {value} is outside range({n})"))?;
        *slot = slot.saturating_add(1);
        read += 1;
        if read == n / 3 {
            cluster.workers[0].kill();
        }
    }
    let missing = seen.iter().filter(|c| **c == 0).count() as u64;
    let repeated = seen.iter().map(|c| u64::from(c.saturating_sub(1))).sum();
    Ok((missing, repeated, started.elapsed().as_secs_f64()))
}
