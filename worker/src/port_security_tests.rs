//! The worker's port with TLS, tokens and client certificates: every RPC and the raw stream
//! admit readers and refuse everyone else, each the same way on both transports.

use super::tests::{
    grpc_client, ints, read_grpc_as, read_raw_as, start_with, task, Worker, DEADLINE,
};
use sluice_pipeline::Dataset;
use sluice_proto::worker::{GetElementRequest, GetWorkerTasksRequest};
use sluice_security::certs::{generate, CertsPlan};
use sluice_security::{
    ClientSecurity, ClientSecurityFiles, Role, ServerSecurity, ServerSecurityFiles,
};
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;
use tonic::{Code, Status};
use tracing::info;

/// A cluster's certificates and tokens, as `sluice certs` makes them.
fn credentials(dir: &Path) -> PathBuf {
    generate(&CertsPlan {
        out: dir.to_path_buf(),
        hosts: Vec::new(),
        worker_hosts: vec![],
        workers: Vec::new(),
        days: 1,
    })
    .expect("certificates");
    dir.to_path_buf()
}

/// What a caller presents: a CA to verify the worker with, a client certificate, a token file.
fn caller(
    ca: Option<PathBuf>,
    cert: Option<(&Path, &str)>,
    token_file: Option<PathBuf>,
) -> ClientSecurity {
    let files = ClientSecurityFiles {
        tls_ca: ca,
        tls_cert: cert.map(|(dir, name)| dir.join(format!("{name}.pem"))),
        tls_key: cert.map(|(dir, name)| dir.join(format!("{name}.key"))),
        token_file,
    };
    ClientSecurity::load(&files, Role::Client).expect("caller credentials")
}

/// How one call came out, in the words of the table.
fn outcome<T>(result: Result<T, Status>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(status) => match status.code() {
            Code::Unauthenticated => "unauthenticated",
            Code::PermissionDenied => "permission denied",
            Code::Unavailable if status.message() == "Task 999 not found" => "no such task",
            _ => "failed",
        },
    }
}

/// `Fetch`, `GetElement`, `GetWorkerTasks` and a raw stream, each as `security`; the two
/// streams read tasks `2 * row + 1` and `2 * row + 2` (each a `range(50)`).
async fn calls(worker: &Worker, security: &ClientSecurity, row: u64) -> [&'static str; 4] {
    let fetch = read_grpc_as(security, worker.addr, 2 * row + 1)
        .await
        .map(|e| {
            assert_eq!(ints(&e), (0..50).collect::<Vec<_>>());
        });
    let get_element = async {
        let mut grpc = grpc_client(security, worker.addr).await?;
        grpc.get_element(GetElementRequest {
            task_id: 999,
            ..Default::default()
        })
        .await
    }
    .await;
    let get_worker_tasks = async {
        let mut grpc = grpc_client(security, worker.addr).await?;
        grpc.get_worker_tasks(GetWorkerTasksRequest {}).await
    }
    .await;
    let raw = read_raw_as(security, worker.addr, 2 * row + 2, 8)
        .await
        .map(|e| {
            assert_eq!(ints(&e), (0..50).collect::<Vec<_>>());
        });
    [
        outcome(fetch),
        outcome(get_element),
        outcome(get_worker_tasks),
        outcome(raw),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_port_admits_readers_and_refuses_everyone_else() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ours = credentials(&dir.path().join("ours"));
    let theirs = credentials(&dir.path().join("theirs"));
    let wrong_token = dir.path().join("wrong.token");
    std::fs::write(&wrong_token, "0123456789abcdef0123456789abcdef").expect("write");
    // The worker's own file: its `worker` line and the cluster's `client` line.
    let worker_token = ours.join("worker.tokens");
    let ca = || Some(ours.join("ca.pem"));

    let security = ServerSecurity::load(&ServerSecurityFiles {
        tls_cert: Some(ours.join("worker.pem")),
        tls_key: Some(ours.join("worker.key")),
        tls_ca: Some(ours.join("ca.pem")),
        token_file: Some(worker_token.clone()),
        insecure: false,
    })
    .expect("worker security");
    let worker_caller = ClientSecurity::load(
        &ClientSecurityFiles {
            tls_ca: ca(),
            token_file: Some(worker_token.clone()),
            ..ClientSecurityFiles::default()
        },
        Role::Worker,
    )
    .expect("a worker's credentials");
    const READS: [&str; 4] = ["ok", "no such task", "ok", "ok"];
    let rows: Vec<(&str, ClientSecurity, [&str; 4])> = vec![
        (
            "client token",
            caller(ca(), None, Some(ours.join("client.token"))),
            READS,
        ),
        (
            "client certificate",
            caller(ca(), Some((&ours, "client")), None),
            READS,
        ),
        (
            "admin certificate",
            caller(ca(), Some((&ours, "admin")), None),
            READS,
        ),
        (
            "no credential",
            caller(ca(), None, None),
            ["unauthenticated"; 4],
        ),
        (
            "wrong token",
            caller(ca(), None, Some(wrong_token.clone())),
            ["unauthenticated"; 4],
        ),
        (
            // A wrong token is not rescued by a good certificate.
            "wrong token, good certificate",
            caller(ca(), Some((&ours, "client")), Some(wrong_token.clone())),
            ["unauthenticated"; 4],
        ),
        ("worker token", worker_caller, ["permission denied"; 4]),
        (
            "worker certificate",
            caller(ca(), Some((&ours, "worker")), None),
            ["permission denied"; 4],
        ),
        (
            "certificate of another CA",
            caller(ca(), Some((&theirs, "client")), None),
            ["failed"; 4],
        ),
        (
            "trusting another CA",
            caller(
                Some(theirs.join("ca.pem")),
                None,
                Some(ours.join("client.token")),
            ),
            ["failed"; 4],
        ),
        (
            "plain TCP",
            caller(None, None, Some(ours.join("client.token"))),
            ["failed"; 4],
        ),
    ];
    let tasks = (1..=2 * rows.len() as u64)
        .map(|id| task(id, Dataset::range(50)))
        .collect();
    let worker = start_with(tasks, &security).await;
    for (row, (name, security, want)) in rows.into_iter().enumerate() {
        info!("--- {name}");
        let got = tokio::time::timeout(DEADLINE, calls(&worker, &security, row as u64))
            .await
            .unwrap_or_else(|_| panic!("{name}: every call answers in time"));
        assert_eq!(got, want, "{name}: Fetch, GetElement, GetWorkerTasks, raw");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_handshake_with_an_oversized_token_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ours = credentials(dir.path());
    let security = ServerSecurity::load(&ServerSecurityFiles {
        token_file: Some(ours.join("worker.tokens")),
        ..ServerSecurityFiles::default()
    })
    .expect("worker security");
    let worker = start_with(vec![task(1, Dataset::range(5))], &security).await;
    let mut socket = tokio::net::TcpStream::connect(worker.addr)
        .await
        .expect("connect");
    socket
        .write_all(&sluice_rpc::raw_frame::MAGIC)
        .await
        .expect("write");
    socket
        .write_all(&u32::MAX.to_le_bytes())
        .await
        .expect("write");
    let mut frames = sluice_rpc::raw_frame::FrameReader::new(socket, 4);
    let status = tokio::time::timeout(DEADLINE, frames.next())
        .await
        .expect("an answer in time")
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    assert!(status.message().contains("at most 4096"), "{status}");

    info!("--- a token-only worker (no TLS) still reads for a client token");
    let reader = caller(None, None, Some(ours.join("client.token")));
    let elements = read_raw_as(&reader, worker.addr, 1, 2).await.expect("read");
    assert_eq!(ints(&elements), vec![0, 1, 2, 3, 4]);
}
