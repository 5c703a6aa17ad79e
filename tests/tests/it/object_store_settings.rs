//! Per-store settings (`--object-store-config`): a store's endpoint, region and credentials
//! from the workers' and dispatcher's settings file, with nothing of them in the environment
//! (the `s3s-fs` S3 server, which checks every request's signature, on a loopback port); their
//! secrets in no error text and not on the status page. And objects of a plain HTTP server (a
//! file server of the test's own) read as a files source.
//!
//! Settings are the process's own (the servers here share this test's process, one per test
//! under nextest): the client, which lists the pattern itself, uses the ones the servers load.

use crate::read_epoch;
use sluice_client::DispatcherClientExt;
use sluice_client::{DistributeOptions, ShardingPolicy};
use sluice_pipeline::{Dataset, Transform};
use sluice_tests::http::get_async;
use sluice_tests::{sorted_strings, tfrecord_bytes, S3sFs, TestCluster};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::Duration;

const EPOCH: Duration = Duration::from_secs(60);
const BUCKET: &str = "sluice-settings";
const ROOT: &str = "s3://sluice-settings/data";

/// No AWS variable in this process: whatever reaches the store comes from the settings. The
/// metadata service stays off (off EC2 it only times out).
fn clear_aws_environment() {
    for (name, _) in std::env::vars() {
        if name.starts_with("AWS_") {
            std::env::remove_var(name);
        }
    }
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
}

/// Writes a settings file for `server`'s bucket in `dir`: the endpoint inline, the key id from
/// the variable `SLUICE_TEST_S3_KEY_ID`, the secret from a file holding `secret`.
fn settings_file(dir: &Path, server: &S3sFs, secret: &str) -> anyhow::Result<std::path::PathBuf> {
    let (key_id, _) = server.key_pair();
    std::env::set_var("SLUICE_TEST_S3_KEY_ID", key_id);
    std::fs::write(dir.join("s3-secret"), format!("{secret}\n"))?;
    let settings = serde_json::json!({"stores": {
        format!("s3://{BUCKET}"): {
            "endpoint": server.endpoint(),
            "allow_http": true,
            "region": "us-east-1",
            "access_key_id": {"env": "SLUICE_TEST_S3_KEY_ID"},
            "secret_access_key": {"file": "s3-secret"},
        },
    }});
    let path = dir.join("object-stores.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&settings)?)?;
    Ok(path)
}

/// One dispatcher (with a metrics listener, for its status page) and one worker, each with the
/// bucket's prefix as its data root and `settings` as its store settings.
async fn cluster(settings: &Path) -> anyhow::Result<TestCluster> {
    let for_dispatcher = settings.to_path_buf();
    let mut cluster = TestCluster::start_with(1, 0, move |c| {
        c.data_roots = vec![ROOT.into()];
        c.object_store_config = Some(for_dispatcher.clone());
        c.metrics_listen = Some("127.0.0.1:0".into());
    })
    .await?;
    cluster
        .add_worker_with(|c| {
            c.data_roots = vec![ROOT.into()];
            c.object_store_config = Some(settings.to_path_buf());
        })
        .await?;
    Ok(cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_settings_give_endpoint_and_credentials_without_the_environment() -> anyhow::Result<()>
{
    clear_aws_environment();
    let server = S3sFs::start()?;
    server.create_bucket(BUCKET)?;
    let dir = tempfile::tempdir()?;
    let (_, secret) = server.key_pair();
    let settings = settings_file(dir.path(), &server, secret)?;
    // The objects are written with the same settings (this process's, once a server loaded
    // them; loaded here first to write before the cluster starts).
    sluice_formats::load_object_store_settings(&settings).map_err(anyhow::Error::msg)?;
    let mut want = Vec::new();
    for f in 0..6 {
        let records: Vec<String> = (0..20).map(|r| format!("file{f}-record{r}")).collect();
        sluice_formats::write_object(
            &format!("{ROOT}/part-{f}.tfrecord"),
            tfrecord_bytes(&records)?,
        )?;
        want.extend(records);
    }
    want.sort();
    let cluster = cluster(&settings).await?;
    let service = cluster
        .client()
        .distribute(
            &Dataset::files(&format!("{ROOT}/*.tfrecord")).tfrecord(),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    let got = sorted_strings(&read_epoch(&service, EPOCH).await?);
    assert_eq!(got, want);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_secret_shows_in_no_error_and_not_on_the_status_page() -> anyhow::Result<()> {
    clear_aws_environment();
    let server = S3sFs::start()?;
    server.create_bucket(BUCKET)?;
    let dir = tempfile::tempdir()?;
    let wrong = "wrong-secret-1f3a9c";
    let settings = settings_file(dir.path(), &server, wrong)?;
    let cluster = cluster(&settings).await?;
    let pattern = format!("{ROOT}/*.tfrecord");
    let err = cluster
        .client()
        .distribute(
            &Dataset::files(&pattern).tfrecord(),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await
        .unwrap_err()
        .to_string();
    // The store refused the signature: the error names the pattern, not the secret.
    assert!(err.contains(&format!("cannot read '{pattern}'")), "{err}");
    assert!(!err.contains(wrong), "{err}");

    // The dispatcher lists a raw request's pattern itself, with its settings.
    let def = Dataset::files(&pattern).tfrecord().into_def();
    let err = cluster
        .client()
        .register_dataset_def(&def, None, &Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&pattern), "{err}");
    assert!(!err.contains(wrong), "{err}");

    let addr = cluster
        .replica(1)
        .and_then(|r| r.metrics_addr())
        .expect("a metrics listener")
        .to_string();
    for page in ["/status.json", "/"] {
        let (status, body) = get_async(&addr, page).await?;
        assert_eq!(status, 200, "{page}");
        assert!(!body.contains(wrong), "{page}: {body}");
    }
    cluster.shutdown().await;
    Ok(())
}

/// A plain HTTP/1.1 file server on a loopback port: `GET` and `HEAD` of `files` by path, 404
/// for anything else, one request per connection.
fn file_server(files: Vec<(String, Vec<u8>)>) -> anyhow::Result<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let files = std::sync::Arc::new(files);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let files = files.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut reader = BufReader::new(stream.try_clone()?);
                let mut request = String::new();
                reader.read_line(&mut request)?;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
                        break;
                    }
                }
                let mut parts = request.split_whitespace();
                let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let mut stream = stream;
                match files.iter().find(|(p, _)| p == path) {
                    Some((_, body)) => {
                        write!(
                            stream,
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nETag: \"{}\"\r\n\
                             Last-Modified: Tue, 15 Nov 1994 08:12:31 GMT\r\n\
                             Connection: close\r\n\r\n",
                            body.len(),
                            body.len()
                        )?;
                        if method == "GET" {
                            stream.write_all(body)?;
                        }
                    }
                    None => write!(
                        stream,
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )?,
                }
                stream.flush()
            });
        }
    });
    Ok(addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_of_a_plain_http_server_read_as_files() -> anyhow::Result<()> {
    let mut files = Vec::new();
    let mut want = Vec::new();
    for f in 0..3 {
        let records: Vec<String> = (0..10).map(|r| format!("web{f}-record{r}")).collect();
        files.push((
            format!("/data/part-{f}.tfrecord"),
            tfrecord_bytes(&records)?,
        ));
        want.extend(records);
    }
    want.sort();
    let addr = file_server(files)?;
    let root = format!("http://{addr}/data");
    let roots = vec![root.clone().into()];
    let for_workers = roots.clone();
    let mut cluster = TestCluster::start_with(1, 0, move |c| c.data_roots = roots.clone()).await?;
    for _ in 0..2 {
        cluster
            .add_worker_with(|c| c.data_roots = for_workers.clone())
            .await?;
    }
    // Named one by one: a plain HTTP server has no listing to expand a pattern with.
    let names: Vec<String> = (0..3)
        .map(|f| format!("{root}/part-{f}.tfrecord"))
        .collect();
    let dataset = Dataset::from_slices(sluice_element::Tensor::from_strings(
        vec![names.len()],
        names.iter().map(|n| n.clone().into()).collect(),
    )?)
    .interleave(
        Dataset::element_tfrecord(sluice_element::pb::RecordCompression::None),
        1,
        1,
    );
    let service = cluster
        .client()
        .distribute(&dataset, ShardingPolicy::Off, DistributeOptions::default())
        .await?;
    let got = sorted_strings(&read_epoch(&service, EPOCH).await?);
    // Each of the two workers reads the whole dataset (parallel_epochs).
    let mut twice: Vec<String> = want.iter().flat_map(|r| [r.clone(), r.clone()]).collect();
    twice.sort();
    assert_eq!(got, twice);

    // A missing object fails its read, naming the URL.
    let missing = format!("{root}/absent.tfrecord");
    let dataset = Dataset::from_slices(sluice_element::Tensor::from_strings(
        vec![1],
        vec![missing.clone().into()],
    )?)
    .interleave(
        Dataset::element_tfrecord(sluice_element::pb::RecordCompression::None),
        1,
        1,
    );
    let service = cluster
        .client()
        .distribute(&dataset, ShardingPolicy::Off, DistributeOptions::default())
        .await?;
    let err = read_epoch(&service, EPOCH).await.unwrap_err().to_string();
    assert!(err.contains(&missing), "{err}");
    cluster.shutdown().await;
    Ok(())
}
