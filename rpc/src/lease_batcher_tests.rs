//! When waiting lease requests are sent (the queue's steps, on their own), and lease requests
//! sent together against a fake leader on real gRPC. The gRPC tests run on one thread, so
//! requests made in one poll are all queued before the first call returns.

use super::{Call, Queue, Waiting, MAX_PATIENCE, MIN_PATIENCE};
use crate::dispatcher_client::DispatcherClient;
use crate::fake_dispatcher::FakeDispatcher;
use crate::quorum::RetryConfig;
use crate::request_ids::RequestIds;
use futures::future::join_all;
use futures::FutureExt;
use sluice_proto::dispatcher as pb;
use sluice_proto::MAX_LEASES_PER_CALL;
use sluice_types::{IterationId, LeaseRequest, SplitLease, TaskId};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

/// `ms` milliseconds into the queue tests' time (their steps are given the time).
fn at(ms: u64) -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now) + Duration::from_millis(ms)
}

/// A queue with `n` requests waiting, due at once; the receivers of their answers.
fn queue_with(
    ids: &Arc<RequestIds>,
    n: usize,
) -> (Queue, Vec<oneshot::Receiver<super::LeaseReply>>) {
    let mut queue = Queue::default();
    let answers = (0..n).map(|_| wait(&mut queue, ids)).collect();
    (queue, answers)
}

/// Queues one more request, due at once; the receiver of its answer.
fn wait(queue: &mut Queue, ids: &Arc<RequestIds>) -> oneshot::Receiver<super::LeaseReply> {
    wait_until(queue, ids, at(0))
}

/// Queues one more request, due at `due`; the receiver of its answer.
fn wait_until(
    queue: &mut Queue,
    ids: &Arc<RequestIds>,
    due: Instant,
) -> oneshot::Receiver<super::LeaseReply> {
    let (reply, answer) = oneshot::channel();
    queue.waiting.push_back(Waiting {
        request: pb::LeaseSplitsRequest::default(),
        due,
        _in_flight: ids.begin(),
        reply,
    });
    answer
}

/// A step's call: its number, the requests it carries and its patience.
fn summary(call: Option<Call>) -> String {
    match call {
        Some(c) => format!(
            "call {} with {} ({:?})",
            c.number,
            c.batch.len(),
            c.patience
        ),
        None => "none".into(),
    }
}

#[test]
fn requests_go_at_once_unless_a_call_holds_them_back() {
    let ids = RequestIds::new(1);
    let (mut queue, _answers) = queue_with(&ids, 1);
    // Nothing on its way: at once, with twice the first estimate of a call's time.
    assert_eq!(summary(queue.step(at(0))), "call 0 with 1 (20ms)");
    // Call 0 holds the next requests back...
    let _more = [wait(&mut queue, &ids), wait(&mut queue, &ids)];
    assert_eq!(summary(queue.step(at(0))), "none");
    // ...until it returns (after 4 ms): the two waiting go together, with the patience of
    // calls that now take less.
    assert_eq!(
        summary(queue.returned(0, 4 * MS, at(0))),
        "call 1 with 2 (18.5ms)"
    );
    // Nothing is left for the next return.
    assert_eq!(summary(queue.returned(1, 4 * MS, at(0))), "none");
}

#[test]
fn a_call_out_of_patience_holds_nothing_back() {
    let ids = RequestIds::new(1);
    let (mut queue, _answers) = queue_with(&ids, 1);
    assert_eq!(summary(queue.step(at(0))), "call 0 with 1 (20ms)");
    let _next = wait(&mut queue, &ids);
    assert_eq!(summary(queue.step(at(0))), "none");
    // Call 0 is stuck: past its patience the waiting request goes without it.
    assert_eq!(summary(queue.release(0, at(0))), "call 1 with 1 (20ms)");
    // Call 0 returns late, while call 1 still holds the next request back.
    let _last = wait(&mut queue, &ids);
    assert_eq!(
        summary(queue.returned(0, 500 * MS, at(0))),
        "none",
        "call 1 holds it"
    );
    assert_eq!(
        summary(queue.returned(1, 4 * MS, at(0))),
        "call 2 with 1 (125.6875ms)"
    );
}

#[test]
fn a_call_carries_at_most_the_bound_and_the_rest_waits_for_it() {
    let ids = RequestIds::new(1);
    let (mut queue, _answers) = queue_with(&ids, MAX_LEASES_PER_CALL + 3);
    assert_eq!(
        summary(queue.step(at(0))),
        format!("call 0 with {MAX_LEASES_PER_CALL} (20ms)")
    );
    assert_eq!(queue.waiting.len(), 3);
    assert_eq!(summary(queue.step(at(0))), "none");
    assert_eq!(summary(queue.release(0, at(0))), "call 1 with 3 (20ms)");
}

#[test]
fn a_request_with_slack_waits_for_company_until_it_is_due() {
    let ids = RequestIds::new(1);
    let mut queue = Queue::default();
    let _ahead = [
        wait_until(&mut queue, &ids, at(300)),
        wait_until(&mut queue, &ids, at(200)),
    ];
    // Neither is due: nothing goes, whoever steps.
    assert_eq!(summary(queue.step(at(0))), "none");
    assert_eq!(summary(queue.step(at(199))), "none");
    // The first due takes the other along, early.
    assert_eq!(summary(queue.step(at(200))), "call 0 with 2 (20ms)");
    // A request asked for at once goes at once, and takes those not yet due with it.
    let _later = wait_until(&mut queue, &ids, at(900));
    let _now = wait_until(&mut queue, &ids, at(250));
    assert_eq!(
        summary(queue.returned(0, 4 * MS, at(250))),
        "call 1 with 2 (18.5ms)"
    );
}

#[test]
fn requests_not_yet_due_go_once_a_call_is_full() {
    let ids = RequestIds::new(1);
    let mut queue = Queue::default();
    let _ahead: Vec<_> = (0..MAX_LEASES_PER_CALL - 1)
        .map(|_| wait_until(&mut queue, &ids, at(1000)))
        .collect();
    assert_eq!(summary(queue.step(at(0))), "none");
    let _last = wait_until(&mut queue, &ids, at(1000));
    assert_eq!(
        summary(queue.step(at(0))),
        format!("call 0 with {MAX_LEASES_PER_CALL} (20ms)")
    );
}

#[test]
fn requests_whose_callers_stopped_waiting_are_dropped_unsent() {
    let ids = RequestIds::new(1);
    let (mut queue, mut answers) = queue_with(&ids, 3);
    answers.remove(1);
    assert_eq!(summary(queue.step(at(0))), "call 0 with 2 (20ms)");
    drop(wait(&mut queue, &ids));
    assert_eq!(
        summary(queue.returned(0, 4 * MS, at(0))),
        "none",
        "nothing to send"
    );
    assert!(queue.waiting.is_empty());
}

#[test]
fn the_patience_follows_how_long_calls_take_within_its_bounds() {
    let ids = RequestIds::new(1);
    let cases = [
        (Duration::ZERO, MIN_PATIENCE),
        (70 * MS, 140 * MS),
        (Duration::from_secs(5), MAX_PATIENCE),
    ];
    for (took, patience) in cases {
        let (mut queue, _answers) = queue_with(&ids, 0);
        for call in 0..200 {
            queue.returned(call, took, at(0));
        }
        let got = queue.patience();
        assert!(
            got.abs_diff(patience) <= MS,
            "calls of {took:?}: patience {got:?}, not {patience:?}"
        );
    }
}

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
async fn leases_asked_for_while_one_is_on_its_way_go_in_one_call_and_each_gets_its_own() {
    let leader = FakeDispatcher::leader(10).await;
    let client = client(&leader);

    let leases = lease_at_once(&client, 50).await;

    assert_eq!(leader.calls("lease_splits"), 1, "the first, at once");
    assert_eq!(leader.calls("lease_splits_batch"), 1, "the other 49");
    assert_eq!(client.lease_calls(), 2);
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
        assert_eq!(
            (lease.start, lease.end),
            (0, 1),
            "each task's own iteration"
        );
    }
    let mut ids: Vec<(u64, u64)> = granted.iter().map(|g| g.request).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 50, "each lease has a request id of its own");
}

#[tokio::test]
async fn leases_asked_for_ahead_over_their_slack_go_in_one_call_once_the_first_is_due() {
    let leader = FakeDispatcher::leader(10).await;
    let client = client(&leader);
    let slack = crate::MAX_LEASE_SLACK;
    let started = Instant::now();

    // Ten leases asked for 5 ms apart, each with a second of slack.
    let leases = join_all((1..=10).map(|task| {
        let client = client.clone();
        async move {
            tokio::time::sleep(5 * MS * task as u32).await;
            client.lease_splits_ahead(&lease(task, 1), slack).await
        }
    }))
    .await;

    assert!(leases.iter().all(|l| l.as_ref().is_ok_and(|l| l.end == 1)));
    assert_eq!(leader.calls("lease_splits"), 0);
    assert_eq!(leader.calls("lease_splits_batch"), 1, "all ten together");
    assert!(
        started.elapsed() >= slack,
        "sent once the first one's slack had passed, not before"
    );
}

#[tokio::test]
async fn a_lease_asked_for_at_once_takes_the_leases_asked_for_ahead_along() {
    let leader = FakeDispatcher::leader(10).await;
    let client = client(&leader);
    let ahead: Vec<LeaseRequest> = (1..=10).map(|task| lease(task, 1)).collect();
    let mut ahead: Vec<_> = ahead
        .iter()
        .map(|r| Box::pin(client.lease_splits_ahead(r, crate::MAX_LEASE_SLACK)))
        .collect();
    for waiting in &mut ahead {
        assert!(waiting.now_or_never().is_none(), "waits for company");
    }

    let now = client.lease_splits(&lease(11, 1)).await;
    let ahead = join_all(ahead).await;

    assert_eq!(now.expect("a lease").end, 1);
    assert!(ahead.iter().all(|l| l.as_ref().is_ok_and(|l| l.end == 1)));
    assert_eq!(leader.calls("lease_splits"), 0, "not alone");
    assert_eq!(leader.calls("lease_splits_batch"), 1, "all eleven together");
}

#[tokio::test]
async fn more_leases_than_one_call_carries_go_in_the_next_call() {
    let leader = FakeDispatcher::leader(10).await;
    let client = client(&leader);
    let n = MAX_LEASES_PER_CALL as u64 + 44;

    let leases = lease_at_once(&client, n).await;

    assert_eq!(leases.len() as u64, n);
    assert_eq!(leader.calls("lease_splits"), 1);
    assert_eq!(
        leader.calls("lease_splits_batch"),
        2,
        "a full call and the rest"
    );
    assert_eq!(leader.granted().len() as u64, n);
}

#[tokio::test]
async fn a_batch_whose_reply_was_lost_is_retried_with_the_same_request_ids() {
    let leader = FakeDispatcher::leader(10).await;
    leader.lose_batch_replies(1);
    let client = client(&leader);

    let leases = lease_at_once(&client, 11).await;

    assert_eq!(
        leader.calls("lease_splits_batch"),
        2,
        "the lost call and its retry"
    );
    assert_eq!(client.lease_calls(), 2, "a retry is the same call");
    let received = leader.lease_requests();
    assert_eq!(received.len(), 21, "the first lease, and the batch twice");
    assert_eq!(
        received[1..11],
        received[11..],
        "the retry carries the same ids"
    );
    assert_eq!(leader.granted().len(), 11, "the retry leased nothing new");
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
    let (first, given_up, last) = (lease(1, 1), lease(2, 1), lease(3, 1));

    // The first is sent (polled once), the second queued behind it and dropped before the
    // first returned.
    let mut first = Box::pin(client.lease_splits(&first));
    assert!((&mut first).now_or_never().is_none());
    assert!(client.lease_splits(&given_up).now_or_never().is_none());
    let (first, last) = tokio::join!(first, client.lease_splits(&last));

    assert_eq!((first.unwrap().start, last.unwrap().start), (0, 0));
    assert_eq!(leader.calls("lease_splits"), 2, "the first and the last");
    assert_eq!(leader.calls("lease_splits_batch"), 0);
    let tasks: Vec<u64> = leader.granted().iter().map(|g| g.task_id).collect();
    assert_eq!(tasks, [1, 3]);
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

    assert!(leader.calls("lease_splits_batch") > 0, "a batch was sent");
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
