//! tf.distribute's input side on a three-replica quorum with two workers: global batches split
//! between replicas (locally and through the service), `enumerate` recovering the order,
//! `InputContext` and `distribute_datasets_from_function`, and auto-sharding between input
//! pipelines.

use crate::assert_exactly_once;
use serde_json::{json, Value};
use sluice_client::DispatcherClientExt;
use sluice_client::{
    distribute_datasets_from_function, AutoShardPolicy, ClientError, DispatcherClient,
    DistributeConfig, DistributeOptions, DistributedDataset, DistributedInput, InputContext,
    PerReplica, ServiceDataset, ShardingPolicy,
};
use sluice_element::{DType, DatasetError, Element, ElementSpec, Tensor};
use sluice_pipeline::{Dataset, FunctionRegistry, Transform};
use sluice_tests::TestCluster;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;
use tracing::info;

const EPOCH: Duration = Duration::from_secs(60);

async fn cluster() -> anyhow::Result<TestCluster> {
    register_functions();
    sluice_tests::start_cluster(3, 2).await
}

/// Map functions the workers (in this process) and the client resolve by name, as an
/// embedding program registers its own: `parse_int64` (a decimal string to an int64 scalar) and
/// `as_features` (an int64 scalar `x` to `{"id": x, "even": x % 2 == 0}`).
fn register_functions() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let registry = FunctionRegistry::global();
        registry.register_map(
            "parse_int64",
            Arc::new(|_: &ElementSpec| Ok(ElementSpec::scalar(DType::Int64))),
            Arc::new(|e: Element| {
                let text = e.to_json();
                let parsed = text.as_str().and_then(|s| s.parse::<i64>().ok());
                parsed
                    .map(|v| Element::Tensor(Tensor::scalar_i64(v)))
                    .ok_or_else(|| DatasetError::Function {
                        name: "parse_int64".into(),
                        message: format!("not a decimal string: {text}"),
                    })
            }),
        );
        registry.register_map(
            "as_features",
            Arc::new(|_: &ElementSpec| {
                Ok(ElementSpec::Dict(BTreeMap::from([
                    ("even".to_string(), ElementSpec::scalar(DType::Bool)),
                    ("id".to_string(), ElementSpec::scalar(DType::Int64)),
                ])))
            }),
            Arc::new(|e: Element| {
                let id = e.as_i64().ok_or_else(|| DatasetError::Function {
                    name: "as_features".into(),
                    message: "expects an integer scalar".into(),
                })?;
                Ok(Element::Dict(BTreeMap::from([
                    ("even".to_string(), Tensor::scalar_bool(id % 2 == 0).into()),
                    ("id".to_string(), Tensor::scalar_i64(id).into()),
                ])))
            }),
        );
    });
}

/// Every step of one epoch, as JSON.
async fn steps(dataset: &DistributedDataset) -> anyhow::Result<Vec<Value>> {
    let epoch = dataset.iter().await?;
    let steps = tokio::time::timeout(EPOCH, epoch.collect()).await??;
    Ok(steps.iter().map(PerReplica::to_json).collect())
}

/// Every row of every replica's int64 vector over `steps`, sorted.
fn rows(steps: &[Value]) -> Vec<i64> {
    let mut out: Vec<i64> = steps
        .iter()
        .flat_map(|s| s.as_array().expect("a step").clone())
        .flat_map(|replica| replica.as_array().expect("a batch").clone())
        .map(|v| v.as_i64().expect("an integer"))
        .collect();
    out.sort_unstable();
    out
}

/// `dir/part-i.txt` for i in 0..files, each with `lines` lines `"<i>-<line>"`.
fn write_line_files(dir: &Path, files: usize, lines: usize) -> anyhow::Result<()> {
    for f in 0..files {
        let body: String = (0..lines).map(|l| format!("{f}-{l}\n")).collect();
        std::fs::write(dir.join(format!("part-{f}.txt")), body)?;
    }
    Ok(())
}

fn two_pipelines(id: usize, policy: AutoShardPolicy) -> DistributeConfig {
    DistributeConfig {
        num_replicas_in_sync: 2,
        num_input_pipelines: 2,
        input_pipeline_id: id,
        auto_shard_policy: policy,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_9_batch_4_over_two_replicas_locally_and_through_the_service() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let want = json!([[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], []]]);

    info!("--- locally: the global batches of range(9).batch(4), split between 2 replicas");
    let local = DistributedDataset::new(Dataset::range(9).batch(4), DistributeConfig::replicas(2))?;
    assert_eq!(
        local.element_spec().to_string(),
        "TensorSpec(shape=(None,), dtype=int64)"
    );
    assert_eq!(Value::Array(steps(&local).await?), want);

    info!("--- the last replica's empty batch has the dtype and shape of a batch");
    let mut epoch = local.iter().await?;
    epoch.get_next().await?;
    epoch.get_next().await?;
    let last = epoch.get_next().await?;
    let empty = last.values()[1].as_tensor().expect("a tensor");
    assert_eq!(
        (empty.dtype(), empty.shape()),
        (DType::Int64, &[0usize][..])
    );

    info!("--- at the end: get_next_as_optional gives None, get_next tf's OutOfRange");
    assert_eq!(epoch.get_next_as_optional().await?, None);
    match epoch.get_next().await {
        Err(ClientError::OutOfRange(message)) => assert_eq!(message, "End of sequence"),
        other => panic!("expected OutOfRange, got {other:?}"),
    }
    assert!(epoch.next().await.is_none());

    info!("--- through the service: one file is one split, read by one worker in order");
    let file = cluster.data_root().join("range9.txt");
    std::fs::write(&file, (0..9).map(|i| format!("{i}\n")).collect::<String>())?;
    let pattern = file.to_str().expect("a utf-8 path");
    let service = cluster
        .client()
        .distribute(
            &Dataset::files(pattern).lines().map("parse_int64").batch(4),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    let through = DistributedDataset::new(service, DistributeConfig::replicas(2))?;
    assert_eq!(Value::Array(steps(&through).await?), want);
    // Each iter() is a new epoch: the next repetition of the job.
    assert_eq!(Value::Array(steps(&through).await?), want);

    info!("--- three replicas: sizes 2, 1, 1 of each batch of 4, tf's batch_sizes_for_worker");
    let three = DistributedDataset::new(Dataset::range(9).batch(4), DistributeConfig::replicas(3))?;
    assert_eq!(
        Value::Array(steps(&three).await?),
        json!([[[0, 1], [2], [3]], [[4, 5], [6], [7]], [[8], [], []]])
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tuple_and_dict_elements_split_every_component() -> anyhow::Result<()> {
    let cluster = cluster().await?;

    info!("--- enumerate() then batch: tuples of (indices, values)");
    let tuples = DistributedDataset::new(
        Dataset::range_with(10, 15, 1).enumerate().batch(4),
        DistributeConfig::replicas(2),
    )?;
    assert_eq!(
        tuples.element_spec().to_string(),
        "(TensorSpec(shape=(None,), dtype=int64), TensorSpec(shape=(None,), dtype=int64))"
    );
    assert_eq!(
        Value::Array(steps(&tuples).await?),
        json!([
            [[[0, 1], [10, 11]], [[2, 3], [12, 13]]],
            [[[4], [14]], [[], []]]
        ])
    );

    info!("--- dicts, with a known global batch size: the per-replica spec is divided");
    let dicts = DistributedDataset::new(
        Dataset::range(5).map("as_features").batch_with(2, true),
        DistributeConfig::replicas(2),
    )?;
    assert_eq!(
        dicts.element_spec().to_string(),
        "{'even': TensorSpec(shape=(1,), dtype=bool), 'id': TensorSpec(shape=(1,), dtype=int64)}"
    );
    assert_eq!(
        Value::Array(steps(&dicts).await?),
        json!([
            [{"even": [true], "id": [0]}, {"even": [false], "id": [1]}],
            [{"even": [true], "id": [2]}, {"even": [false], "id": [3]}]
        ])
    );

    info!("--- dicts through the service, two workers: every id once, every piece at most 2 rows");
    let service = cluster
        .client()
        .distribute(
            &Dataset::range(30).map("as_features").batch(4),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    let dataset = DistributedDataset::new(service, DistributeConfig::replicas(2))?;
    let mut ids = Vec::new();
    for step in steps(&dataset).await? {
        for replica in step.as_array().expect("a step") {
            let id = replica["id"].as_array().expect("ids");
            let even = replica["even"].as_array().expect("flags");
            assert!(id.len() <= 2 && id.len() == even.len(), "{replica}");
            for (i, e) in id.iter().zip(even) {
                let i = i.as_i64().expect("an id");
                assert_eq!(e.as_bool(), Some(i % 2 == 0));
                ids.push(i);
            }
        }
    }
    ids.sort_unstable();
    assert_exactly_once(&ids, 30);

    info!("--- scalars cannot be split: tf's error");
    let err =
        DistributedDataset::new(Dataset::range(3), DistributeConfig::replicas(2)).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "Invalid `input_dataset`. Expected a dataset whose elements have rank >= 1"
        ),
        "{err}"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enumerate_recovers_the_order_through_the_service() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let n = 400;
    let service = cluster
        .client()
        .distribute(
            &Dataset::range(n).map("square").enumerate(),
            ShardingPolicy::Dynamic,
            DistributeOptions {
                max_outstanding_requests: Some(4),
                ..DistributeOptions::default()
            },
        )
        .await?;
    let got = crate::read_epoch(&service, EPOCH).await?;
    let leader = cluster.wait_for_leader(EPOCH).await?;
    let state = cluster.state_of(leader).expect("the leader runs");
    let tasks: usize = state.iterations().map(|it| it.tasks.len()).sum();
    assert_eq!(tasks, 2, "a task on each worker");

    info!("--- the index is the element's position in the dataset, whichever worker made it");
    let mut pairs: Vec<(i64, i64)> = got
        .iter()
        .map(|e| match e {
            Element::Tuple(items) if items.len() == 2 => (
                items[0].as_i64().expect("an index"),
                items[1].as_i64().expect("a value"),
            ),
            other => panic!("not an (index, value) pair: {}", other.to_json()),
        })
        .collect();
    pairs.sort_unstable();
    let want: Vec<(i64, i64)> = (0..n).map(|i| (i, i * i)).collect();
    assert_eq!(pairs, want);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_context_for_two_pipelines_of_four_replicas() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let seen: Arc<Mutex<Vec<InputContext>>> = Arc::default();
    let mut all_rows = Vec::new();
    for id in 0..2 {
        let config = DistributeConfig {
            num_replicas_in_sync: 4,
            num_input_pipelines: 2,
            input_pipeline_id: id,
            ..DistributeConfig::default()
        };
        let record = seen.clone();
        let dataset = distribute_datasets_from_function(&config, async |ctx: &InputContext| {
            record.lock().expect("not poisoned").push(*ctx);
            let per_replica = ctx.get_per_replica_batch_size(8)?;
            Ok(Dataset::range(16)
                .shard(ctx.num_input_pipelines as u64, ctx.input_pipeline_id as u64)
                .batch(per_replica))
        })
        .await?;
        let got = steps(&dataset).await?;
        // Two local replicas per pipeline, each taking the next per-replica batch in turn.
        let want = match id {
            0 => json!([[[0, 2], [4, 6]], [[8, 10], [12, 14]]]),
            _ => json!([[[1, 3], [5, 7]], [[9, 11], [13, 15]]]),
        };
        assert_eq!(Value::Array(got.clone()), want, "pipeline {id}");
        all_rows.extend(rows(&got));
    }
    all_rows.sort_unstable();
    assert_eq!(all_rows, (0..16).collect::<Vec<_>>());
    let seen = seen.lock().expect("not poisoned").clone();
    assert_eq!(
        seen,
        vec![InputContext::new(2, 0, 4), InputContext::new(2, 1, 4)]
    );
    assert_eq!(
        seen[1].to_string(),
        "tf.distribute.InputContext(input pipeline id 1, total: 2)"
    );

    info!("--- the function may read the service: both pipelines share one named job");
    let client = cluster.client();
    let mut both = Vec::new();
    for id in 0..2 {
        let config = DistributeConfig {
            num_replicas_in_sync: 4,
            num_input_pipelines: 2,
            input_pipeline_id: id,
            ..DistributeConfig::default()
        };
        let dataset = distribute_datasets_from_function(&config, async |ctx: &InputContext| {
            let per_replica = ctx.get_per_replica_batch_size(8)?;
            shared_job(
                &client,
                Dataset::range(24).batch(per_replica),
                "from-function",
            )
            .await
        })
        .await?;
        both.push(dataset);
    }
    let (a, b) = tokio::join!(steps(&both[0]), steps(&both[1]));
    let mut union = [rows(&a?), rows(&b?)].concat();
    union.sort_unstable();
    assert_exactly_once(&union, 24);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_per_replica_batch_size_refuses_an_uneven_global_batch() -> anyhow::Result<()> {
    let ctx = InputContext::new(2, 0, 4);
    assert_eq!(ctx.get_per_replica_batch_size(8)?, 2);
    let err = ctx.get_per_replica_batch_size(7).unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "The `global_batch_size` 7 is not divisible by `num_replicas_in_sync` 4 "
    );
    // Raised inside the input function, it is what distribute_datasets_from_function returns.
    let config = DistributeConfig {
        num_replicas_in_sync: 4,
        ..DistributeConfig::default()
    };
    let err = distribute_datasets_from_function(&config, async |ctx: &InputContext| {
        let per_replica = ctx.get_per_replica_batch_size(10)?;
        Ok(Dataset::range(20).batch(per_replica))
    })
    .await
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "The `global_batch_size` 10 is not divisible by `num_replicas_in_sync` 4 "
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_shard_file_and_data_give_each_pipeline_its_part() -> anyhow::Result<()> {
    register_functions();
    let dir = tempfile::tempdir()?;
    write_line_files(dir.path(), 4, 5)?;
    let pattern = format!("{}/*.txt", dir.path().display());

    info!("--- FILE: pipeline i reads files i and i + 2");
    let mut union = Vec::new();
    for id in 0..2 {
        let dataset = DistributedDataset::new(
            Dataset::files(&pattern).lines().batch(4),
            two_pipelines(id, AutoShardPolicy::File),
        )?;
        let got = steps(&dataset).await?;
        let mut lines: Vec<String> = Vec::new();
        for step in &got {
            // One local replica per pipeline; about G / N = 2 rows each.
            let [replica] = step.as_array().expect("a step").as_slice() else {
                panic!("one replica per step: {step}");
            };
            let batch = replica.as_array().expect("a batch");
            assert!(!batch.is_empty() && batch.len() <= 2, "{step}");
            lines.extend(
                batch
                    .iter()
                    .map(|l| l.as_str().expect("a line").to_string()),
            );
        }
        lines.sort();
        let mut want: Vec<String> = [id, id + 2]
            .iter()
            .flat_map(|f| (0..5).map(move |l| format!("{f}-{l}")))
            .collect();
        want.sort();
        assert_eq!(lines, want, "pipeline {id}");
        union.extend(lines);
    }
    union.sort();
    union.dedup();
    assert_eq!(union.len(), 20);

    info!("--- DATA: pipeline i keeps global batches i, i + 2, ...; AUTO on a range does the same");
    for policy in [AutoShardPolicy::Data, AutoShardPolicy::Auto] {
        let mut union = Vec::new();
        for id in 0..2 {
            let dataset =
                DistributedDataset::new(Dataset::range(20).batch(4), two_pipelines(id, policy))?;
            let got = steps(&dataset).await?;
            let want = match id {
                0 => json!([
                    [[0, 1]],
                    [[2, 3]],
                    [[8, 9]],
                    [[10, 11]],
                    [[16, 17]],
                    [[18, 19]]
                ]),
                _ => json!([[[4, 5]], [[6, 7]], [[12, 13]], [[14, 15]]]),
            };
            assert_eq!(Value::Array(got.clone()), want, "{policy:?} pipeline {id}");
            union.extend(rows(&got));
        }
        union.sort_unstable();
        assert_eq!(union, (0..20).collect::<Vec<_>>(), "{policy:?}");
    }

    info!("--- FILE on a range: tf's unshardable-source error; OFF: every pipeline reads it all");
    let err = DistributedDataset::new(
        Dataset::range(20).batch(4),
        two_pipelines(0, AutoShardPolicy::File),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Found an unshardable source dataset: range(20)"
    );
    let off = DistributedDataset::new(
        Dataset::range(20).batch(4),
        two_pipelines(1, AutoShardPolicy::Off),
    )?;
    assert_eq!(rows(&steps(&off).await?), (0..20).collect::<Vec<_>>());
    Ok(())
}

/// `dataset` read through the job `name` in distributed_epoch mode.
async fn shared_job(
    client: &DispatcherClient,
    dataset: Dataset,
    name: &str,
) -> Result<ServiceDataset, ClientError> {
    client
        .distribute(
            &dataset,
            ShardingPolicy::Dynamic,
            DistributeOptions {
                job_name: Some(name.to_string()),
                ..DistributeOptions::default()
            },
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_job_turns_auto_sharding_off() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let client = cluster.client();

    info!("--- two pipelines read one named job: no element dropped, none read twice");
    let mut pipelines = Vec::new();
    for id in 0..2 {
        let service = shared_job(&client, Dataset::range(40).batch(4), "shared").await?;
        let dataset = DistributedDataset::new(service, two_pipelines(id, AutoShardPolicy::Auto))?;
        match dataset.input() {
            DistributedInput::Service(s) => assert!(s.local_ops().is_empty(), "no shard added"),
            DistributedInput::Local(_) => panic!("a service input"),
        }
        pipelines.push(dataset);
    }
    let (a, b) = tokio::join!(steps(&pipelines[0]), steps(&pipelines[1]));
    let mut union = [rows(&a?), rows(&b?)].concat();
    union.sort_unstable();
    assert_exactly_once(&union, 40);

    info!("--- anonymous jobs: each pipeline reads a whole epoch and keeps every 2nd global batch");
    for id in 0..2 {
        let service = client
            .distribute(
                &Dataset::range(40),
                ShardingPolicy::Dynamic,
                DistributeOptions::default(),
            )
            .await?
            .batch(4);
        let dataset = DistributedDataset::new(service, two_pipelines(id, AutoShardPolicy::Auto))?;
        let got = steps(&dataset).await?;
        // 10 global batches of 4 arrive; this pipeline keeps 5 and splits each in 2 steps.
        assert_eq!(got.len(), 10, "pipeline {id}");
        assert_eq!(rows(&got).len(), 20, "pipeline {id}");
    }
    let anonymous = client
        .distribute(
            &Dataset::range(40).batch(4),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    let err =
        DistributedDataset::new(anonymous, two_pipelines(0, AutoShardPolicy::File)).unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("Did not find a shardable source, walked to a node which is not a dataset: the tf.data service"),
        "{err}"
    );
    cluster.shutdown().await;
    Ok(())
}
