//! Lease requests sent together, against a fake leader on real gRPC. The tests run on one
//! thread, so requests made in one poll are all queued before the sender first runs.

use crate::dispatcher_client::{DispatcherClient, RetryConfig};
use crate::fake_dispatcher::FakeDispatcher;
use crate::ids::{IterationId, TaskId};
use crate::{LeaseRequest, SplitLease};
use futures::future::join_all;
use futures::FutureExt;
use sluice_proto::MAX_LEASES_PER_CALL;
use std::time::Duration;

fn client(leader: &FakeDispatcher) -> DispatcherClient {
    DispatcherClient::with_retry(
        &leader.addr(),
        RetryConfig {
            retry_timeout: Duration::from_secs(20),
            ..RetryConfig::default()
        },
    )
    .expect("a valid address")
}

/// A lease of `max_splits` splits for task `task`, each task in an iteration of its own.
fn lease(task: u64, max_splits: u32) -> LeaseRequest {
    LeaseRequest {
        iteration_id: IterationId(task),
        task_id: TaskId(task),
        provider: 0,
        repetition: 0,
        max_splits,
    }
}

/// `n` leases of one split asked for at once, one per task; each task's reply.
async fn lease_at_once(client: &DispatcherClient, n: u64) -> Vec<SplitLease> {
    let requests: Vec<LeaseRequest> = (1..=n).map(|task| lease(task, 1)).collect();
    join_all(requests.iter().map(|r| client.lease_splits(r)))
        .await
        .into_iter()
        .map(|reply| reply.expect("a lease"))
        .collect()
}

#[tokio::test]
async fn leases_asked_for_at_once_go_in_one_call_and_each_gets_its_own() {
    let leader = FakeDispatcher::leader(10).await;
    let client = client(&leader);

    let leases = lease_at_once(&client, 50).await;

    assert_eq!(leader.calls("lease_splits_batch"), 1);
    assert_eq!(leader.calls("lease_splits"), 0);
    assert_eq!(client.lease_calls(), 1);
    let granted = leader.granted();
    assert_eq!(granted.len(), 50);
    for (task, lease) in (1..=50).zip(&leases) {
        let own = granted
            .iter()
            .find(|g| g.task_id == task)
            .expect("a lease for each task");
        assert_eq!(
            (lease.start, lease.end, lease.end_of_splits),
            (own.start, own.end, own.end_of_splits),
            "task {task} got the lease granted for its request"
        );
        assert_eq!((lease.start, lease.end), (0, 1), "each task's own iteration");
    }
    let mut ids: Vec<(u64, u64)> = granted.iter().map(|g| g.request).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 50, "each lease has a request id of its own");
}

#[tokio::test]
async fn a_lone_lease_goes_in_a_plain_call() {
    let leader = FakeDispatcher::leader(10).await;
    let client = client(&leader);

    let lease = client.lease_splits(&lease(1, 4)).await.expect("a lease");

    assert_eq!((lease.start, lease.end), (0, 4));
    assert_eq!(leader.calls("lease_splits"), 1);
    assert_eq!(leader.calls("lease_splits_batch"), 0);
}

#[tokio::test]
async fn more_leases_than_one_call_carries_go_in_the_next_call() {
    let leader = FakeDispatcher::leader(10).await;
    let client = client(&leader);
    let n = MAX_LEASES_PER_CALL as u64 + 44;

    let leases = lease_at_once(&client, n).await;

    assert_eq!(leases.len() as u64, n);
    assert_eq!(leader.calls("lease_splits_batch"), 2, "a full call and the rest");
    assert_eq!(leader.granted().len() as u64, n);
}

#[tokio::test]
async fn a_call_whose_reply_was_lost_is_retried_with_the_same_request_ids() {
    let leader = FakeDispatcher::leader(10).await;
    leader.lose_lease_replies(1);
    let client = client(&leader);

    let leases = lease_at_once(&client, 10).await;

    assert_eq!(leader.calls("lease_splits_batch"), 2, "the lost call and its retry");
    assert_eq!(client.lease_calls(), 1, "a retry is the same call");
    let received = leader.lease_requests();
    assert_eq!(received.len(), 20);
    assert_eq!(received[..10], received[10..], "the retry carries the same ids");
    assert_eq!(leader.granted().len(), 10, "the retry leased nothing new");
    assert!(leases.iter().all(|l| (l.start, l.end) == (0, 1)));
}

#[tokio::test]
async fn a_dispatcher_without_batches_gets_each_lease_in_a_call_of_its_own() {
    let leader = FakeDispatcher::leader(10).await;
    leader.refuse_batches();
    let client = client(&leader);

    let leases = lease_at_once(&client, 10).await;
    assert_eq!(leases.len(), 10);
    assert_eq!(leader.calls("lease_splits_batch"), 1, "tried once");
    assert_eq!(leader.calls("lease_splits"), 10);
    assert_eq!(client.lease_calls(), 11);

    let leases = lease_at_once(&client, 10).await;
    assert_eq!(leases.len(), 10);
    assert_eq!(leader.calls("lease_splits_batch"), 1, "not tried again");
    assert_eq!(leader.calls("lease_splits"), 20);
    assert_eq!(client.lease_calls(), 21);
    assert_eq!(leader.granted().len(), 20);
}

#[tokio::test]
async fn a_lease_whose_caller_stopped_waiting_before_it_was_sent_is_not_sent() {
    let leader = FakeDispatcher::leader(10).await;
    let client = client(&leader);

    // Queued, then dropped before the sender ran.
    let given_up = lease(1, 1);
    assert!(client.lease_splits(&given_up).now_or_never().is_none());
    let lease = client.lease_splits(&lease(2, 1)).await.expect("a lease");

    assert_eq!((lease.start, lease.end), (0, 1));
    assert_eq!(leader.calls("lease_splits"), 1, "sent alone");
    assert_eq!(leader.calls("lease_splits_batch"), 0);
    let granted = leader.granted();
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0].task_id, 2);
}

#[tokio::test]
async fn every_lease_of_a_call_that_failed_gets_its_error() {
    let leader = FakeDispatcher::leader(10).await;
    leader.lose_lease_replies(u32::MAX);
    let client = DispatcherClient::with_retry(
        &leader.addr(),
        RetryConfig {
            retry_timeout: Duration::from_millis(200),
            ..RetryConfig::default()
        },
    )
    .expect("a valid address");
    let requests: Vec<LeaseRequest> = (1..=5).map(|task| lease(task, 1)).collect();

    let replies = join_all(requests.iter().map(|r| client.lease_splits(r))).await;

    for reply in replies {
        let error = reply.expect_err("no reply arrives");
        assert!(error.is_retryable(), "{error:?}");
        assert!(error.to_string().contains("the reply was lost"), "{error}");
    }
    // The client goes on sending: nothing was left queued.
    leader.lose_lease_replies(0);
    let lease = client.lease_splits(&lease(6, 1)).await.expect("a lease");
    assert_eq!((lease.start, lease.end), (0, 1));
}
