//! Jobs, iterations and registration as tf.data service users rely on them: named iterations
//! shared by dataset objects, explicit dataset ids and metadata, compression, and workers added
//! or restarted under `parallel_epochs`.

use crate::{read_epoch, read_ints, sorted_ints};
use sluice_client::DispatcherClientExt;
use sluice_client::{ClientError, Compression, DistributeOptions, RegisterOptions, ShardingPolicy};
use sluice_element::ElementSpec;
use sluice_pipeline::{Dataset, Transform};
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::info;

const EPOCH: Duration = Duration::from_secs(30);

fn named(job: &str) -> DistributeOptions {
    DistributeOptions {
        job_name: Some(job.into()),
        ..DistributeOptions::default()
    }
}

/// tf.data's `testSharedJobNameMultiIteration`: iterations are keyed by (job name, repetition),
/// so a dataset object arriving after the named iteration finished reads an empty epoch, and its
/// next epoch is a new iteration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_after_a_finished_named_iteration_reads_an_empty_epoch() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 1).await?;
    let client = cluster.client();
    let dataset = Dataset::range(10);
    let first = client
        .distribute(&dataset, ShardingPolicy::Off, named("multi"))
        .await?;
    assert_eq!(
        sorted_ints(&read_epoch(&first, EPOCH).await?),
        (0..10).collect::<Vec<_>>()
    );
    let late = client
        .distribute(&dataset, ShardingPolicy::Off, named("multi"))
        .await?;
    assert_eq!(
        read_epoch(&late, EPOCH).await?.len(),
        0,
        "repetition 0 already finished"
    );
    assert_eq!(
        sorted_ints(&read_epoch(&late, EPOCH).await?),
        (0..10).collect::<Vec<_>>(),
        "repetition 1 is a new iteration"
    );
    cluster.shutdown().await;
    Ok(())
}

/// `from_dataset_id` names its jobs `dataset_id=/<id>/<name>`: the same name through
/// `distribute` is another job, while two `from_dataset_id` readers share theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_dataset_id_namespaces_job_names_by_dataset() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 1).await?;
    let client = cluster.client();
    let dataset = Dataset::range(20);
    let global = client
        .distribute(&dataset, ShardingPolicy::Dynamic, named("j"))
        .await?;
    let id = global.dataset_id().to_string();
    let a = client
        .from_dataset_id(ShardingPolicy::Dynamic, &id, named("j"))
        .await?;
    let b = client
        .from_dataset_id(ShardingPolicy::Dynamic, &id, named("j"))
        .await?;
    assert_eq!(a.job_name(), Some(format!("dataset_id=/{id}/j").as_str()));
    // The global job reads everything on its own.
    assert_eq!(
        sorted_ints(&read_epoch(&global, EPOCH).await?),
        (0..20).collect::<Vec<_>>()
    );
    // The two namespaced readers split one epoch.
    let (ea, eb) = (a.iter().await?, b.iter().await?);
    let (ra, rb) = tokio::join!(ea.collect(), eb.collect());
    assert_eq!(
        sorted_ints(&[ra?, rb?].concat()),
        (0..20).collect::<Vec<_>>()
    );
    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await?;
    let state = cluster.state_of(leader).expect("the leader runs");
    let mut names: Vec<&str> = state.jobs().map(|j| j.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["dataset_id=/1000/j", "j"]);
    cluster.shutdown().await;
    Ok(())
}

/// Explicit ids: the same structure again returns the id, another is refused; metadata (element
/// spec, cardinality, compression) comes back through `from_dataset_id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_dataset_ids_and_their_metadata() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 1).await?;
    let client = cluster.client();
    let options = RegisterOptions {
        compression: Compression::None,
        dataset_id: Some("squares".into()),
    };
    let dataset = Dataset::range(6).map("square").batch(4);
    assert_eq!(
        client.register_dataset(&dataset, &options).await?,
        "squares"
    );
    assert_eq!(
        client.register_dataset(&dataset, &options).await?,
        "squares"
    );
    let error = client
        .register_dataset(&Dataset::range(7), &options)
        .await
        .unwrap_err();
    assert!(
        matches!(error, ClientError::InvalidArgument(_)),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "Datasets with the same ID should have the same structure, got diff for dataset ID \
         squares. To fix this error, make sure you're registering the same dataset with the \
         same ID."
    );
    info!("--- generated ids go on from 1000 and skip taken ones");
    let generated = client
        .register_dataset(&Dataset::range(3), &RegisterOptions::default())
        .await?;
    assert_eq!(generated, "1000");

    let service = client
        .from_dataset_id(ShardingPolicy::Off, "squares", DistributeOptions::default())
        .await?;
    let want = ElementSpec::from_proto(
        &sluice_pipeline::element_spec(
            dataset.def(),
            &sluice_pipeline::FunctionRegistry::global(),
        )?
        .to_proto(),
    )?;
    assert_eq!(service.service_element_spec(), &want);
    assert_eq!(service.registered_cardinality(), 2, "two batches");
    assert_eq!(
        service.cardinality(),
        sluice_pipeline::UNKNOWN,
        "as tf.data reports it: the workers that contribute are not known up front"
    );
    assert_eq!(service.compression(), Compression::None);
    let got: Vec<String> = read_epoch(&service, EPOCH)
        .await?
        .iter()
        .map(|e| e.to_json().to_string())
        .collect();
    assert_eq!(got, ["[0,1,4,9]", "[16,25]"]);
    cluster.shutdown().await;
    Ok(())
}

/// Compression is recorded per dataset and undone by the client: `auto` and `none` read the same
/// elements, compressible or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_and_no_compression_read_the_same_elements() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(3, 1).await?;
    let client = cluster.client();
    // Batches of 512 small integers compress well; squares of large numbers less so.
    let dataset = Dataset::range(4096).map("square").batch(512);
    let mut results = BTreeMap::new();
    for compression in [Compression::Auto, Compression::None] {
        let options = DistributeOptions {
            compression,
            ..DistributeOptions::default()
        };
        let service = client
            .distribute(&dataset, ShardingPolicy::Off, options)
            .await?;
        assert_eq!(service.compression(), compression);
        let id = service.dataset_id().to_string();
        let again = client
            .from_dataset_id(ShardingPolicy::Off, &id, DistributeOptions::default())
            .await?;
        assert_eq!(again.compression(), compression, "recorded in the metadata");
        let elements: Vec<String> = read_epoch(&service, EPOCH)
            .await?
            .iter()
            .map(|e| e.to_json().to_string())
            .collect();
        results.insert(format!("{compression:?}"), elements);
    }
    assert_eq!(results["Auto"].len(), 8);
    assert_eq!(results["Auto"], results["None"]);
    cluster.shutdown().await;
    Ok(())
}

/// tf.data's `testAddWorkerMidJob` under `parallel_epochs`: an added worker produces the whole
/// dataset too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_epochs_an_added_worker_produces_the_whole_dataset() -> anyhow::Result<()> {
    let n = 3000;
    let mut cluster = sluice_tests::start_cluster(3, 1).await?;
    let mut epoch = crate::range_epoch(&cluster, ShardingPolicy::Off, n, 4).await?;
    let mut got = read_ints(&mut epoch, 100).await?;
    info!("--- adding a worker mid-epoch");
    cluster.add_worker().await?;
    let rest = tokio::time::timeout(EPOCH, epoch.collect()).await??;
    got.extend(sorted_ints(&rest));
    got.sort_unstable();
    let twice: Vec<i64> = (0..n).flat_map(|v| [v, v]).collect();
    assert_eq!(got, twice, "each of the two workers produced range({n})");

    cluster.shutdown().await;
    Ok(())
}

/// tf.data's `testRestartWorker`: a worker restarted at the same address gets its unfinished
/// task again and runs it from the beginning (a stopped task is not an ended one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_epochs_restarted_worker_starts_its_task_again() -> anyhow::Result<()> {
    let n = 3000;
    let mut cluster = sluice_tests::start_cluster(3, 1).await?;
    let mut epoch = crate::range_epoch(&cluster, ShardingPolicy::Off, n, 4).await?;
    // One worker and one reader: tf.data's order is kept.
    let before = read_ints(&mut epoch, 200).await?;
    assert_eq!(before, (0..200).collect::<Vec<_>>());
    info!("--- restarting the worker mid-epoch");
    cluster.kill_worker(0).await?;
    cluster.restart_worker(0).await?;
    let rest = sorted_ints(&tokio::time::timeout(EPOCH, epoch.collect()).await??);
    let mut counts = BTreeMap::<i64, u32>::new();
    for v in &rest {
        *counts.entry(*v).or_default() += 1;
    }
    assert!(
        (0..n).all(|v| counts.contains_key(&v)),
        "the restarted task produced the whole range again"
    );
    assert_eq!(counts[&0], 1, "0 came again after the restart, once");
    cluster.shutdown().await;
    Ok(())
}
