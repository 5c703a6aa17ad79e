//! The leaser against a fake dispatcher on real gRPC: prefetch, growth, and lost replies. The
//! pipeline thread's calls run on blocking threads, as a task's pipeline does.

use super::*;
use sluice_rpc::fake_dispatcher::{FakeDispatcher, GrantedLease};
use sluice_rpc::RetryConfig;
use std::sync::Arc;

/// Long enough for a loaded machine; the tests wait on conditions and finish when they hold.
const DEADLINE: Duration = Duration::from_secs(20);

fn leaser(dispatcher: &FakeDispatcher, lease: (u32, u32), target: Duration) -> Arc<SplitLeaser> {
    let client = DispatcherClient::with_retry(
        &dispatcher.addr(),
        RetryConfig {
            retry_timeout: DEADLINE,
            ..RetryConfig::default()
        },
    )
    .expect("a valid address");
    Arc::new(
        SplitLeaser::new(
            client,
            IterationId(2000),
            TaskId(4000),
            Handle::current(),
            lease,
            None,
        )
        .with_lease_target(target),
    )
}

/// The next `n` splits of provider 0, repetition 0, asked for as the pipeline thread does.
async fn take(leaser: &Arc<SplitLeaser>, n: usize) -> Vec<Option<u64>> {
    let leaser = leaser.clone();
    tokio::task::spawn_blocking(move || {
        (0..n)
            .map(|_| leaser.next_split(0, 0).expect("a split or the end"))
            .collect()
    })
    .await
    .expect("the pipeline thread")
}

/// Waits until the fake has granted `n` leases; returns them.
async fn granted(dispatcher: &FakeDispatcher, n: usize) -> Vec<GrantedLease> {
    let what = format!("{n} leases granted");
    sluice_testwait::wait_until(&what, DEADLINE, || dispatcher.granted().len() >= n)
        .await
        .unwrap();
    dispatcher.granted()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_lease_is_requested_before_the_current_one_is_used_up() {
    let dispatcher = FakeDispatcher::leader(100).await;
    let leaser = leaser(&dispatcher, (4, 4), LEASE_TARGET);

    assert_eq!(take(&leaser, 1).await, vec![Some(0)]);
    // One split of [0, 4) used, and [4, 8) is already leased.
    let leases = granted(&dispatcher, 2).await;
    assert_eq!(
        leases.iter().map(|l| (l.start, l.end)).collect::<Vec<_>>(),
        vec![(0, 4), (4, 8)]
    );

    // The rest of the lease asks for nothing: a lease is requested only when one is installed.
    assert_eq!(take(&leaser, 3).await, vec![Some(1), Some(2), Some(3)]);
    assert_eq!(dispatcher.granted().len(), 2);

    // Taking the prefetched lease sends the next prefetch.
    assert_eq!(take(&leaser, 1).await, vec![Some(4)]);
    let leases = granted(&dispatcher, 3).await;
    assert_eq!((leases[2].start, leases[2].end), (8, 12));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_kept_ahead_waits_for_company_half_as_long_as_the_lease_before_lasted() {
    let dispatcher = FakeDispatcher::leader(100).await;
    let leaser = leaser(&dispatcher, (1, 1), LEASE_TARGET);
    assert_eq!(take(&leaser, 1).await, vec![Some(0)]);
    granted(&dispatcher, 2).await;

    // The pipeline works 400 ms on split 0 (the lease [0, 1)), then takes split 1: the lease
    // [1, 2) is installed and [2, 3) asked for ahead, with slack of half the 400 ms.
    let worked = Duration::from_millis(400);
    tokio::time::sleep(worked).await;
    let installed = Instant::now();
    assert_eq!(take(&leaser, 1).await, vec![Some(1)]);
    let leases = granted(&dispatcher, 3).await;

    assert_eq!((leases[2].start, leases[2].end), (2, 3));
    assert!(
        installed.elapsed() >= lease_slack(worked),
        "the lease ahead went alone before its slack had passed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_double_while_they_go_fast_up_to_the_largest_size() {
    // (lease target, sizes of the first five requests): a lease that always lasts less than
    // the target doubles the next up to the largest; one that never does keeps the first size.
    let cases = [
        (Duration::from_secs(3600), vec![1, 2, 4, 8, 8]),
        (Duration::ZERO, vec![1, 1, 1, 1, 1]),
    ];
    for (target, sizes) in cases {
        let dispatcher = FakeDispatcher::leader(1000).await;
        let leaser = leaser(&dispatcher, (1, 8), target);
        // Enough splits to install four leases whatever their sizes; the fifth is prefetched.
        let used: usize = sizes[..4].iter().sum::<u32>() as usize;
        let splits = take(&leaser, used).await;
        assert_eq!(
            splits,
            (0..used as u64).map(Some).collect::<Vec<_>>(),
            "{target:?}"
        );
        let leases = granted(&dispatcher, 5).await;
        assert_eq!(
            leases.iter().map(|l| l.max_splits).collect::<Vec<_>>(),
            sizes,
            "{target:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_retried_with_the_same_request_id_and_no_split_is_leased_twice() {
    let dispatcher = FakeDispatcher::leader(10).await;
    // The first request's first two replies are lost after the lease was recorded.
    dispatcher.lose_lease_replies(2);
    let leaser = leaser(&dispatcher, (4, 4), LEASE_TARGET);

    let mut splits = Vec::new();
    while let Some(split) = take(&leaser, 1).await[0] {
        splits.push(split);
    }
    assert_eq!(
        splits,
        (0..10).collect::<Vec<_>>(),
        "every split once, in order"
    );

    let requests = dispatcher.lease_requests();
    assert_eq!(
        requests[..3],
        [requests[0]; 3],
        "retries reuse the request id"
    );
    let leases = dispatcher.granted();
    assert_eq!(
        leases
            .iter()
            .map(|l| (l.start, l.end, l.end_of_splits))
            .collect::<Vec<_>>(),
        vec![(0, 4, false), (4, 8, false), (8, 10, false), (10, 10, true)],
        "the retries leased nothing new"
    );
    let mut ids: Vec<_> = leases.iter().map(|l| l.request).collect();
    ids.dedup();
    assert_eq!(ids.len(), leases.len(), "one lease per request id");
}
