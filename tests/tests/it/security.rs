//! The dispatcher with TLS and tokens on: every RPC of the client API and of the Raft peer
//! service refuses a caller without credentials, with a wrong token, or with a certificate of
//! another CA; roles keep clients from admin and worker RPCs; a forged `Vote` changes nothing;
//! a worker cannot act for another worker's tasks.

use sluice_client::{DispatcherClientExt, RegisterOptions};
use sluice_dispatcher::DispatcherConfig;
use sluice_proto::dispatcher as pb;
use sluice_proto::dispatcher::dispatcher_client::DispatcherClient as Stub;
use sluice_proto::raft::raft_peer_client::RaftPeerClient;
use sluice_rpc::{
    DatasetId, DispatcherClient, JobRequest, LeaseRequest, RetryConfig, RpcError, ShardingPolicy,
    TargetWorkers, WorkerHeartbeat, WorkerId,
};
use sluice_security::certs::{generate, CertsPlan};
use sluice_security::{
    ClientSecurity, ClientSecurityFiles, Role, ServerSecurity, ServerSecurityFiles,
};
use sluice_tests::TestCluster;
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

/// Calls every dispatcher RPC and every Raft peer RPC once with `security`; returns each
/// call's status code (`Ok` when the call got past authentication and authorization and
/// succeeded).
async fn call_everything(addr: &str, security: &ClientSecurity) -> Vec<(&'static str, Code)> {
    let channel = match security.endpoint(addr).unwrap().connect().await {
        Ok(channel) => channel,
        // A refused handshake: every call fails the same way.
        Err(_) => return vec![("connect", Code::Unavailable)],
    };
    let mut d = Stub::new(security.authed(channel.clone()));
    let mut r = RaftPeerClient::new(security.authed(channel));
    fn code<T>(r: Result<T, tonic::Status>) -> Code {
        r.map(|_| Code::Ok).unwrap_or_else(|s| s.code())
    }
    let payload = || sluice_proto::raft::RaftPayload { payload: vec![] };
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
        ("AppendEntries", code(r.append_entries(payload()).await)),
        ("Vote", code(r.vote(payload()).await)),
        ("InstallSnapshot", code(r.install_snapshot(payload()).await)),
    ]
}

fn codes_of(calls: &[(&'static str, Code)], code: Code) -> Vec<&'static str> {
    calls
        .iter()
        .filter(|(_, c)| *c == code)
        .map(|(n, _)| *n)
        .collect()
}

#[tokio::test]
async fn every_rpc_refuses_missing_and_wrong_credentials() {
    let creds = Creds::new();
    let cluster = secure_cluster(&creds).await;
    let addr = cluster.dispatcher_addrs();
    let all = 16;

    let nothing = creds.caller(None, None, Role::Client);
    let calls = call_everything(&addr, &nothing).await;
    assert_eq!(
        codes_of(&calls, Code::Unauthenticated).len(),
        all,
        "{calls:?}"
    );

    let wrong_dir = tempfile::tempdir().unwrap();
    let wrong = wrong_dir.path().join("token");
    std::fs::write(&wrong, "not-the-token-of-anyone-here\n").unwrap();
    let calls = call_everything(&addr, &creds.caller(None, Some(wrong), Role::Client)).await;
    assert_eq!(
        codes_of(&calls, Code::Unauthenticated).len(),
        all,
        "{calls:?}"
    );

    // A stranger's client certificate: the handshake is refused (in TLS 1.3 the caller learns
    // it at its first call), so no call reaches a handler.
    let stranger = creds.caller(Some((creds.theirs.path(), "admin")), None, Role::Client);
    let calls = call_everything(&addr, &stranger).await;
    assert!(
        calls
            .iter()
            .all(|(_, c)| matches!(c, Code::Unknown | Code::Unavailable)),
        "{calls:?}"
    );
}

#[tokio::test]
async fn roles_decide_what_a_caller_may_call() {
    let creds = Creds::new();
    let cluster = secure_cluster(&creds).await;
    let addr = cluster.dispatcher_addrs();
    let peer_rpcs = ["AppendEntries", "Vote", "InstallSnapshot"];
    let admin_rpcs = ["AddNode", "RemoveNode"];
    let worker_rpcs = ["WorkerHeartbeat", "WorkerUpdate", "LeaseSplits"];
    let client_rpcs = [
        "RegisterDataset",
        "GetOrCreateJob",
        "GetOrCreateIteration",
        "ClientHeartbeat",
        "ReleaseIterationClient",
        "MaybeRemoveTask",
    ];
    let cases: Vec<(&str, ClientSecurity, Vec<&str>)> = vec![
        (
            "client token",
            creds.caller(None, creds.token("client.token"), Role::Client),
            [&peer_rpcs[..], &admin_rpcs, &worker_rpcs].concat(),
        ),
        (
            "client certificate",
            creds.caller(Some((creds.ours.path(), "client")), None, Role::Client),
            [&peer_rpcs[..], &admin_rpcs, &worker_rpcs].concat(),
        ),
        (
            "worker token",
            creds.caller(None, creds.token("worker-a.tokens"), Role::Worker),
            [&peer_rpcs[..], &admin_rpcs, &client_rpcs].concat(),
        ),
        (
            "admin token",
            creds.caller(None, creds.token("admin.token"), Role::Admin),
            peer_rpcs.to_vec(),
        ),
    ];
    for (name, security, denied) in cases {
        let calls = call_everything(&addr, &security).await;
        let mut got = codes_of(&calls, Code::PermissionDenied);
        let mut want = denied.clone();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want, "{name}: {calls:?}");
        assert!(
            codes_of(&calls, Code::Unauthenticated).is_empty(),
            "{name}: {calls:?}"
        );
    }
}

#[tokio::test]
async fn a_forged_vote_from_a_non_peer_changes_nothing() {
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
    // A vote request for a far higher term, as an attacker would send it, under an admin token.
    let vote = openraft::raft::VoteRequest::<u64> {
        vote: openraft::Vote::new(before.current_term + 100, 99),
        last_log_id: None,
    };
    let admin = creds.caller(None, creds.token("admin.token"), Role::Admin);
    let channel = admin
        .endpoint(&cluster.dispatcher_addrs())
        .unwrap()
        .connect()
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
    let after = cluster
        .replica(leader)
        .unwrap()
        .raft()
        .metrics()
        .borrow()
        .clone();
    assert_eq!(after.current_term, before.current_term);
    assert_eq!(after.current_leader, Some(leader));
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
    };
    a.worker_heartbeat(&beat(&wa), Duration::ZERO)
        .await
        .unwrap();
    let dataset = sluice_dataset::parse("range(100)").unwrap();
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
    let task = sluice_rpc::TaskId(tasks[0].task_id);
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
