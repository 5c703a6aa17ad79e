//! Data roots through real servers: a raw `RegisterDataset` that lists files outside the
//! dispatcher's roots is refused naming the path and the roots and changes nothing; a file below
//! them registers (stored canonical) and reads.

use sluice_client::DispatcherClientExt;
use sluice_client::{DistributeOptions, RpcError, ShardingPolicy};
use sluice_element::pb as dpb;
use sluice_pipeline::Dataset;
use sluice_proto::dispatcher as pb;
use tracing::info;

/// A lines definition whose files are listed, as a raw request may send it.
fn listed(files: &[String]) -> dpb::DatasetDef {
    let mut def = Dataset::files("listed").lines().into_def();
    let Some(dpb::source::Kind::Files(fs)) = def.source.as_mut().and_then(|s| s.kind.as_mut())
    else {
        panic!("a files source");
    };
    fs.files = files.to_vec();
    def
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_file_list_is_checked_against_the_dispatchers_roots() -> anyhow::Result<()> {
    let cluster = sluice_tests::start_cluster(1, 1).await?;
    let client = cluster.client();
    let root = std::fs::canonicalize(cluster.data_root())?;
    let inside = root.join("a.txt");
    std::fs::write(&inside, "one\ntwo\n")?;
    let outside = tempfile::tempdir()?;
    let secret = std::fs::canonicalize(outside.path())?.join("secret.txt");
    std::fs::write(&secret, "do not read\n")?;
    let link = root.join("link.txt");
    std::os::unix::fs::symlink(&secret, &link)?;
    let applied_before = Some(cluster.settled_index(1, sluice_tests::HANG).await?);
    let metadata = pb::DatasetMetadata::default();

    info!("--- files outside the roots, through a symlink, and special files are refused");
    let path = |p: &std::path::Path| p.display().to_string();
    for (files, named) in [
        (vec!["/etc/passwd".to_string()], "/etc/passwd".to_string()),
        (vec![path(&inside), path(&secret)], path(&secret)),
        (vec![path(&link)], path(&link)),
        (
            vec![format!("{}/../{}", root.display(), "x")],
            format!("{}/../x", root.display()),
        ),
        (vec!["/dev/zero".to_string()], "/dev/zero".to_string()),
        (
            vec!["/proc/self/environ".to_string()],
            "/proc/self/environ".to_string(),
        ),
    ] {
        let err = client
            .register_dataset_def(&listed(&files), None, &metadata)
            .await
            .unwrap_err();
        let RpcError::Status { code, message } = &err else {
            panic!("{files:?}: expected PermissionDenied, got {err:?}");
        };
        assert_eq!(*code, tonic::Code::PermissionDenied, "{files:?}: {message}");
        assert!(
            message.starts_with(&format!("refused to read '{named}': "))
                && message.contains(&format!("outside the data roots ({})", root.display())),
            "{files:?}: {message}"
        );
    }
    assert_eq!(
        cluster.applied_index(1),
        applied_before,
        "a refused registration reached the log"
    );

    info!("--- a listed file below the roots registers, stored canonical, and reads");
    let dotted = format!("{}/./a.txt", root.display());
    let id = client
        .register_dataset_def(&listed(&[dotted]), None, &metadata)
        .await?;
    let stored = client.get_dataset(&id).await?;
    assert_eq!(stored.dataset, Some(listed(&[path(&inside)])));
    let service = client
        .distribute(
            &Dataset::files(&path(&inside)).lines(),
            ShardingPolicy::Off,
            DistributeOptions::default(),
        )
        .await?;
    let got: Vec<_> = crate::read_epoch(&service, std::time::Duration::from_secs(60))
        .await?
        .iter()
        .map(|e| e.to_json())
        .collect();
    assert_eq!(got, ["one", "two"]);
    cluster.shutdown().await;
    Ok(())
}
