//! The dispatcher with TLS and tokens on: every RPC of the client API and of the Raft peer
//! service refuses a caller without credentials, with a wrong token, or with a certificate of
//! another CA; roles keep clients from admin and worker RPCs; a forged `Vote` changes nothing;
//! a worker cannot act for another worker's tasks.

use sluice_client::{DispatcherClientExt, RegisterOptions};
use sluice_dispatcher::DispatcherConfig;
use sluice_dispatcher::TypeConfig;
use sluice_proto::dispatcher as pb;
use sluice_proto::dispatcher::dispatcher_client::DispatcherClient as Stub;
use sluice_proto::raft::raft_peer_client::RaftPeerClient;
use sluice_rpc::{DispatcherClient, JobRequest, RetryConfig, RpcError, WorkerHeartbeat};
use sluice_security::certs::{generate, CertsPlan};
use sluice_security::{
    ClientSecurity, ClientSecurityFiles, Role, ServerRole, ServerSecurity, ServerSecurityFiles,
};
use sluice_tests::TestCluster;
use sluice_types::{DatasetId, LeaseRequest, ShardingPolicy, TargetWorkers, WorkerId};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::Code;

/// Certificates and tokens of two clusters (`ours` is served, `theirs` is a stranger's), with
/// workers "a" and "b".
struct Creds {
    ours: tempfile::TempDir,
    theirs: tempfile::TempDir,
}

impl Creds {
    fn new() -> Creds {
        let creds = Creds {
            ours: tempfile::tempdir().unwrap(),
            theirs: tempfile::tempdir().unwrap(),
        };
        for dir in [creds.ours.path(), creds.theirs.path()] {
            generate(&CertsPlan {
                out: dir.to_path_buf(),
                hosts: vec![],
                worker_hosts: vec![],
                workers: vec!["a".into(), "b".into()],
                days: 1,
            })
            .unwrap();
        }
        creds
    }

    fn server(&self) -> ServerSecurity {
        let d = self.ours.path();
        ServerSecurity::load(&ServerSecurityFiles {
            tls_cert: Some(d.join("dispatcher.pem")),
            tls_key: Some(d.join("dispatcher.key")),
            tls_ca: Some(d.join("ca.pem")),
            token_file: Some(d.join("tokens")),
            insecure: false,
        })
        .unwrap()
    }

    /// A caller trusting our CA, with the given client certificate (from `cert_dir`) and token
    /// file, acting as `role`.
    fn caller(
        &self,
        cert: Option<(&Path, &str)>,
        tokens: Option<PathBuf>,
        role: Role,
    ) -> ClientSecurity {
        ClientSecurity::load(
            &ClientSecurityFiles {
                tls_ca: Some(self.ours.path().join("ca.pem")),
                tls_cert: cert.map(|(dir, name)| dir.join(format!("{name}.pem"))),
                tls_key: cert.map(|(dir, name)| dir.join(format!("{name}.key"))),
                token_file: tokens,
            },
            role,
        )
        .unwrap()
    }

    fn token(&self, file: &str) -> Option<PathBuf> {
        Some(self.ours.path().join(file))
    }
}

async fn secure_cluster(creds: &Creds) -> TestCluster {
    let security = creds.server();
    sluice_tests::init_tracing();
    TestCluster::start_with(1, 0, move |c: &mut DispatcherConfig| {
        c.security = security.clone();
    })
    .await
    .expect("a secure cluster starts")
}

/// Calls every dispatcher RPC (on `addr`) and every Raft peer RPC (on `peer_addr`) once with
/// `security`; returns each call's status code (`Ok` when the call got past authentication and
/// authorization and succeeded).
async fn call_everything(
    addr: &str,
    peer_addr: &str,
    security: &ClientSecurity,
) -> Vec<(&'static str, Code)> {
    fn code<T>(r: Result<T, tonic::Status>) -> Code {
        r.map(|_| Code::Ok).unwrap_or_else(|s| s.code())
    }
    let refused = |names: &[&'static str]| names.iter().map(|n| (*n, Code::Unavailable)).collect();
    let mut calls: Vec<(&'static str, Code)> = match security
        .connect(&security.endpoint(addr).unwrap(), ServerRole::Dispatcher)
        .await
    {
        // A refused handshake: no call gets through.
        Err(_) => refused(&["dispatcher"]),
        Ok(channel) => {
            let mut d = Stub::new(security.authed(channel));
            vec![
                (
                    "RegisterDataset",
                    code(
                        d.register_dataset(pb::RegisterDatasetRequest::default())
                            .await,
                    ),
                ),
                (
                    "GetDataset",
                    code(d.get_dataset(pb::GetDatasetRequest::default()).await),
                ),
                (
                    "GetOrCreateJob",
                    code(
                        d.get_or_create_job(pb::GetOrCreateJobRequest::default())
                            .await,
                    ),
                ),
                (
                    "GetOrCreateIteration",
                    code(
                        d.get_or_create_iteration(pb::GetOrCreateIterationRequest::default())
                            .await,
                    ),
                ),
                (
                    "ClientHeartbeat",
                    code(
                        d.client_heartbeat(pb::ClientHeartbeatRequest::default())
                            .await,
                    ),
                ),
                (
                    "ReleaseIterationClient",
                    code(
                        d.release_iteration_client(pb::ReleaseIterationClientRequest::default())
                            .await,
                    ),
                ),
                (
                    "WorkerHeartbeat",
                    code(
                        d.worker_heartbeat(pb::WorkerHeartbeatRequest::default())
                            .await,
                    ),
                ),
                (
                    "WorkerUpdate",
                    code(d.worker_update(pb::WorkerUpdateRequest::default()).await),
                ),
                (
                    "LeaseSplits",
                    code(d.lease_splits(pb::LeaseSplitsRequest::default()).await),
                ),
                (
                    "LeaseSplitsBatch",
                    code(
                        d.lease_splits_batch(pb::LeaseSplitsBatchRequest::default())
                            .await,
                    ),
                ),
                (
                    "MaybeRemoveTask",
                    code(
                        d.maybe_remove_task(pb::MaybeRemoveTaskRequest::default())
                            .await,
                    ),
                ),
                (
                    "GetStatus",
                    code(d.get_status(pb::GetStatusRequest::default()).await),
                ),
                (
                    "AddNode",
                    code(d.add_node(pb::AddNodeRequest::default()).await),
                ),
                (
                    "RemoveNode",
                    code(d.remove_node(pb::RemoveNodeRequest::default()).await),
                ),
                (
                    "PutBlob",
                    code(
                        d.put_blob(tokio_stream::iter(Vec::<pb::PutBlobChunk>::new()))
                            .await,
                    ),
                ),
                (
                    "GetBlob",
                    code(d.get_blob(pb::GetBlobRequest::default()).await),
                ),
            ]
        }
    };
    let payload = || sluice_proto::raft::RaftPayload { payload: vec![] };
    match security
        .connect(
            &security.endpoint(peer_addr).unwrap(),
            ServerRole::Dispatcher,
        )
        .await
    {
        Err(_) => calls.extend(refused(&["peer"])),
        Ok(channel) => {
            let mut r = RaftPeerClient::new(security.authed(channel));
            calls.extend([
                ("AppendEntries", code(r.append_entries(payload()).await)),
                ("Vote", code(r.vote(payload()).await)),
                ("InstallSnapshot", code(r.install_snapshot(payload()).await)),
                (
                    "Announce",
                    code(
                        r.announce(sluice_proto::raft::AnnounceRequest::default())
                            .await,
                    ),
                ),
                (
                    "Probe",
                    code(r.probe(sluice_proto::raft::ProbeRequest::default()).await),
                ),
                (
                    "PushBlob",
                    code(
                        r.push_blob(tokio_stream::iter(
                            Vec::<sluice_proto::raft::BlobPart>::new(),
                        ))
                        .await,
                    ),
                ),
                (
                    "FetchBlob",
                    code(
                        r.fetch_blob(sluice_proto::raft::FetchBlobRequest::default())
                            .await,
                    ),
                ),
            ]);
        }
    }
    calls
}

fn codes_of(calls: &[(&'static str, Code)], code: Code) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = calls
        .iter()
        .filter(|(_, c)| *c == code)
        .map(|(n, _)| *n)
        .collect();
    names.sort_unstable();
    names
}

/// Calls that failed in the transport (a refused TLS handshake), not with an answer. Which
/// code the client reports depends on when it sees the connection close: a call in flight then
/// reads `Cancelled` (no handler of ours answers with it).
fn refused_by_tls(calls: &[(&'static str, Code)]) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = calls
        .iter()
        .filter(|(_, c)| matches!(c, Code::Unknown | Code::Unavailable | Code::Cancelled))
        .map(|(n, _)| *n)
        .collect();
    names.sort_unstable();
    names
}

const DISPATCHER_RPCS: [&str; 16] = [
    "AddNode",
    "ClientHeartbeat",
    "GetBlob",
    "GetDataset",
    "GetOrCreateIteration",
    "GetOrCreateJob",
    "GetStatus",
    "LeaseSplits",
    "LeaseSplitsBatch",
    "MaybeRemoveTask",
    "PutBlob",
    "RegisterDataset",
    "ReleaseIterationClient",
    "RemoveNode",
    "WorkerHeartbeat",
    "WorkerUpdate",
];
const PEER_RPCS: [&str; 7] = [
    "Announce",
    "AppendEntries",
    "FetchBlob",
    "InstallSnapshot",
    "Probe",
    "PushBlob",
    "Vote",
];
const ADMIN_RPCS: [&str; 2] = ["AddNode", "RemoveNode"];
const WORKER_RPCS: [&str; 4] = [
    "LeaseSplits",
    "LeaseSplitsBatch",
    "WorkerHeartbeat",
    "WorkerUpdate",
];
const CLIENT_RPCS: [&str; 7] = [
    "ClientHeartbeat",
    "GetOrCreateIteration",
    "GetOrCreateJob",
    "MaybeRemoveTask",
    "PutBlob",
    "RegisterDataset",
    "ReleaseIterationClient",
];

fn sorted(names: &[&'static str]) -> Vec<&'static str> {
    let mut names = names.to_vec();
    names.sort_unstable();
    names
}

#[tokio::test]
async fn every_rpc_refuses_missing_and_wrong_credentials() {
    let creds = Creds::new();
    let cluster = secure_cluster(&creds).await;
    let addr = cluster.dispatcher_addrs();
    let peer_addr = cluster.replica_peer_addr(1).unwrap().to_string();

    // No credential: every client API call is Unauthenticated; the peer listener, which
    // requires a replica's certificate, refuses the connection itself.
    let nothing = creds.caller(None, None, Role::Client);
    let calls = call_everything(&addr, &peer_addr, &nothing).await;
    assert_eq!(
        codes_of(&calls, Code::Unauthenticated),
        sorted(&DISPATCHER_RPCS),
        "{calls:?}"
    );
    assert_eq!(refused_by_tls(&calls), sorted(&PEER_RPCS), "{calls:?}");

    let wrong_dir = tempfile::tempdir().unwrap();
    let wrong = wrong_dir.path().join("token");
    std::fs::write(&wrong, "not-the-token-of-anyone-here\n").unwrap();
    let calls = call_everything(
        &addr,
        &peer_addr,
        &creds.caller(None, Some(wrong), Role::Client),
    )
    .await;
    assert_eq!(
        codes_of(&calls, Code::Unauthenticated),
        sorted(&DISPATCHER_RPCS),
        "{calls:?}"
    );
    assert_eq!(refused_by_tls(&calls), sorted(&PEER_RPCS), "{calls:?}");

    // A stranger's certificates, even a replica's: the handshake is refused (in TLS 1.3 the
    // caller learns it at its first call), so no call reaches a handler.
    for cert in ["admin", "dispatcher"] {
        let stranger = creds.caller(Some((creds.theirs.path(), cert)), None, Role::Client);
        let calls = call_everything(&addr, &peer_addr, &stranger).await;
        assert_eq!(
            refused_by_tls(&calls).len(),
            calls.len(),
            "{cert}: {calls:?}"
        );
    }
}

#[tokio::test]
async fn roles_decide_what_a_caller_may_call() {
    let creds = Creds::new();
    let cluster = secure_cluster(&creds).await;
    let addr = cluster.dispatcher_addrs();
    let peer_addr = cluster.replica_peer_addr(1).unwrap().to_string();
    let ours = creds.ours.path();
    // (caller, its security, dispatcher RPCs denied, whether it has a certificate: without one
    // the peer listener refuses the connection; with one of another role, every peer RPC is
    // denied).
    let cases: Vec<(&str, ClientSecurity, Vec<&str>, bool)> = vec![
        (
            "client token",
            creds.caller(None, creds.token("client.token"), Role::Client),
            [&ADMIN_RPCS[..], &WORKER_RPCS].concat(),
            false,
        ),
        (
            "client certificate",
            creds.caller(Some((ours, "client")), None, Role::Client),
            [&ADMIN_RPCS[..], &WORKER_RPCS].concat(),
            true,
        ),
        (
            "worker token",
            creds.caller(None, creds.token("worker-a.tokens"), Role::Worker),
            [&ADMIN_RPCS[..], &CLIENT_RPCS].concat(),
            false,
        ),
        (
            "worker certificate",
            creds.caller(Some((ours, "worker-a")), None, Role::Worker),
            [&ADMIN_RPCS[..], &CLIENT_RPCS].concat(),
            true,
        ),
        (
            "admin token",
            creds.caller(None, creds.token("admin.token"), Role::Admin),
            vec![],
            false,
        ),
        (
            "admin certificate",
            creds.caller(Some((ours, "admin")), None, Role::Admin),
            vec![],
            true,
        ),
    ];
    for (name, security, denied, has_cert) in cases {
        let calls = call_everything(&addr, &peer_addr, &security).await;
        let mut want = denied.clone();
        if has_cert {
            want.extend(PEER_RPCS);
        } else {
            assert_eq!(
                refused_by_tls(&calls),
                sorted(&PEER_RPCS),
                "{name}: {calls:?}"
            );
        }
        assert_eq!(
            codes_of(&calls, Code::PermissionDenied),
            sorted(&want),
            "{name}: {calls:?}"
        );
        assert!(
            codes_of(&calls, Code::Unauthenticated).is_empty(),
            "{name}: {calls:?}"
        );
    }
}
#[tokio::test]
async fn forged_raft_requests_from_a_non_peer_change_nothing() {
    let creds = Creds::new();
    let cluster = secure_cluster(&creds).await;
    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .await
        .unwrap();
    let before = cluster
        .replica(leader)
        .unwrap()
        .raft()
        .metrics()
        .borrow()
        .clone();
    // A vote request for a far higher term, as an attacker would send it, on the peer
    // listener, with the cluster's admin certificate (a valid certificate, but not a peer's).
    let vote = openraft::raft::VoteRequest::<u64> {
        vote: openraft::Vote::new(before.current_term + 100, 99),
        last_log_id: None,
    };
    let admin = creds.caller(Some((creds.ours.path(), "admin")), None, Role::Admin);
    let endpoint = admin
        .endpoint(cluster.replica_peer_addr(leader).unwrap())
        .unwrap();
    let channel = admin
        .connect(&endpoint, ServerRole::Dispatcher)
        .await
        .unwrap();
    let mut raft = RaftPeerClient::new(admin.authed(channel));
    let status = raft
        .vote(sluice_proto::raft::RaftPayload {
            payload: sluice_journal::codec::encode(&vote),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    // An append from a "leader" of a far higher term: it would depose the leader and could
    // overwrite the log.
    let append = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote: openraft::Vote::new_committed(before.current_term + 100, 99),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let status = raft
        .append_entries(sluice_proto::raft::RaftPayload {
            payload: sluice_journal::codec::encode(&append),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let after = cluster
        .replica(leader)
        .unwrap()
        .raft()
        .metrics()
        .borrow()
        .clone();
    assert_eq!(after.current_term, before.current_term);
    assert_eq!(after.current_leader, Some(leader));
    assert_eq!(after.last_applied, before.last_applied);
}

#[tokio::test]
async fn a_worker_cannot_act_for_another_workers_task() {
    let creds = Creds::new();
    let cluster = secure_cluster(&creds).await;
    let addr = cluster.dispatcher_addrs();
    let retry = RetryConfig {
        retry_timeout: Duration::from_secs(10),
        ..RetryConfig::default()
    };
    let as_role = |file: &str, role| {
        DispatcherClient::connect(
            &addr,
            retry.clone(),
            creds.caller(None, creds.token(file), role),
        )
        .unwrap()
    };
    let a = as_role("worker-a.tokens", Role::Worker);
    let b = as_role("worker-b.tokens", Role::Worker);
    let client = as_role("client.token", Role::Client);

    // Worker a registers (no worker serves at this address: the dispatcher only records it).
    let wa = WorkerId("127.0.0.1:1".into());
    let beat = |worker: &WorkerId| WorkerHeartbeat {
        worker: worker.clone(),
        current_tasks: vec![],
        tags: vec![],
        incarnation: 0,
    };
    a.worker_heartbeat(&beat(&wa), Duration::ZERO)
        .await
        .unwrap();
    let dataset = sluice_pipeline::parse("range(100)").unwrap();
    let options = RegisterOptions {
        dataset_id: Some("d".into()),
        ..RegisterOptions::default()
    };
    let dataset = DatasetId(client.register_dataset(&dataset, &options).await.unwrap());
    let job = client
        .get_or_create_job(&JobRequest {
            dataset_id: dataset,
            sharding: ShardingPolicy::Dynamic,
            job_name: Some("j".into()),
            num_consumers: None,
            use_cross_trainer_cache: false,
            target_workers: TargetWorkers::Any,
            // Simulated workers number no elements: tf.data's delivery.
            delivery: sluice_types::Delivery::AtMostOnce,
        })
        .await
        .unwrap();
    let iteration = client.get_or_create_iteration(job, 0).await.unwrap();
    let tasks = a
        .worker_heartbeat(&beat(&wa), Duration::ZERO)
        .await
        .unwrap()
        .new_tasks;
    assert_eq!(tasks.len(), 1, "worker a holds the iteration's task");
    let task = sluice_types::TaskId(tasks[0].task_id);
    let lease = LeaseRequest {
        iteration_id: iteration.iteration_id,
        task_id: task,
        provider: 0,
        repetition: 0,
        max_splits: 4,
    };

    let denied = |r: Result<(), RpcError>| {
        matches!(
            r,
            Err(RpcError::Status {
                code: Code::PermissionDenied,
                ..
            })
        )
    };
    assert!(
        denied(b.worker_update(&wa, &[task]).await),
        "b finished a's task"
    );
    assert!(
        denied(b.lease_splits(&lease).await.map(|_| ())),
        "b leased a's splits"
    );
    assert!(
        denied(
            b.worker_heartbeat(&beat(&wa), Duration::ZERO)
                .await
                .map(|_| ())
        ),
        "b heartbeat as a"
    );
    let wb = WorkerId("127.0.0.1:2".into());
    b.worker_heartbeat(&beat(&wb), Duration::ZERO)
        .await
        .unwrap();
    assert!(
        denied(b.worker_update(&wb, &[task]).await),
        "b finished a's task as itself"
    );

    // Nothing was applied: a's task is unfinished and its splits all still to lease.
    let first = a.lease_splits(&lease).await.unwrap();
    assert_eq!((first.start, first.repetition), (0, 0), "{first:?}");
    a.worker_update(&wa, &[task]).await.unwrap();
}
