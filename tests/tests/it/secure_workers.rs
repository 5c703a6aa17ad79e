//! A worker with TLS and tokens, read through the client library: readers with the cluster's CA
//! and the client token read an epoch exactly once, over the raw stream and over coordinated
//! reads (gRPC); readers without a credential, or with a worker's, get the worker's refusal
//! (`Unauthenticated`, `PermissionDenied`) as their epoch's error instead of retrying forever.
//!
//! The dispatcher here speaks plain gRPC behind a TLS terminator in this process (a test
//! stand-in for a dispatcher with a certificate), so the worker's calls to the dispatcher and
//! the readers' use TLS as they would in a secured cluster.

use crate::{assert_exactly_once, read_epoch, read_ints, sorted_ints};
use sluice_client::{
    ClientError, DispatcherClient, DispatcherClientExt, DistributeOptions, RetryConfig,
    ShardingPolicy,
};
use sluice_dataset::{Dataset, Transform};
use sluice_security::certs::{generate, CertsPlan};
use sluice_security::{
    ClientCerts, ClientSecurity, ClientSecurityFiles, Role, ServerSecurity, ServerSecurityFiles,
};
use sluice_tests::TestCluster;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_stream::StreamExt;
use tonic::Code;
use tracing::info;

const DEADLINE: Duration = Duration::from_secs(30);

/// Accepts TLS on 127.0.0.1 port 0 with the dispatcher's certificate and forwards each
/// connection to the plain dispatcher at `to`; returns its address.
async fn tls_terminator(certs: &Path, to: String) -> anyhow::Result<String> {
    let security = ServerSecurity::load(&ServerSecurityFiles {
        tls_cert: Some(certs.join("dispatcher.pem")),
        tls_key: Some(certs.join("dispatcher.key")),
        ..ServerSecurityFiles::default()
    })?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let mut connections = Box::pin(sluice_security::incoming(
        listener,
        security.tls_config(ClientCerts::Optional)?,
    ));
    tokio::spawn(async move {
        while let Some(Ok(mut inbound)) = connections.next().await {
            let to = to.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    Ok(addr)
}

/// A reader of `dispatcher` with the cluster's CA and `token_file` read as `role`.
fn reader(
    dispatcher: &str,
    certs: &Path,
    token_file: Option<PathBuf>,
    role: Role,
) -> anyhow::Result<DispatcherClient> {
    let security = ClientSecurity::load(
        &ClientSecurityFiles {
            tls_ca: Some(certs.join("ca.pem")),
            token_file,
            ..ClientSecurityFiles::default()
        },
        role,
    )?;
    Ok(DispatcherClient::connect(
        dispatcher,
        RetryConfig::default(),
        security,
    )?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_worker_serves_readers_with_the_client_token_and_refuses_others(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let certs = dir.path().to_path_buf();
    generate(&CertsPlan {
        out: certs.clone(),
        hosts: Vec::new(),
        workers: Vec::new(),
        days: 1,
    })?;
    let mut cluster: TestCluster = sluice_tests::start_cluster(1, 0).await?;
    let dispatcher = tls_terminator(&certs, cluster.dispatcher_addrs()).await?;
    let worker_security = ServerSecurity::load(&ServerSecurityFiles {
        tls_cert: Some(certs.join("worker.pem")),
        tls_key: Some(certs.join("worker.key")),
        tls_ca: Some(certs.join("ca.pem")),
        token_file: Some(certs.join("worker.tokens")),
        insecure: false,
    })?;
    let worker_dispatcher = dispatcher.clone();
    cluster
        .add_worker_with(move |config| {
            config.dispatcher = worker_dispatcher;
            config.security = worker_security;
        })
        .await?;

    info!("--- the client token: a distributed epoch, each element exactly once");
    let client = reader(
        &dispatcher,
        &certs,
        Some(certs.join("client.token")),
        Role::Client,
    )?;
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

    info!("--- no credential, or a worker's: the epoch fails with the worker's refusal");
    let refused: [(Option<PathBuf>, Role, Code, &str); 2] = [
        (None, Role::Client, Code::Unauthenticated, "no credentials"),
        (
            Some(certs.join("worker.tokens")),
            Role::Worker,
            Code::PermissionDenied,
            "may not call Fetch",
        ),
    ];
    for (token_file, role, code, why) in refused {
        let client = reader(&dispatcher, &certs, token_file, role)?;
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
            Ok(elements) => panic!("read {} elements without a credential", elements.len()),
        }
    }
    cluster.shutdown().await;
    Ok(())
}
