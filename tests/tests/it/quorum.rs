//! Three-replica quorums: catching up by snapshot, and losing the majority for a while.

use crate::assert_exactly_once;
use sluice_client::DispatcherClientExt;
use sluice_client::{
    ClientError, DispatcherClient, DistributeOptions, RegisterOptions, RetryConfig, ShardingPolicy,
};
use sluice_pipeline::Dataset;
use std::time::Duration;
use tracing::info;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_down_during_many_writes_catches_up_by_snapshot_install() -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    let mut cluster = sluice_tests::TestCluster::start_with(3, 0, |config| {
        config.snapshot_logs_since_last = 50;
        config.logs_kept_after_snapshot = 5;
    })
    .await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let lagging = (1..=3).find(|id| *id != leader).expect("a follower");
    let lagging_last = cluster.applied_index(lagging).unwrap_or(0);
    info!(
        lagging,
        "--- stopping a follower, then writing past several snapshots"
    );
    cluster.kill(lagging).await?;
    let client = cluster.client();
    for i in 0..300 {
        let options = RegisterOptions {
            dataset_id: Some(format!("d{i}")),
            ..RegisterOptions::default()
        };
        client
            .register_dataset(&Dataset::range(i), &options)
            .await?;
    }
    // openraft purges once no replication stream has the range in flight; the stream to the
    // stopped follower retries with a backoff, so the purge may lag the snapshot a little.
    let raft = cluster.replica(leader).expect("running").raft().clone();
    sluice_tests::wait_until(
        "the leader to purge the entries the follower lacks",
        Duration::from_secs(20),
        || {
            let purged = raft.metrics().borrow().purged.map(|l| l.index).unwrap_or(0);
            async move { purged > lagging_last + 1 }
        },
    )
    .await?;

    info!("--- restarting the follower: the log it needs is gone, so it gets a snapshot");
    cluster.restart(lagging).await?;
    cluster
        .wait_caught_up(lagging, Duration::from_secs(30))
        .await?;
    let metrics = cluster
        .replica(lagging)
        .expect("running")
        .raft()
        .metrics()
        .borrow()
        .clone();
    let snapshot = metrics.snapshot.map(|l| l.index).unwrap_or(0);
    assert!(
        snapshot > lagging_last,
        "the follower installed a snapshot (snapshot index {snapshot})"
    );
    let datasets = |id| cluster.state_of(id).expect("running").datasets().count();
    assert_eq!(datasets(lagging), 300);
    assert_eq!(datasets(lagging), datasets(leader));
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_of_three_replicas_down_everyone_waits_and_work_resumes() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 2).await?;
    let n = 5000;
    let mut epoch = crate::dynamic_range_epoch(&cluster, n, 8).await?;
    let mut got = crate::read_ints(&mut epoch, 500).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let survivor = (1..=3).find(|id| *id != leader).expect("a follower");
    let down: Vec<u64> = (1..=3).filter(|id| *id != survivor).collect();
    info!(?down, survivor, "--- two of three replicas down");
    for id in &down {
        cluster.kill(*id).await?;
    }
    // Once the survivor campaigns it has no leader to learn commits from: from then on nothing
    // may be applied until a quorum is back.
    let raft = cluster.replica(survivor).expect("running").raft().clone();
    sluice_tests::wait_until("the survivor to campaign", Duration::from_secs(20), || {
        let campaigning = raft.metrics().borrow().state.is_candidate();
        async move { campaigning }
    })
    .await?;
    let applied = cluster.applied_index(survivor);

    // A write now cannot commit: the caller gets Unavailable after its retry budget, and the
    // survivor's state does not change.
    let impatient = DispatcherClient::with_retry(
        &cluster.dispatcher_addrs(),
        RetryConfig {
            retry_timeout: Duration::from_millis(1500),
            ..RetryConfig::default()
        },
    )?;
    let err = impatient
        .register_dataset(&Dataset::range(3), &RegisterOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Unavailable { .. }), "{err}");
    assert_eq!(
        cluster.applied_index(survivor),
        applied,
        "nothing changed without a quorum"
    );

    info!("--- one replica returns: a quorum again; the epoch resumes");
    cluster.restart(down[0]).await?;
    let rest = tokio::time::timeout(Duration::from_secs(60), epoch.collect()).await??;
    got.extend(rest.iter().map(|e| e.as_i64().expect("int")));
    got.sort_unstable();
    assert_exactly_once(&got, n);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_are_added_and_removed_through_joint_consensus() -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 1).await?;
    let client = cluster.client();
    client
        .register_dataset(
            &Dataset::range(10),
            &RegisterOptions {
                dataset_id: Some("before".into()),
                ..Default::default()
            },
        )
        .await?;

    info!("--- a fourth replica joins");
    let new = cluster.start_joining_replica().await?;
    let peer_addr = cluster.replica_peer_addr(new).expect("started").to_string();
    assert_eq!(client.add_node(new, &peer_addr).await?, vec![1, 2, 3, 4]);
    let again = client
        .add_node(new, &peer_addr)
        .await
        .map_err(ClientError::from);
    assert!(
        matches!(&again, Err(ClientError::InvalidArgument(m)) if m.contains("node 4 is already a voter (voters {1, 2, 3, 4})")),
        "adding a voter again is refused and changes nothing: {again:?}"
    );
    cluster.wait_caught_up(new, Duration::from_secs(20)).await?;
    info!("--- the new replica's client address enters the membership");
    let addr = cluster.replica_addr(new).expect("started").to_string();
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    cluster
        .replica(leader)
        .expect("running")
        .raft()
        .wait(Some(Duration::from_secs(20)))
        .metrics(
            |m| {
                m.membership_config
                    .membership()
                    .get_node(&new)
                    .is_some_and(|n| n.addr == addr && n.peer_addr == peer_addr)
            },
            "the new replica's addresses in the membership",
        )
        .await?;
    let state = cluster.state_of(new).expect("running");
    assert!(
        state
            .dataset(&sluice_types::DatasetId("before".into()))
            .is_some(),
        "the new replica has the state"
    );

    info!("--- the leader is removed; the others elect a new one and keep serving");
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let voters = client.remove_node(leader).await?;
    assert_eq!(voters.len(), 3);
    assert!(!voters.contains(&leader));
    cluster.forget_replica(leader).await?;
    let new_leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    assert_ne!(new_leader, leader);
    let service = cluster
        .client()
        .distribute(
            &Dataset::range(100),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    let got = crate::read_epoch(&service, Duration::from_secs(60)).await?;
    assert_exactly_once(&crate::sorted_ints(&got), 100);

    let err = cluster
        .client()
        .remove_node(99)
        .await
        .map_err(ClientError::from);
    assert!(
        matches!(&err, Err(ClientError::NotFound(m)) if m.contains("node 99 is not a member")),
        "{err:?}"
    );
    cluster.shutdown().await;
    Ok(())
}

/// A peer address where nothing listens: a port bound, then released.
async fn unreachable_peer_addr() -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_replica_stays_out_of_the_voters_and_the_quorum_keeps_writing(
) -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 0).await?;
    let client = cluster.client();
    client
        .register_dataset(&Dataset::range(3), &RegisterOptions::default())
        .await?;

    info!("--- node 4 at an address where nothing listens does not catch up, and is removed");
    let nowhere = unreachable_peer_addr().await?;
    let err = client
        .add_node_within(4, &nowhere, Some(Duration::from_secs(2)))
        .await
        .map_err(ClientError::from);
    let Err(ClientError::FailedPrecondition(message)) = &err else {
        panic!("expected a refusal, got {err:?}");
    };
    assert!(
        message.contains(&format!(
            "node 4 at peer address {nowhere} did not catch up within 2s"
        )) && message.contains("the voters are unchanged ({1, 2, 3})")
            && message.contains("it was removed as a learner"),
        "{message}"
    );
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let membership = cluster
        .replica(leader)
        .expect("running")
        .raft()
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .clone();
    assert_eq!(membership.voter_ids().collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(membership.learner_ids().count(), 0, "{membership:?}");

    info!("--- with one replica stopped, two of three voters still commit writes");
    let stopped = if leader == 3 { 2 } else { 3 };
    cluster.kill(stopped).await?;
    client
        .register_dataset(&Dataset::range(4), &RegisterOptions::default())
        .await?;

    info!(
        "--- removing a live voter would leave the live ones no majority: refused, unless forced"
    );
    let live_follower = (1..=3)
        .find(|id| *id != leader && *id != stopped)
        .expect("a third");
    let err = client
        .remove_node(live_follower)
        .await
        .map_err(ClientError::from);
    assert!(
        matches!(&err, Err(ClientError::FailedPrecondition(m))
            if m.contains(&format!("removing node {live_follower} would leave voters"))
                && m.contains("pass --force")),
        "{err:?}"
    );
    info!("--- the stopped voter may be removed: the two live ones remain a majority");
    let mut voters = client.remove_node(stopped).await?;
    voters.sort_unstable();
    let mut want = vec![leader, live_follower];
    want.sort_unstable();
    assert_eq!(voters, want);
    client
        .register_dataset(&Dataset::range(5), &RegisterOptions::default())
        .await?;
    cluster.shutdown().await;
    Ok(())
}
