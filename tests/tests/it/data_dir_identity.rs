//! A replica that lost its data dir: a plain restart is refused, naming the dir and saying
//! what to do, while the other two replicas keep serving; it comes back only as a new, empty
//! member (removed, restarted with `join`, added again), and then has everything.

use crate::assert_exactly_once;
use sluice_client::DispatcherClientExt;
use sluice_client::{DistributeOptions, RegisterOptions, ShardingPolicy};
use sluice_pipeline::Dataset;
use sluice_types::DatasetId;
use std::time::Duration;
use tracing::info;

const WAIT: Duration = Duration::from_secs(30);

fn named(id: &str) -> RegisterOptions {
    RegisterOptions {
        dataset_id: Some(id.into()),
        ..RegisterOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_data_dir_was_emptied_is_refused_while_the_others_serve(
) -> anyhow::Result<()> {
    let mut cluster = sluice_tests::start_cluster(3, 1).await?;
    let client = cluster.client();
    client
        .register_dataset(&Dataset::range(10), &named("before"))
        .await?;

    let lost = cluster.wait_for_leader(WAIT).await?;
    info!(lost, "--- the leader stops and its data dir is emptied");
    cluster.kill(lost).await?;
    let data_dir = cluster
        .replica_data_dir(lost)
        .expect("a replica")
        .to_path_buf();
    for entry in std::fs::read_dir(&data_dir)? {
        let path = entry?.path();
        match path.is_dir() {
            true => std::fs::remove_dir_all(&path)?,
            false => std::fs::remove_file(&path)?,
        }
    }

    info!("--- a plain restart is refused, naming the dir and what to do");
    let err = cluster
        .restart(lost)
        .await
        .expect_err("an empty data dir is refused");
    let text = format!("{err:#}");
    assert!(
        text.starts_with(&format!(
            "data dir {} holds no journal: it is empty; pass --init",
            data_dir.display()
        )) && text.contains("--join")
            && text.contains("sluice admin remove-node"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(&data_dir)?.count(),
        0,
        "the refused start wrote"
    );

    info!("--- the other two elect a leader and serve reads and writes");
    let leader = cluster.wait_for_leader(WAIT).await?;
    assert_ne!(leader, lost);
    client
        .register_dataset(&Dataset::range(10), &named("after"))
        .await?;
    let service = client
        .distribute(
            &Dataset::range(100),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    let got = crate::read_epoch(&service, WAIT).await?;
    assert_exactly_once(&crate::sorted_ints(&got), 100);

    info!("--- it comes back only as a new member: removed, restarted empty with join, added");
    let voters = client.remove_node(lost).await?;
    assert!(!voters.contains(&lost), "{voters:?}");
    cluster.restart_joining(lost).await?;
    let peer_addr = cluster
        .replica_peer_addr(lost)
        .expect("a replica")
        .to_string();
    let mut voters = client.add_node(lost, &peer_addr).await?;
    voters.sort_unstable();
    assert_eq!(voters, vec![1, 2, 3]);
    cluster.wait_caught_up(lost, WAIT).await?;
    let state = cluster.state_of(lost).expect("running");
    for id in ["before", "after"] {
        assert!(
            state.dataset(&DatasetId(id.into())).is_some(),
            "the rejoined replica lacks dataset {id}"
        );
    }
    cluster.shutdown().await;
    Ok(())
}
