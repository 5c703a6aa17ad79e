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
