//! A reader's connection to a live worker, cut mid-epoch again and again: the worker keeps what
//! the reader has not acknowledged and resends it when the reader reconnects, so the epoch is
//! complete, and the reader drops what it already has, so nothing arrives twice.

use crate::{assert_exactly_once, range_epoch, read_ints};
use sluice_client::ShardingPolicy;
use sluice_tests::cut_proxy::CutProxy;
use sluice_tests::wait_until;
use std::time::Duration;
use tracing::info;

const CUTS: usize = 20;
const DEADLINE: Duration = Duration::from_secs(15);

/// One worker, reached by the reader only through a proxy that cuts the connection `CUTS`
/// times while the epoch is read, and once more while its last elements travel (more than the
/// reader's 64 outstanding before the end: the worker may have taken the task's end by then,
/// and the reader may hear that the iteration finished before it reconnects; the rest still
/// comes).
async fn cut_mid_epoch(mode: ShardingPolicy) -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(1, 0).await?;
    let proxy = CutProxy::start().await?;
    let advertised = proxy.addr().to_string();
    cluster
        .add_worker_with(|config| {
            // Readers dial the proxy; the dispatcher hands them this address.
            config.advertise_address = Some(advertised);
            config.task_buffer = 256;
        })
        .await?;
    let worker = cluster.worker(0).expect("running").addr();
    proxy.forward_to(worker);

    let n = 20_000i64;
    let step = n as usize / (CUTS + 1);
    let mut epoch = range_epoch(&cluster, mode, n, 64).await?;
    let mut got = Vec::with_capacity(n as usize);
    for i in 0..CUTS {
        // The cut falls while the worker sends what the reader reads next: what was in flight
        // (the rest of a message, and what followed it) is lost on the way.
        proxy.cut_after(300);
        got.extend(tokio::time::timeout(DEADLINE, read_ints(&mut epoch, step)).await??);
        wait_until("the armed cut", DEADLINE, || async { proxy.cuts() > i }).await?;
        info!(
            cut = i,
            read = got.len(),
            "--- the reader's connection was cut"
        );
    }
    info!("--- once more as the last elements travel");
    let last = 100;
    let before_last = n as usize - last - got.len();
    got.extend(tokio::time::timeout(DEADLINE, read_ints(&mut epoch, before_last)).await??);
    proxy.cut_after(200);
    let rest = tokio::time::timeout(DEADLINE, epoch.collect()).await??;
    got.extend(rest.iter().map(|e| e.as_i64().expect("an integer")));
    assert_exactly_once(&got, n);
    assert_eq!(proxy.cuts(), CUTS + 1);
    assert!(
        proxy.opened() > CUTS,
        "the reader reconnected after every cut"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_cut_off_from_a_live_worker_20_times_reads_a_distributed_epoch_exactly_once(
) -> anyhow::Result<()> {
    cut_mid_epoch(ShardingPolicy::Dynamic).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_cut_off_from_a_live_worker_20_times_reads_a_parallel_epoch_exactly_once(
) -> anyhow::Result<()> {
    cut_mid_epoch(ShardingPolicy::Off).await
}
