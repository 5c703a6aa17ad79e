//! Hostile numbers in requests are refused on the leader and change nothing on any replica: the
//! quorum keeps serving, and replaying the log (a restart) is unaffected.

use crate::simulated_worker::SimulatedWorker;
use sluice_rpc::RpcError;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_repetition_u64_max_is_refused_and_every_replica_keeps_serving(
) -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 0).await?;
    let sim = SimulatedWorker::start(&cluster, 100, 1).await?;
    let first = sim.client.lease_splits(&sim.lease(0, 0)).await?;
    assert_eq!((first.start, first.end), (0, 1));
    let leader = cluster.wait_for_leader(WAIT).await?;
    cluster.wait_caught_up(leader, WAIT).await?;
    let applied = cluster.applied_index(leader);
    for _ in 0..2 {
        let refused = sim.client.lease_splits(&sim.lease(0, u64::MAX)).await;
        assert_eq!(
            refused,
            Err(RpcError::InvalidArgument(
                "split repetition 18446744073709551615 is beyond the provider's next \
                 repetition (it is in repetition 0)"
                    .into()
            ))
        );
    }
    assert_eq!(
        cluster.applied_index(leader),
        applied,
        "refused before it was proposed: no log entry"
    );
    // Every replica keeps serving, and a restarted one replays its log.
    let next = sim.client.lease_splits(&sim.lease(0, 0)).await?;
    assert_eq!(
        (next.start, next.end),
        (1, 2),
        "the cursor went on from where it was"
    );
    let follower = [1, 2, 3]
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    cluster.kill(follower).await?;
    cluster.restart(follower).await?;
    cluster.wait_caught_up(follower, WAIT).await?;
    let state = cluster.state_of(follower).expect("restarted");
    let cursor = &state
        .iteration(sim.tasks[0].0)
        .expect("the iteration")
        .cursors[0];
    assert_eq!((cursor.repetition, cursor.next), (0, 2));
    drop(sim);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refuses_its_bad_leases_alone_and_a_retry_of_it_leases_nothing_new(
) -> anyhow::Result<()> {
    use sluice_proto::dispatcher as pb;
    use sluice_proto::dispatcher::lease_splits_result::Result as Leased;

    let cluster = sluice_tests::start_cluster(3, 0).await?;
    let sim = SimulatedWorker::start(&cluster, 100, 2).await?;
    let leader = cluster.wait_for_leader(WAIT).await?;
    let addr = cluster.replica_addr(leader).expect("the leader's address");
    let mut raw =
        pb::dispatcher_client::DispatcherClient::connect(format!("http://{addr}")).await?;
    let lease =
        |seq: u64, iteration_id: u64, task_id: u64, repetition: u64| pb::LeaseSplitsRequest {
            iteration_id,
            provider_index: 0,
            repetition,
            max_splits: 2,
            task_id,
            request_id: Some(pb::RequestId {
                requester_id: 77,
                seq,
                watermark: 1,
            }),
        };
    let [(it0, t0), (it1, t1)] = [sim.tasks[0], sim.tasks[1]].map(|(i, t)| (i.0, t.0));
    let batch = pb::LeaseSplitsBatchRequest {
        leases: vec![
            lease(1, it0, t0, 0),
            lease(2, it0, t0, u64::MAX),
            lease(3, it1, t1, 0),
            lease(4, 999, t1, 0),
        ],
    };
    let answered = |results: Vec<pb::LeaseSplitsResult>| -> Vec<String> {
        results
            .into_iter()
            .map(|r| match r.result {
                Some(Leased::Lease(l)) => format!("lease {}..{}", l.start, l.end),
                Some(Leased::Refusal(r)) => {
                    format!("{:?}: {}", tonic::Code::from(r.code), r.message)
                }
                None => "nothing".into(),
            })
            .collect()
    };
    let expected = [
        "lease 0..2".to_string(),
        "InvalidArgument: split repetition 18446744073709551615 is beyond the provider's next \
         repetition (it is in repetition 0)"
            .into(),
        "lease 0..2".into(),
        "NotFound: Iteration id 999 not found".into(),
    ];
    let first = raw.lease_splits_batch(batch.clone()).await?.into_inner();
    assert_eq!(answered(first.results), expected);

    // The same call again, as a client retries it after a lost reply: the same answers, from
    // the outcomes recorded for its request ids, and no new lease.
    let again = raw.lease_splits_batch(batch).await?.into_inner();
    assert_eq!(answered(again.results), expected);
    let next = sim.client.lease_splits(&sim.lease(0, 0)).await?;
    assert_eq!(
        (next.start, next.end),
        (2, 3),
        "the cursor went on from the first call"
    );

    let oversized = pb::LeaseSplitsBatchRequest {
        leases: vec![lease(5, it0, t0, 0); sluice_proto::MAX_LEASES_PER_CALL + 1],
    };
    let refused = raw
        .lease_splits_batch(oversized)
        .await
        .expect_err("too many leases in one call");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        "LeaseSplitsBatch carries 257 leases; at most 256 are accepted in one call"
    );
    drop(sim);
    cluster.shutdown().await;
    Ok(())
}
