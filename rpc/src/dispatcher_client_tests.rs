//! Leader following and retries against fake replicas on real gRPC.

use super::*;
use crate::fake_dispatcher::FakeDispatcher;
use sluice_testwait::{wait_until, HANG};
use sluice_types::{IterationId, LeaseRequest, TaskId};
use tokio::time::Instant;

/// Patient enough for a loaded machine; the tests finish as soon as their calls do.
/// Waits until `replica` has received `n` `WatchLeader` streams, then checks it received no
/// more.
async fn streams_reach(replica: &FakeDispatcher, n: u32) {
    let what = format!("{n} streams to {}", replica.addr());
    wait_until(&what, HANG, || replica.calls("watch_leader") >= n)
        .await
        .unwrap();
    assert_eq!(
        replica.calls("watch_leader"),
        n,
        "streams to {}",
        replica.addr()
    );
}

fn patient(addrs: &str) -> DispatcherClient {
    DispatcherClient::with_retry(
        addrs,
        RetryConfig {
            retry_timeout: Duration::from_secs(20),
            ..RetryConfig::default()
        },
    )
    .expect("valid addresses")
}

#[tokio::test]
async fn a_followers_unavailable_with_a_leader_hint_reroutes_to_the_leader() {
    let leader = FakeDispatcher::leader(0).await;
    let follower = FakeDispatcher::follower(&leader.addr()).await;
    // Only the follower is known: the leader is reached through its hint alone.
    let client = patient(&follower.addr());

    assert_eq!(client.get_status().await, Ok("{}".to_string()));
    assert_eq!(follower.calls("get_status"), 1);
    assert_eq!(leader.calls("get_status"), 1);

    // The leader is remembered: the next call goes to it directly.
    assert_eq!(client.get_status().await, Ok("{}".to_string()));
    assert_eq!(follower.calls("get_status"), 1);
    assert_eq!(leader.calls("get_status"), 2);
}

#[tokio::test]
async fn a_non_retryable_code_is_returned_at_once() {
    let leader = FakeDispatcher::leader(0).await;
    leader.refuse_status(tonic::Code::FailedPrecondition);
    let client = patient(&leader.addr());

    let error = client.get_status().await.unwrap_err();
    assert_eq!(
        error,
        RpcError::FailedPrecondition("refused by the fake dispatcher".into())
    );
    assert!(!error.is_retryable());
    assert_eq!(leader.calls("get_status"), 1);

    leader.refuse_status(tonic::Code::PermissionDenied);
    let error = client.get_status().await.unwrap_err();
    assert!(
        matches!(
            error,
            RpcError::Status {
                code: tonic::Code::PermissionDenied,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(leader.calls("get_status"), 2);
}

#[tokio::test]
async fn a_lost_reply_is_retried_with_the_same_request_id_and_gets_the_recorded_lease() {
    let leader = FakeDispatcher::leader(10).await;
    leader.lose_lease_replies(1);
    let client = patient(&leader.addr());
    let request = LeaseRequest {
        iteration_id: IterationId(2000),
        task_id: TaskId(4000),
        provider: 0,
        repetition: 0,
        max_splits: 4,
    };

    let lease = client.lease_splits(&request).await.expect("a lease");
    assert_eq!((lease.start, lease.end, lease.end_of_splits), (0, 4, false));
    let received = leader.lease_requests();
    assert_eq!(received.len(), 2, "the lost reply's request and its retry");
    assert_eq!(received[0], received[1], "the retry reuses the request id");
    assert_eq!(leader.granted().len(), 1, "the retry leased nothing new");

    // The next call is a new request: the next splits.
    let lease = client.lease_splits(&request).await.expect("a lease");
    assert_eq!((lease.start, lease.end), (4, 8));
    assert_ne!(leader.lease_requests()[2], received[0]);
}

#[test]
fn addresses_are_checked_when_the_client_is_built() {
    let cases = [
        ("", "`service` must not be empty"),
        (" , ", "`service` must not be empty"),
        (
            "localhost",
            "invalid dispatcher address 'localhost': expected HOST:PORT",
        ),
        (
            "grpc+tls://h:1",
            "No credentials factory has been registered for protocol grpc+tls",
        ),
    ];
    for (addrs, message) in cases {
        let error = DispatcherClient::new(addrs).err().expect("an error");
        assert_eq!(error.to_string(), message, "{addrs:?}");
    }
    assert!(DispatcherClient::new("grpc://h:1,http://h:2, h:3").is_ok());
}

#[tokio::test]
async fn a_client_sharing_connections_has_a_requester_id_of_its_own() {
    let leader = FakeDispatcher::leader(0).await;
    let first = patient(&leader.addr());
    let second = first.sharing_connections();
    assert_ne!(
        first.begin_request().id.requester_id,
        second.begin_request().id.requester_id
    );
    assert!(Arc::ptr_eq(
        &first.inner.quorum.channels,
        &second.inner.quorum.channels
    ));
    assert_eq!(second.get_status().await, Ok("{}".to_string()));
    assert_eq!(leader.calls("get_status"), 1);
}

/// A frozen leader (port open, nothing answered), a follower naming the leader elected after
/// it, and that leader, in this order of addresses.
async fn frozen_leader_and_successor() -> (FakeDispatcher, FakeDispatcher, FakeDispatcher) {
    let frozen = FakeDispatcher::leader(100).await;
    frozen.freeze();
    let successor = FakeDispatcher::leader(100).await;
    successor.set_term(2);
    let follower = FakeDispatcher::follower(&successor.addr()).await;
    follower.set_term(2);
    (frozen, follower, successor)
}

/// A client that, without hedging, would wait on a frozen leader for 20 s at least: its attempts'
/// deadlines are twice a 10 s election timeout, and keepalive would close the frozen
/// connection only after 5 s of silence and 10 s more for the ping. Hedging moves on as soon as
/// a newer leader is named (milliseconds), so a test that sees a call move on within
/// `HEDGED` saw hedging, with a bound only a hang crosses.
fn patient_without_hedging_deadlines(addrs: &str) -> DispatcherClient {
    DispatcherClient::with_retry(
        addrs,
        RetryConfig {
            election_timeout: Duration::from_secs(10),
            rpc_timeout: Duration::from_secs(60),
            retry_timeout: Duration::from_secs(60),
            ..RetryConfig::default()
        },
    )
    .expect("valid addresses")
}

/// Under anything a client moves on by without hedging (see
/// `patient_without_hedging_deadlines`).
const HEDGED: Duration = Duration::from_secs(10);

/// The lease both frozen-leader tests ask for.
fn ten_splits_of_task_1() -> LeaseRequest {
    LeaseRequest {
        iteration_id: IterationId(1),
        task_id: TaskId(1),
        provider: 0,
        repetition: 0,
        max_splits: 10,
    }
}

#[tokio::test]
async fn a_call_on_a_frozen_leader_is_sent_again_to_the_newer_leader_with_its_request_id() {
    let (frozen, follower, successor) = frozen_leader_and_successor().await;
    let addrs = [frozen.addr(), follower.addr(), successor.addr()].join(",");
    let client = patient_without_hedging_deadlines(&addrs);
    let request = ten_splits_of_task_1();

    let started = Instant::now();
    let lease = client.lease_splits(&request).await.expect("a lease");
    let waited = started.elapsed();

    assert_eq!((lease.start, lease.end), (0, 10));
    assert_eq!(frozen.calls("lease_splits"), 1, "the first attempt");
    let retried = successor.lease_requests();
    assert_eq!(retried.len(), 1, "{retried:?}");
    // The rotation after a deadline would come after twice the election timeout (20 s): only
    // hedging moves on before `HEDGED`. (How soon it does is the failover benchmarks' part.)
    assert!(waited < HEDGED, "waited {waited:?}");
    for replica in [&frozen, &follower, &successor] {
        streams_reach(replica, 1).await;
    }
}

#[tokio::test]
async fn a_long_poll_on_a_frozen_leader_ends_once_a_newer_term_is_named() {
    let (frozen, follower, successor) = frozen_leader_and_successor().await;
    let addrs = [frozen.addr(), follower.addr(), successor.addr()].join(",");
    let client = patient_without_hedging_deadlines(&addrs);
    let heartbeat = crate::ClientHeartbeat {
        client_id: sluice_types::ClientId(1),
        known_tasks: crate::KnownTasks::default(),
        current_round: None,
        blocked_round: None,
    };

    let started = Instant::now();
    // The fake serves no heartbeats: the successor's refusal is the answer, which shows the
    // poll was sent there.
    let answer = client
        .client_heartbeat(&heartbeat, Duration::from_secs(60))
        .await;
    let waited = started.elapsed();

    assert!(
        matches!(
            answer,
            Err(RpcError::Status {
                code: tonic::Code::Unimplemented,
                ..
            })
        ),
        "{answer:?}"
    );
    assert_eq!(frozen.calls("client_heartbeat"), 1);
    assert_eq!(successor.calls("client_heartbeat"), 1);
    // Waiting out the poll would take 60 s, a deadline 20 s more.
    assert!(waited < HEDGED, "waited {waited:?} of a 60 s poll");
}

#[tokio::test]
async fn a_leader_the_other_replicas_still_name_is_waited_for() {
    // The others name the silent replica (no election yet): nobody newer is known, so the
    // attempt outlives its deadline (twice the election timeout, 200 ms here) up to
    // `rpc_timeout` rather than being sent again or abandoned for a follower.
    let frozen = FakeDispatcher::leader(100).await;
    frozen.freeze();
    let follower = FakeDispatcher::follower(&frozen.addr()).await;
    let client = DispatcherClient::with_retry(
        &[frozen.addr(), follower.addr()].join(","),
        RetryConfig {
            election_timeout: Duration::from_millis(100),
            rpc_timeout: Duration::from_secs(1),
            retry_timeout: Duration::from_millis(500),
            ..RetryConfig::default()
        },
    )
    .expect("valid addresses");
    let request = ten_splits_of_task_1();

    let started = Instant::now();
    let answer = client.lease_splits(&request).await;

    assert!(
        matches!(answer, Err(RpcError::Unavailable { .. })),
        "{answer:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited to the cap"
    );
    assert_eq!(frozen.calls("lease_splits"), 1, "sent once");
    assert_eq!(
        follower.calls("watch_leader"),
        1,
        "one stream, silent while nothing changed"
    );
    assert_eq!(
        follower.calls("lease_splits"),
        0,
        "never sent to the follower"
    );
}

#[tokio::test]
async fn callers_sharing_a_client_hold_one_leader_stream_per_replica() {
    let leader = FakeDispatcher::leader(100).await;
    let follower = FakeDispatcher::follower(&leader.addr()).await;
    let client = patient(&[follower.addr(), leader.addr()].join(","));
    let callers: Vec<_> = (0..20)
        .map(|_| {
            let client = client.sharing_connections();
            tokio::spawn(async move { client.get_status().await })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.expect("no panic"), Ok("{}".to_string()));
    }
    streams_reach(&leader, 1).await;
    streams_reach(&follower, 1).await;
    assert_eq!(leader.calls("get_status"), 20);
}

/// A listener that answers every connection as a TLS server answers plain HTTP/2: once the
/// caller has written, with a fatal TLS alert (decode error); it closes when the caller does.
async fn tls_speaker() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 1024];
                if !matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {
                    return;
                }
                let _ = socket
                    .write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32])
                    .await;
                while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_replica_a_caller_cannot_speak_to_is_skipped_and_named_when_no_other_answers() {
    let tls = tls_speaker().await;
    let leader = FakeDispatcher::leader(0).await;

    // Another replica answers: the call goes there.
    let client = patient(&format!("{tls},{}", leader.addr()));
    assert_eq!(client.get_status().await, Ok("{}".to_string()));
    assert_eq!(leader.calls("get_status"), 1);

    // None does: the call fails at once with the cause, not after the retry deadline as an
    // unavailable dispatcher would.
    let client = patient(&tls);
    let error = client.get_status().await.unwrap_err();
    match &error {
        RpcError::FailedPrecondition(message) => assert!(
            message.contains(&format!(
                "the server at {tls} speaks TLS and this caller does not"
            )),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(!error.is_retryable());
}
