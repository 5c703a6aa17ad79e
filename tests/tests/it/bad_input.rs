//! Bad input gets a clear one-line error and changes nothing.

use sluice_client::DispatcherClientExt;
use sluice_client::{ClientError, DistributeOptions, ShardingPolicy};
use sluice_pipeline::{Dataset, Transform};

fn one_line(e: &impl std::fmt::Display) -> String {
    let text = e.to_string();
    assert!(!text.contains('\n'), "error spans lines: {text:?}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_rejected_without_changing_state() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 1).await?;
    let client = cluster.client();
    let applied_before = Some(cluster.settled_index(1, sluice_tests::HANG).await?);

    let err = sluice_pipeline::parse("range(10).map(square").unwrap_err();
    assert_eq!(
        one_line(&err),
        "invalid dataset expression at column 21: expected ')', found end of input"
    );

    let err = client
        .distribute(
            &Dataset::range(3).map("no_such_fn"),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        one_line(&err).starts_with("unknown function 'no_such_fn' in map"),
        "{err}"
    );

    let err = client
        .from_dataset_id(ShardingPolicy::Off, "4242", DistributeOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)));
    assert_eq!(
        one_line(&err),
        "Dataset id 4242 not found. It must be registered with `register_dataset` before calling `from_dataset_id`."
    );

    let err = "sideways".parse::<ShardingPolicy>().unwrap_err();
    assert_eq!(
        one_line(&err),
        "tf.data service processing mode should be a `tf.data.experimental.service.ShardingPolicy`, `\"parallel_epochs\"`, or `\"distributed_epoch\"`. Got 'sideways'."
    );

    let bad = DistributeOptions {
        max_outstanding_requests: Some(0),
        ..DistributeOptions::default()
    };
    let err = client
        .distribute(&Dataset::range(3), ShardingPolicy::Off, bad)
        .await
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "max_outstanding_requests must be positive or -1"
    );

    let missing = Dataset::files("/nonexistent-sluice-dir/*.txt").lines();
    let err = client
        .distribute(
            &missing,
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(one_line(&err).contains("no files match pattern"), "{err}");

    assert_eq!(
        cluster.applied_index(1),
        applied_before,
        "rejected input reached the log"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_or_unreadable_data_dir_is_refused() -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("notes.txt"), "someone else's files")?;
    let config =
        sluice_tests::local_dispatcher_config(1, dir.path().to_path_buf(), Default::default());
    let err = sluice_dispatcher::DispatcherHandle::start(config)
        .await
        .err()
        .expect("a foreign dir is refused");
    let text = one_line(&err);
    assert!(
        text.contains("is not a sluice journal") && text.contains("FORMAT"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path())?.count(),
        1,
        "the refused dir was modified"
    );

    let file = dir.path().join("notes.txt");
    let config = sluice_tests::local_dispatcher_config(1, file.clone(), Default::default());
    let err = sluice_dispatcher::DispatcherHandle::start(config)
        .await
        .err()
        .expect("a file is refused");
    assert!(
        one_line(&err).contains(&file.display().to_string()),
        "{err}"
    );
    Ok(())
}
