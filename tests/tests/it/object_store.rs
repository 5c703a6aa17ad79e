//! Files sources read from an S3-compatible store (the `s3s-fs` server on a loopback port, see
//! `S3sFs`; it checks every request's signature): a glob over keys expanded by listing, every
//! record in distributed_epoch and in parallel_epochs as local files give them, URL prefixes as
//! data roots on the dispatcher and the workers, and errors that name the URL and no credential.
//!
//! Azure blobs (Azurite, the Azure Storage emulator) and GCS objects (fake-gcs-server) read the
//! same way.
//!
//! A files source reads its next objects ahead of use: the order of the records, and where a
//! missing object's error comes, are as one object at a time gives them.
//!
//! Through a proxy that answers one request in ten with 503 and cuts every third object
//! response mid-body, an epoch still gives every record exactly once, GZIP objects included.
//!
//! The store's configuration is the environment (`AWS_ENDPOINT`, keys, ...), as in a deployment;
//! each test runs in a process of its own (nextest), so each sets its own.

use crate::read_epoch;
use sluice_client::DispatcherClientExt;
use sluice_client::{DistributeOptions, RpcError, ShardingPolicy};
use sluice_element::pb as dpb;
use sluice_pipeline::Dataset;
use sluice_proto::dispatcher as pb;
use sluice_tests::{sorted_strings, tfrecord_bytes, S3sFs, TestCluster};
use sluice_types::DatasetId;
use std::time::Duration;

const EPOCH: Duration = Duration::from_secs(60);

const BUCKET: &str = "sluice-test";
/// The data root of every server in these tests.
const ROOT: &str = "s3://sluice-test/data";
/// The secret key `S3sFs::env` sets; no error may show it.
const SECRET: &str = sluice_testkit::s3s_fs::SECRET_KEY;

/// An S3 server whose endpoint and credentials are this process's environment, with the test
/// bucket created.
fn store() -> anyhow::Result<S3sFs> {
    let server = S3sFs::start()?;
    for (name, value) in server.env() {
        std::env::set_var(name, value);
    }
    server.create_bucket(BUCKET)?;
    Ok(server)
}

/// Writes 12 TFRecord objects of 50 records below `data/`, and objects a pattern over
/// `data/*.tfrecord` must not match; returns every record.
fn write_parts() -> anyhow::Result<Vec<String>> {
    let mut want = Vec::new();
    for f in 0..12 {
        let records: Vec<String> = (0..50).map(|r| format!("file{f}-record{r}")).collect();
        let url = format!("{ROOT}/part-{f:02}.tfrecord");
        sluice_formats::write_object(&url, tfrecord_bytes(&records)?)?;
        want.extend(records);
    }
    sluice_formats::write_object(&format!("{ROOT}/ignored.txt"), "not records")?;
    // `*` stays within one component, as in a local glob.
    let nested = tfrecord_bytes(&["nested".to_string()])?;
    sluice_formats::write_object(&format!("{ROOT}/sub/part-99.tfrecord"), nested.clone())?;
    // Outside the root, and in a key that only shares the root's text.
    sluice_formats::write_object(
        &format!("s3://{BUCKET}/other/part-00.tfrecord"),
        nested.clone(),
    )?;
    sluice_formats::write_object(&format!("s3://{BUCKET}/data2/part-00.tfrecord"), nested)?;
    Ok(want)
}

/// One dispatcher and two workers, each with the store's prefix as its only data root.
async fn cluster() -> anyhow::Result<TestCluster> {
    let mut cluster = TestCluster::start_with(1, 0, |c| c.data_roots = vec![ROOT.into()]).await?;
    for _ in 0..2 {
        cluster
            .add_worker_with(|c| c.data_roots = vec![ROOT.into()])
            .await?;
    }
    Ok(cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_epoch_over_an_s3_glob_yields_every_record_exactly_once() -> anyhow::Result<()>
{
    let _store = store()?;
    let mut want = write_parts()?;
    want.sort();
    let cluster = cluster().await?;
    let service = cluster
        .client()
        .distribute(
            &Dataset::files(&format!("{ROOT}/*.tfrecord")).tfrecord(),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    assert_eq!(sorted_strings(&read_epoch(&service, EPOCH).await?), want);
    // The registered definition lists the 12 objects by URL, sorted.
    let id = DatasetId(service.dataset_id().to_string());
    let stored = cluster.client().get_dataset(&id).await?;
    let Some(dpb::source::Kind::Files(fs)) =
        stored.dataset.and_then(|d| d.source).and_then(|s| s.kind)
    else {
        panic!("a files source");
    };
    let listed: Vec<String> = (0..12)
        .map(|f| format!("{ROOT}/part-{f:02}.tfrecord"))
        .collect();
    assert_eq!(fs.files, listed);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_epochs_over_s3_objects_give_every_record_once_per_worker() -> anyhow::Result<()> {
    let _store = store()?;
    let records = write_parts()?;
    sluice_formats::write_object(&format!("{ROOT}/lines.txt"), "one\ntwo\r\nthree")?;
    let cluster = cluster().await?;
    let client = cluster.client();
    let service = client
        .distribute(
            &Dataset::files(&format!("{ROOT}/part-0*.tfrecord")).tfrecord(),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await?;
    let mut want: Vec<String> = records
        .iter()
        .filter(|r| r.split('-').next().is_some_and(|f| f.len() == 5))
        .flat_map(|r| [r.clone(), r.clone()])
        .collect();
    want.sort();
    assert_eq!(want.len(), 2 * 10 * 50);
    assert_eq!(sorted_strings(&read_epoch(&service, EPOCH).await?), want);

    let lines = client
        .distribute(
            &Dataset::files(&format!("{ROOT}/lines.txt")).lines(),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await?;
    assert_eq!(
        sorted_strings(&read_epoch(&lines, EPOCH).await?),
        ["one", "one", "three", "three", "two", "two"]
    );
    cluster.shutdown().await;
    Ok(())
}

/// A TFRecord definition whose files are listed (`url` alone), as a raw request may send it.
fn listed(url: &str) -> dpb::DatasetDef {
    let mut def = Dataset::files("listed").tfrecord().into_def();
    let Some(dpb::source::Kind::Files(fs)) = def.source.as_mut().and_then(|s| s.kind.as_mut())
    else {
        panic!("a files source");
    };
    fs.files = vec![url.to_string()];
    def
}

/// The message of an `RpcError::Status` of `code`.
fn status_message(err: RpcError, code: tonic::Code) -> String {
    match err {
        RpcError::Status { code: got, message } if got == code => message,
        other => panic!("expected {code:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_outside_the_roots_are_refused_naming_them() -> anyhow::Result<()> {
    let _store = store()?;
    write_parts()?;
    let cluster = cluster().await?;
    let client = cluster.client();
    let metadata = pb::DatasetMetadata::default();

    // A raw request's pattern is checked before anything is listed: the dispatcher builds no
    // client for it, and names the pattern and the roots.
    for pattern in [
        format!("s3://{BUCKET}/other/*.tfrecord"),
        format!("s3://{BUCKET}/data2/*.tfrecord"),
        "s3://another-bucket/data/*.tfrecord".to_string(),
    ] {
        let def = Dataset::files(&pattern).tfrecord().into_def();
        let err = client
            .register_dataset_def(&def, None, &metadata)
            .await
            .unwrap_err();
        let message = status_message(err, tonic::Code::PermissionDenied);
        assert_eq!(
            message,
            format!("refused to read '{pattern}': outside the data roots ({ROOT})")
        );
    }

    // A raw request's pattern below the roots is listed by the dispatcher, with its own
    // environment's credentials.
    let def = Dataset::files(&format!("{ROOT}/part-0*.tfrecord"))
        .tfrecord()
        .into_def();
    let id = client.register_dataset_def(&def, None, &metadata).await?;
    let stored = client.get_dataset(&id).await?;
    let Some(dpb::source::Kind::Files(fs)) =
        stored.dataset.and_then(|d| d.source).and_then(|s| s.kind)
    else {
        panic!("a files source");
    };
    let want: Vec<String> = (0..10)
        .map(|f| format!("{ROOT}/part-{f:02}.tfrecord"))
        .collect();
    assert_eq!(fs.files, want);

    // Through the client, which lists the pattern itself: the dispatcher refuses the first
    // listed object outside its roots.
    let err = client
        .distribute(
            &Dataset::files(&format!("s3://{BUCKET}/other/*.tfrecord")).tfrecord(),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "refused to read 's3://{BUCKET}/other/part-00.tfrecord': outside the data roots ({ROOT})"
        )),
        "{err}"
    );

    // `..` is no way out: such a URL is malformed wherever it appears.
    let dotted = format!("{ROOT}/../other/part-00.tfrecord");
    let def = listed(&dotted);
    let err = client
        .register_dataset_def(&def, None, &metadata)
        .await
        .unwrap_err();
    let RpcError::InvalidArgument(message) = err else {
        panic!("expected InvalidArgument, got {err:?}");
    };
    assert!(
        message.starts_with(&format!("invalid object URL '{dotted}'")),
        "{message}"
    );

    // A listed object below the roots that does not exist: the worker's error names it.
    let def = listed(&format!("{ROOT}/missing.tfrecord"));
    let id = client.register_dataset_def(&def, None, &metadata).await?;
    let service = client
        .from_dataset_id(ShardingPolicy::Off, &id.0, DistributeOptions::default())
        .await?;
    let err = read_epoch(&service, EPOCH).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "cannot read '{ROOT}/missing.tfrecord': no such object"
        )),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
    cluster.shutdown().await;
    Ok(())
}

/// The elements a stream yields before its error, and the error.
async fn until_error(
    service: &sluice_client::ServiceDataset,
) -> anyhow::Result<(Vec<String>, String)> {
    let mut stream = service.iter().await?;
    let mut got = Vec::new();
    let read = async {
        while let Some(item) = stream.next().await {
            match item {
                Ok(e) => got.push(e.to_json().as_str().expect("a string").to_string()),
                Err(e) => return Some(e.to_string()),
            }
        }
        None
    };
    match tokio::time::timeout(EPOCH, read).await? {
        Some(err) => Ok((got, err)),
        None => anyhow::bail!(
            "the epoch ended without an error after {} elements",
            got.len()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_read_ahead_keep_their_order_and_a_missing_one_fails_at_its_turn(
) -> anyhow::Result<()> {
    let _store = store()?;
    let records = write_parts()?;
    // One worker, so one reader's order shows.
    let mut cluster = TestCluster::start_with(1, 0, |c| c.data_roots = vec![ROOT.into()]).await?;
    cluster
        .add_worker_with(|c| c.data_roots = vec![ROOT.into()])
        .await?;
    let client = cluster.client();
    let metadata = pb::DatasetMetadata::default();
    let part = |f: usize| format!("{ROOT}/part-{f:02}.tfrecord");
    let of = |files: &[usize]| -> Vec<String> {
        files
            .iter()
            .flat_map(|f| records[f * 50..(f + 1) * 50].to_vec())
            .collect()
    };

    // Every object, in an order of the definition's own, read whole by the one worker.
    let order = [11, 3, 7, 0, 10, 1, 9, 2, 8, 4, 6, 5];
    let mut def = listed(&part(order[0]));
    if let Some(dpb::source::Kind::Files(fs)) = def.source.as_mut().and_then(|s| s.kind.as_mut()) {
        fs.files = order.iter().map(|&f| part(f)).collect();
    }
    let id = client.register_dataset_def(&def, None, &metadata).await?;
    for policy in [ShardingPolicy::Off, ShardingPolicy::Dynamic] {
        let service = client
            .from_dataset_id(policy, &id.0, DistributeOptions::default())
            .await?;
        let got: Vec<String> = read_epoch(&service, EPOCH)
            .await?
            .iter()
            .map(|e| e.to_json().as_str().expect("a string").to_string())
            .collect();
        assert_eq!(got, of(&order), "{policy:?}");
    }

    // A missing object third: started with the two before it, its error comes after their
    // records (in their order, none of a later object's), as the object's own. (The service
    // may end the epoch with the error before it delivered every element the worker produced
    // before it, so what came first is a prefix.)
    let missing = format!("{ROOT}/missing.tfrecord");
    let mut def = listed(&missing);
    if let Some(dpb::source::Kind::Files(fs)) = def.source.as_mut().and_then(|s| s.kind.as_mut()) {
        fs.files = vec![part(4), part(2), missing.clone(), part(0), part(1)];
    }
    let id = client.register_dataset_def(&def, None, &metadata).await?;
    for policy in [ShardingPolicy::Off, ShardingPolicy::Dynamic] {
        let service = client
            .from_dataset_id(policy, &id.0, DistributeOptions::default())
            .await?;
        let (got, err) = until_error(&service).await?;
        let before = of(&[4, 2]);
        assert_eq!(got, before[..got.len()], "{policy:?}");
        assert!(
            err.contains(&format!("cannot read '{missing}': no such object")),
            "{err}"
        );
        assert!(!err.contains(SECRET), "{err}");
    }
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_is_an_error_naming_the_url_without_secrets() -> anyhow::Result<()> {
    let _store = store()?;
    let cluster =
        TestCluster::start_with(1, 1, |c| c.data_roots = vec!["s3://no-such-bucket".into()])
            .await?;
    let pattern = "s3://no-such-bucket/data/*.tfrecord";
    let err = cluster
        .client()
        .distribute(
            &Dataset::files(pattern).tfrecord(),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("cannot read '{pattern}': no such bucket")),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_credentials_are_an_error_naming_the_url() -> anyhow::Result<()> {
    let _store = store()?;
    std::env::remove_var("AWS_ACCESS_KEY_ID");
    std::env::remove_var("AWS_SECRET_ACCESS_KEY");
    let cluster = cluster().await?;
    let pattern = format!("{ROOT}/*.tfrecord");
    let err = cluster
        .client()
        .distribute(
            &Dataset::files(&pattern).tfrecord(),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "cannot read '{pattern}': no AWS credentials: set AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY"
        )),
        "{err}"
    );
    cluster.shutdown().await;
    Ok(())
}

/// `n` TFRecord objects of `per` records each below `data/` (GZIP-compressed when `gzip`, as
/// `TfRecordFile` writes them); returns every record.
fn write_many(n: usize, per: usize, gzip: bool) -> anyhow::Result<Vec<String>> {
    let dir = tempfile::tempdir()?;
    let mut want = Vec::new();
    for f in 0..n {
        let records: Vec<String> = (0..per)
            .map(|r| format!("object{f:02}-record{r:05}-{}", "x".repeat(r % 97)))
            .collect();
        let path = dir.path().join("part");
        let compression = if gzip {
            dpb::RecordCompression::Gzip
        } else {
            dpb::RecordCompression::None
        };
        let mut file = sluice_formats::TfRecordFile::create(&path, compression)?;
        for r in &records {
            file.write_record(r.as_bytes())?;
        }
        file.finish()?;
        let suffix = if gzip { "tfrecord.gz" } else { "tfrecord" };
        sluice_formats::write_object(
            &format!("{ROOT}/part-{f:02}.{suffix}"),
            std::fs::read(&path)?,
        )?;
        want.extend(records);
    }
    want.sort();
    Ok(want)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_store_failures_lose_and_repeat_no_record() -> anyhow::Result<()> {
    let server = store()?;
    let proxy = sluice_tests::fault_proxy::FaultProxy::start(
        ([127, 0, 0, 1], server.port()).into(),
        sluice_tests::fault_proxy::Faults {
            fail_every: 10,
            cut_every: 3,
            cut_after: 48 * 1024,
        },
    )
    .await?;
    // Every request through the proxy, each on a connection of its own (the proxy counts
    // faults per connection).
    std::env::set_var("AWS_ENDPOINT", proxy.endpoint());
    std::env::set_var("AWS_POOL_MAX_IDLE_PER_HOST", "0");
    let plain = write_many(8, 3000, false)?;
    let gzip = write_many(4, 3000, true)?;
    let cluster = cluster().await?;
    let client = cluster.client();

    let service = client
        .distribute(
            &Dataset::files(&format!("{ROOT}/*.tfrecord")).tfrecord(),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    assert_eq!(sorted_strings(&read_epoch(&service, EPOCH).await?), plain);

    let service = client
        .distribute(
            &Dataset::files(&format!("{ROOT}/*.tfrecord.gz"))
                .tfrecord_compressed(dpb::RecordCompression::Gzip),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    assert_eq!(sorted_strings(&read_epoch(&service, EPOCH).await?), gzip);

    // The faults happened: requests were refused and bodies cut, and were retried and resumed.
    assert!(
        proxy.failed() > 0 && proxy.cut() > 0,
        "failed {}, cut {}",
        proxy.failed(),
        proxy.cut()
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_blobs_read_as_s3_objects_do() -> anyhow::Result<()> {
    let azurite = sluice_tests::Azurite::start()?;
    for (name, value) in azurite.env() {
        std::env::set_var(name, value);
    }
    azurite.create_container("sluice")?;
    let root = "az://sluice/data";
    let mut want = Vec::new();
    for f in 0..6 {
        let records: Vec<String> = (0..40).map(|r| format!("blob{f}-record{r}")).collect();
        sluice_formats::write_object(
            &format!("{root}/part-{f}.tfrecord"),
            tfrecord_bytes(&records)?,
        )?;
        want.extend(records);
    }
    sluice_formats::write_object(
        "az://sluice/other/part-0.tfrecord",
        tfrecord_bytes(&want[..1])?,
    )?;
    want.sort();
    let mut cluster =
        TestCluster::start_with(1, 0, move |c| c.data_roots = vec![root.into()]).await?;
    for _ in 0..2 {
        cluster
            .add_worker_with(|c| c.data_roots = vec![root.into()])
            .await?;
    }
    let client = cluster.client();
    let pattern = format!("{root}/*.tfrecord");
    let service = client
        .distribute(
            &Dataset::files(&pattern).tfrecord(),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    assert_eq!(sorted_strings(&read_epoch(&service, EPOCH).await?), want);
    let service = client
        .distribute(
            &Dataset::files(&pattern).tfrecord(),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await?;
    let mut twice: Vec<String> = want.iter().flat_map(|r| [r.clone(), r.clone()]).collect();
    twice.sort();
    assert_eq!(sorted_strings(&read_epoch(&service, EPOCH).await?), twice);
    let outside = "az://sluice/other/part-0.tfrecord";
    let err = client
        .distribute(
            &Dataset::files(outside).tfrecord(),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "refused to read '{outside}': outside the data roots ({root})"
        )),
        "{err}"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_objects_read_as_s3_objects_do() -> anyhow::Result<()> {
    let gcs = sluice_tests::FakeGcs::start()?;
    for (name, value) in gcs.env()? {
        std::env::set_var(name, value);
    }
    gcs.create_bucket("sluice")?;
    let root = "gs://sluice/data";
    let mut want = Vec::new();
    for f in 0..6 {
        let records: Vec<String> = (0..40).map(|r| format!("gcs{f}-record{r}")).collect();
        gcs.upload(
            "sluice",
            &format!("data/part-{f}.tfrecord"),
            &tfrecord_bytes(&records)?,
        )?;
        want.extend(records);
    }
    gcs.upload(
        "sluice",
        "data/sub/part-9.tfrecord",
        &tfrecord_bytes(&want[..1])?,
    )?;
    want.sort();
    let mut cluster =
        TestCluster::start_with(1, 0, move |c| c.data_roots = vec![root.into()]).await?;
    for _ in 0..2 {
        cluster
            .add_worker_with(|c| c.data_roots = vec![root.into()])
            .await?;
    }
    let service = cluster
        .client()
        .distribute(
            &Dataset::files(&format!("{root}/*.tfrecord")).tfrecord(),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    assert_eq!(sorted_strings(&read_epoch(&service, EPOCH).await?), want);
    cluster.shutdown().await;
    Ok(())
}
