//! A secure cluster (TLS and tokens on the dispatcher and the worker), read through the client
//! library: readers with the cluster's CA and the client token read an epoch exactly once, over
//! the raw stream and over coordinated reads (gRPC); a worker that does not accept the reader's
//! token gets its refusal (`Unauthenticated`, `PermissionDenied`) to the reader as the epoch's
//! error instead of being retried forever.

use crate::{assert_exactly_once, read_epoch, read_ints, sorted_ints};
use sluice_client::{ClientError, DispatcherClientExt, DistributeOptions, ShardingPolicy};
use sluice_pipeline::{Dataset, Transform};
use sluice_security::{ServerSecurity, ServerSecurityFiles};
use sluice_tests::TestCluster;
use std::time::Duration;
use tonic::Code;
use tracing::info;

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_worker_serves_readers_with_the_client_token_and_refuses_others(
) -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    let mut cluster = TestCluster::start_secure(1, 1).await?;
    let certs = cluster
        .credentials()
        .expect("a secure cluster has credentials")
        .dir()
        .to_path_buf();
    let client = cluster.client();

    info!("--- the client token: a distributed epoch, each element exactly once");
    let n = 2000;
    let service = client
        .distribute(
            &Dataset::range(n),
            ShardingPolicy::Dynamic,
            DistributeOptions::default(),
        )
        .await?;
    let got = read_epoch(&service, DEADLINE).await?;
    assert_exactly_once(&sorted_ints(&got), n);

    info!("--- the client token: coordinated reads over the worker's gRPC service");
    let options = DistributeOptions {
        job_name: Some("rounds".into()),
        consumer_index: Some(0),
        num_consumers: Some(1),
        ..DistributeOptions::default()
    };
    let mut epoch = client
        .distribute(
            &Dataset::range(10).repeat_forever(),
            ShardingPolicy::Off,
            options,
        )
        .await?
        .iter()
        .await?;
    let rounds = tokio::time::timeout(DEADLINE, read_ints(&mut epoch, 12)).await??;
    assert_eq!(rounds, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]);
    drop(epoch);

    info!("--- a worker that does not know the client token, or gives it another role");
    // The dispatcher accepts the reader; the worker refuses it, and the epoch fails with the
    // worker's answer rather than retrying it.
    let worker_line = std::fs::read_to_string(certs.join("worker.tokens"))?
        .lines()
        .find(|line| line.starts_with("worker "))
        .expect("worker.tokens has a worker line")
        .to_string();
    let client_token = std::fs::read_to_string(certs.join("client.token"))?;
    let misconfigured: [(String, Code, &str); 2] = [
        (
            "client others 0123456789abcdef0123456789abcdef".into(),
            Code::Unauthenticated,
            "not valid on this server",
        ),
        (
            format!("worker trainers {}", client_token.trim()),
            Code::PermissionDenied,
            "may not call Fetch",
        ),
    ];
    let dir = tempfile::tempdir()?;
    for (i, (line, code, why)) in misconfigured.into_iter().enumerate() {
        let tokens = dir.path().join(format!("worker-{i}.tokens"));
        std::fs::write(&tokens, format!("{worker_line}\n{line}\n"))?;
        let security = ServerSecurity::load(&ServerSecurityFiles {
            tls_cert: Some(certs.join("worker.pem")),
            tls_key: Some(certs.join("worker.key")),
            tls_ca: Some(certs.join("ca.pem")),
            token_file: Some(tokens),
            insecure: false,
        })?;
        cluster.kill_worker(i).await?;
        cluster
            .add_worker_with(move |config| config.security = security)
            .await?;
        let service = client
            .distribute(
                &Dataset::range(10),
                ShardingPolicy::Off,
                DistributeOptions::default(),
            )
            .await?;
        match read_epoch(&service, DEADLINE).await {
            Err(e) => match e.downcast::<ClientError>() {
                Ok(ClientError::Rpc { code: got, message }) => {
                    assert_eq!(got, code, "{message}");
                    assert!(message.contains(why), "{message}");
                }
                other => panic!("expected the worker's refusal, got {other:?}"),
            },
            Ok(elements) => panic!("read {} elements from a refusing worker", elements.len()),
        }
    }
    cluster.shutdown().await;
    Ok(())
}
