//! An epoch of an infinite dataset outlives its workers, as in tf.data: `range(1).repeat()` read
//! by five worker processes goes on while one of them lives, past the dispatcher's removal of the
//! others; with none left the reader waits (no end, no error) and goes on once a new worker
//! registers. Read through the Rust client, so that a wait shows as a pending element; in
//! distributed_epoch mode with either delivery guarantee.

use crate::{dispatcher, sluice, workers};
use sluice_client::{
    Delivery, DispatcherClient, DispatcherClientExt, DistributeOptions, ElementStream,
    ShardingPolicy,
};
use sluice_pipeline::{Dataset, Transform};
use sluice_tests::HANG;
use std::time::Duration;
use tokio::time::Instant;

/// The dispatcher's worker timeout: a stopped worker is removed (its tasks dropped) this long
/// after its last heartbeat.
const WORKER_TIMEOUT: Duration = Duration::from_secs(1);

#[test]
fn an_infinite_distributed_epoch_reads_on_while_a_worker_lives_and_waits_for_a_new_one() {
    outlives_its_workers(ShardingPolicy::Dynamic, Delivery::ExactlyOnce);
}

#[test]
fn at_most_once_an_infinite_distributed_epoch_reads_on_while_a_worker_lives_and_waits() {
    outlives_its_workers(ShardingPolicy::Dynamic, Delivery::AtMostOnce);
}

#[test]
fn an_infinite_parallel_epochs_read_reads_on_while_a_worker_lives_and_waits_for_a_new_one() {
    outlives_its_workers(ShardingPolicy::Off, Delivery::default());
}

fn outlives_its_workers(mode: ShardingPolicy, delivery: Delivery) {
    let data = tempfile::tempdir().expect("temp dir");
    let timeout = format!("{}ms", WORKER_TIMEOUT.as_millis());
    let dispatcher = dispatcher(data.path(), &["--worker-timeout", &timeout]);
    let addr = dispatcher.addr.clone();
    let mut workers = workers(&addr, 5);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let client = DispatcherClient::new(&addr).expect("a client");
        let dataset = Dataset::range(1).repeat_forever();
        let service = client
            .distribute(
                &dataset,
                mode,
                DistributeOptions {
                    delivery,
                    ..DistributeOptions::default()
                },
            )
            .await
            .expect("distribute");
        let mut epoch = service.iter().await.expect("an epoch");
        read_on(&mut epoch, 20, Duration::ZERO, "five workers").await;

        // Four workers stop: the reader reads on from the fifth, well past their removal.
        for worker in &mut workers[..4] {
            worker.kill();
        }
        let stopped = Instant::now();
        wait_for_workers(&addr, 1).await;
        read_on(
            &mut epoch,
            20,
            (WORKER_TIMEOUT * 3).saturating_sub(stopped.elapsed()),
            "one worker left",
        )
        .await;

        // The last one stops: once it is removed and what it sent is read, the reader waits.
        workers[4].kill();
        wait_for_workers(&addr, 0).await;
        let quiet = WORKER_TIMEOUT * 2;
        loop {
            match tokio::time::timeout(quiet, epoch.next()).await {
                Err(_) => break, // nothing for a while, and no end: it waits
                Ok(Some(element)) => assert_zero(element.expect("an element")),
                Ok(None) => panic!("{mode:?} {delivery:?}: the epoch ended with every worker gone"),
            }
        }

        // A new worker registers: the reader goes on with it.
        let _new = crate::workers(&addr, 1);
        read_on(&mut epoch, 20, Duration::ZERO, "a new worker").await;
        epoch.close(Duration::from_secs(5)).await;
    });
}

/// Reads at least `n` elements, and for at least `at_least`; fails if the epoch ends, fails, or
/// stalls for `HANG`.
async fn read_on(epoch: &mut ElementStream, n: usize, at_least: Duration, when: &str) {
    let start = Instant::now();
    let mut read = 0;
    while read < n || start.elapsed() < at_least {
        match tokio::time::timeout(HANG, epoch.next()).await {
            Ok(Some(element)) => assert_zero(element.expect("an element")),
            Ok(None) => panic!("{when}: the epoch ended after {read} elements"),
            Err(_) => panic!("{when}: no element for {HANG:?} after {read}"),
        }
        read += 1;
    }
}

fn assert_zero(element: sluice_element::Element) {
    assert_eq!(element.as_i64(), Some(0), "range(1) has only 0");
}

/// Waits until the dispatcher lists `n` workers (the others were removed).
async fn wait_for_workers(addr: &str, n: usize) {
    let addr = addr.to_string();
    tokio::task::spawn_blocking(move || {
        sluice_tests::wait_until_blocking(
            &format!("the dispatcher lists {n} workers"),
            WORKER_TIMEOUT + HANG,
            || {
                let (ok, out, _) = sluice(&["status", "--dispatcher", &addr]);
                let status: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
                ok && status["workers"].as_array().map(Vec::len) == Some(n)
            },
        )
    })
    .await
    .expect("the wait ran")
    .expect("the workers stopped were removed");
}
