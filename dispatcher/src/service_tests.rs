//! The handlers' mapping of errors to gRPC codes, end to end over gRPC on real replicas (port
//! 0, temp dirs): each bad request gets the code and message its error chose, and a follower
//! answers `Unavailable` with the leader's client address in `x-sluice-leader`. Raft and the
//! client API are served each on its own port only.

use crate::{DispatcherConfig, DispatcherHandle};
use sluice_proto::dispatcher as pb;
use sluice_proto::dispatcher::dispatcher_client::DispatcherClient;
use sluice_proto::raft as pb_raft;
use sluice_proto::raft::raft_peer_client::RaftPeerClient;
use sluice_proto::LEADER_METADATA_KEY;
use std::collections::BTreeMap;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(20);

async fn client(handle: &DispatcherHandle) -> DispatcherClient<Channel> {
    DispatcherClient::connect(format!("http://{}", handle.addr()))
        .await
        .expect("connect to the dispatcher")
}

/// The first start of replica `id`, with its data dir in `dir`.
fn config(id: u64, dir: &tempfile::TempDir) -> DispatcherConfig {
    DispatcherConfig {
        id,
        data_dir: dir.path().join(format!("node-{id}")),
        init: true,
        ..DispatcherConfig::default()
    }
}

/// The code and message of a failed call.
fn failure<T: std::fmt::Debug>(
    result: Result<tonic::Response<T>, tonic::Status>,
) -> (Code, String) {
    match result {
        Err(status) => (status.code(), status.message().to_string()),
        Ok(response) => panic!("expected an error, got {response:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_request_gets_the_code_of_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let handle = DispatcherHandle::start(config(1, &dir)).await.unwrap();
    handle.wait_for_leader(WAIT).await.unwrap();
    let mut c = client(&handle).await;

    let cases: Vec<(&str, (Code, String), Code, &str)> = vec![
        (
            "register_dataset without a dataset",
            failure(
                c.register_dataset(pb::RegisterDatasetRequest::default())
                    .await,
            ),
            Code::InvalidArgument,
            "`dataset` is required",
        ),
        (
            "get_dataset of an unknown id",
            failure(
                c.get_dataset(pb::GetDatasetRequest {
                    dataset_id: "nope".into(),
                })
                .await,
            ),
            Code::NotFound,
            "Dataset id nope not found",
        ),
        (
            "get_or_create_job with an unknown sharding policy",
            failure(
                c.get_or_create_job(pb::GetOrCreateJobRequest {
                    dataset_id: "nope".into(),
                    sharding_policy: 99,
                    ..Default::default()
                })
                .await,
            ),
            Code::InvalidArgument,
            "sharding_policy 99",
        ),
        (
            "get_or_create_job of an unknown dataset",
            failure(
                c.get_or_create_job(pb::GetOrCreateJobRequest {
                    dataset_id: "nope".into(),
                    ..Default::default()
                })
                .await,
            ),
            Code::NotFound,
            "Dataset id nope not found",
        ),
        (
            "get_or_create_iteration of an unknown job",
            failure(
                c.get_or_create_iteration(pb::GetOrCreateIterationRequest {
                    job_id: 1,
                    ..Default::default()
                })
                .await,
            ),
            Code::NotFound,
            "Job with id 1 not found",
        ),
        (
            "client_heartbeat of an unknown client",
            failure(
                c.client_heartbeat(pb::ClientHeartbeatRequest {
                    iteration_client_id: 7,
                    ..Default::default()
                })
                .await,
            ),
            Code::NotFound,
            "Iteration client id not found: 7",
        ),
        (
            "release_iteration_client of an unknown client",
            failure(
                c.release_iteration_client(pb::ReleaseIterationClientRequest {
                    iteration_client_id: 7,
                    ..Default::default()
                })
                .await,
            ),
            Code::NotFound,
            "Iteration client id not found: 7",
        ),
        (
            "worker_heartbeat without an address",
            failure(
                c.worker_heartbeat(pb::WorkerHeartbeatRequest::default())
                    .await,
            ),
            Code::InvalidArgument,
            "`worker_address` is required",
        ),
        (
            "worker_heartbeat from an unspecified host",
            failure(
                c.worker_heartbeat(pb::WorkerHeartbeatRequest {
                    worker_address: "0.0.0.0:5000".into(),
                    ..Default::default()
                })
                .await,
            ),
            Code::InvalidArgument,
            "worker address '0.0.0.0:5000' is not HOST:PORT with a host clients can dial and a \
             nonzero port: the host is unspecified (a worker listening on every interface must \
             advertise the address it is reached at)",
        ),
        (
            "worker_heartbeat with port 0",
            failure(
                c.worker_heartbeat(pb::WorkerHeartbeatRequest {
                    worker_address: "worker-1:0".into(),
                    ..Default::default()
                })
                .await,
            ),
            Code::InvalidArgument,
            "worker address 'worker-1:0' is not HOST:PORT with a host clients can dial and a \
             nonzero port: the port is 0",
        ),
        (
            "worker_heartbeat without a port",
            failure(
                c.worker_heartbeat(pb::WorkerHeartbeatRequest {
                    worker_address: "worker-1".into(),
                    ..Default::default()
                })
                .await,
            ),
            Code::InvalidArgument,
            "worker address 'worker-1' is not HOST:PORT with a host clients can dial and a \
             nonzero port: there is no port",
        ),
        (
            "lease_splits of an unknown iteration",
            failure(
                c.lease_splits(pb::LeaseSplitsRequest {
                    iteration_id: 5,
                    ..Default::default()
                })
                .await,
            ),
            Code::NotFound,
            "Iteration id 5 not found",
        ),
        (
            "maybe_remove_task of an unknown task",
            failure(
                c.maybe_remove_task(pb::MaybeRemoveTaskRequest {
                    task_id: 9,
                    ..Default::default()
                })
                .await,
            ),
            Code::NotFound,
            "Task 9 not found",
        ),
        (
            "add_node without a peer address",
            failure(
                c.add_node(pb::AddNodeRequest {
                    node_id: 2,
                    peer_addr: String::new(),
                    ..Default::default()
                })
                .await,
            ),
            Code::InvalidArgument,
            "peer address \"\" is empty",
        ),
        (
            "add_node at a peer address with a NUL",
            failure(
                c.add_node(pb::AddNodeRequest {
                    node_id: 2,
                    peer_addr: "\0junk".into(),
                    ..Default::default()
                })
                .await,
            ),
            Code::InvalidArgument,
            "peer address \"\\0junk\" holds the control character '\\0'",
        ),
        (
            "add_node of node 0",
            failure(
                c.add_node(pb::AddNodeRequest {
                    node_id: 0,
                    peer_addr: "127.0.0.1:1".into(),
                    ..Default::default()
                })
                .await,
            ),
            Code::InvalidArgument,
            "node id 0 is not valid",
        ),
        (
            "add_node of a voter",
            failure(
                c.add_node(pb::AddNodeRequest {
                    node_id: 1,
                    peer_addr: "127.0.0.1:1".into(),
                    ..Default::default()
                })
                .await,
            ),
            Code::InvalidArgument,
            "node 1 is already a voter (voters {1})",
        ),
        (
            "add_node at the peer address of a member",
            failure(
                c.add_node(pb::AddNodeRequest {
                    node_id: 2,
                    peer_addr: handle.peer_addr().to_string(),
                    ..Default::default()
                })
                .await,
            ),
            Code::InvalidArgument,
            "is already node 1's",
        ),
        (
            "remove_node of a node that is no member",
            failure(
                c.remove_node(pb::RemoveNodeRequest {
                    node_id: 7,
                    ..Default::default()
                })
                .await,
            ),
            Code::NotFound,
            "node 7 is not a member (voters {1}, learners {})",
        ),
        (
            "remove_node of the last voter, even forced",
            failure(
                c.remove_node(pb::RemoveNodeRequest {
                    node_id: 1,
                    force: true,
                })
                .await,
            ),
            Code::FailedPrecondition,
            "node 1 is the last voter; removing it would leave no quorum",
        ),
    ];
    for (name, (code, message), expected_code, expected_message) in cases {
        assert_eq!(code, expected_code, "{name}: {message}");
        assert!(
            message.contains(expected_message),
            "{name}: {message:?} lacks {expected_message:?}"
        );
    }
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_is_served_only_on_the_peer_port_and_the_client_api_only_on_the_client_port() {
    let dir = tempfile::tempdir().unwrap();
    let handle = DispatcherHandle::start(config(1, &dir)).await.unwrap();
    handle.wait_for_leader(WAIT).await.unwrap();
    assert_ne!(handle.addr(), handle.peer_addr());
    let vote = || pb_raft::RaftPayload {
        payload: b"not a vote".to_vec(),
    };
    let mut raft_on_client_port = RaftPeerClient::connect(format!("http://{}", handle.addr()))
        .await
        .unwrap();
    let mut raft_on_peer_port = RaftPeerClient::connect(format!("http://{}", handle.peer_addr()))
        .await
        .unwrap();
    let mut api_on_peer_port = DispatcherClient::connect(format!("http://{}", handle.peer_addr()))
        .await
        .unwrap();
    let mut api_on_client_port = client(&handle).await;

    let cases: Vec<(&str, Result<(), tonic::Status>, Option<Code>)> = vec![
        (
            "vote on the client port",
            raft_on_client_port.vote(vote()).await.map(drop),
            Some(Code::Unimplemented),
        ),
        (
            "append_entries on the client port",
            raft_on_client_port.append_entries(vote()).await.map(drop),
            Some(Code::Unimplemented),
        ),
        (
            "install_snapshot on the client port",
            raft_on_client_port.install_snapshot(vote()).await.map(drop),
            Some(Code::Unimplemented),
        ),
        (
            "announce on the client port",
            raft_on_client_port
                .announce(pb_raft::AnnounceRequest::default())
                .await
                .map(drop),
            Some(Code::Unimplemented),
        ),
        (
            "get_status on the peer port",
            api_on_peer_port
                .get_status(pb::GetStatusRequest::default())
                .await
                .map(drop),
            Some(Code::Unimplemented),
        ),
        (
            "add_node on the peer port",
            api_on_peer_port
                .add_node(pb::AddNodeRequest {
                    node_id: 9,
                    peer_addr: "127.0.0.1:1".into(),
                    ..Default::default()
                })
                .await
                .map(drop),
            Some(Code::Unimplemented),
        ),
        // The services are there, on their own ports: an undecodable vote reaches Raft's
        // service (and is refused by it), and status is served.
        (
            "vote on the peer port",
            raft_on_peer_port.vote(vote()).await.map(drop),
            Some(Code::InvalidArgument),
        ),
        (
            "get_status on the client port",
            api_on_client_port
                .get_status(pb::GetStatusRequest::default())
                .await
                .map(drop),
            None,
        ),
    ];
    for (what, got, want) in cases {
        assert_eq!(got.err().map(|s| s.code()), want, "{what}");
    }
    handle.shutdown().await;
}

/// Waits until `handle`'s membership names each replica at its own client address.
async fn wait_client_addrs_recorded(handle: &DispatcherHandle, handles: &[DispatcherHandle]) {
    let want: BTreeMap<u64, String> = handles
        .iter()
        .map(|h| (h.id(), h.addr().to_string()))
        .collect();
    handle
        .raft()
        .wait(Some(WAIT))
        .metrics(
            |m| {
                let recorded: BTreeMap<u64, String> = m
                    .membership_config
                    .membership()
                    .nodes()
                    .map(|(id, n)| (*id, n.addr.clone()))
                    .collect();
                recorded == want
            },
            "every replica's client address is recorded",
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_answers_unavailable_naming_the_leaders_client_address() {
    let dir = tempfile::tempdir().unwrap();
    let mut listeners = Vec::new();
    for _ in 0..2 {
        listeners.push((
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        ));
    }
    // The peer list names peer addresses only; each replica records its client address.
    let peers: BTreeMap<u64, String> = listeners
        .iter()
        .zip(1..)
        .map(|((_, peer), id)| (id, peer.local_addr().unwrap().to_string()))
        .collect();
    let mut handles = Vec::new();
    for ((listener, peer_listener), id) in listeners.into_iter().zip(1..) {
        let config = DispatcherConfig {
            peers: peers.clone(),
            ..config(id, &dir)
        };
        handles.push(
            DispatcherHandle::start_on(listener, peer_listener, config)
                .await
                .unwrap(),
        );
    }
    let leader = handles[0].wait_for_leader(WAIT).await.unwrap();
    let follower = handles.iter().find(|h| h.id() != leader).unwrap();
    let leader_addr = handles.iter().find(|h| h.id() == leader).unwrap().addr();
    // The follower must know the leader's client address before it can name it.
    follower
        .raft()
        .wait(Some(WAIT))
        .current_leader(leader, "the follower knows the leader")
        .await
        .unwrap();
    wait_client_addrs_recorded(follower, &handles).await;
    let mut c = client(follower).await;
    let write = c
        .lease_splits(pb::LeaseSplitsRequest::default())
        .await
        .expect_err("a follower does not write");
    let read = c
        .get_dataset(pb::GetDatasetRequest::default())
        .await
        .expect_err("a follower does not serve current reads");
    for status in [write, read] {
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        let hint = status
            .metadata()
            .get(LEADER_METADATA_KEY)
            .expect("the leader's address in metadata");
        assert_eq!(hint.to_str().unwrap(), leader_addr.to_string());
    }
    let status: serde_json::Value = serde_json::from_str(
        &c.get_status(pb::GetStatusRequest::default())
            .await
            .unwrap()
            .into_inner()
            .json,
    )
    .unwrap();
    for h in &handles {
        let member = status["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == h.id())
            .expect("every replica is a member");
        assert_eq!(member["addr"], h.addr().to_string(), "{status}");
        assert_eq!(member["peer_addr"], h.peer_addr().to_string(), "{status}");
    }
    for handle in handles {
        handle.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_at_a_new_client_port_records_it() {
    let dir = tempfile::tempdir().unwrap();
    let first = DispatcherHandle::start(config(1, &dir)).await.unwrap();
    first.wait_for_leader(WAIT).await.unwrap();
    let peer_addr = first.peer_addr().to_string();
    let old_addr = first.addr();
    first.shutdown().await;

    // Same journal and peer address (its identity), another client port.
    let restarted = DispatcherHandle::start(DispatcherConfig {
        peer_listen: peer_addr,
        init: false,
        ..config(1, &dir)
    })
    .await
    .unwrap();
    assert_ne!(restarted.addr(), old_addr);
    wait_client_addrs_recorded(&restarted, std::slice::from_ref(&restarted)).await;
    restarted.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_comes_in_pages_that_together_list_everything() {
    let dir = tempfile::tempdir().unwrap();
    let handle = DispatcherHandle::start(config(1, &dir)).await.unwrap();
    handle.wait_for_leader(WAIT).await.unwrap();
    let rpc = sluice_rpc::DispatcherClient::new(&handle.addr().to_string()).unwrap();
    let mut registered = Vec::new();
    for n in 0..5 {
        let def = sluice_pipeline::Dataset::range(n + 1).into_def();
        let metadata = pb::DatasetMetadata::default();
        let id = rpc
            .register_dataset_def(&def, None, &metadata)
            .await
            .unwrap();
        registered.push(id.0);
    }
    let datasets = |json: &serde_json::Value| -> Vec<String> {
        json["datasets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_string())
            .collect()
    };
    let mut listed = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = rpc.get_status_page(2, &token).await.unwrap();
        let page: serde_json::Value = serde_json::from_str(&page).unwrap();
        let on_page = datasets(&page);
        assert!(
            on_page.len() <= 2,
            "a page holds at most page_size: {on_page:?}"
        );
        listed.extend(on_page);
        pages += 1;
        match page["next_page_token"].as_str() {
            Some(next) => token = next.to_string(),
            None => break,
        }
    }
    assert_eq!(listed, registered, "every dataset once, in id order");
    assert_eq!(pages, 3);
    let whole: serde_json::Value = serde_json::from_str(&rpc.get_status().await.unwrap()).unwrap();
    assert_eq!(datasets(&whole), registered, "get_status merges the pages");
    assert_eq!(whole["state_sizes"]["definitions"], 5);

    let mut c = client(&handle).await;
    let cases = [
        (
            pb::GetStatusRequest {
                page_size: 10_001,
                page_token: String::new(),
            },
            "page_size 10001 is over the largest page, 10000",
        ),
        (
            pb::GetStatusRequest {
                page_size: 0,
                page_token: "{not a token".into(),
            },
            "page_token is not one a status reply gave",
        ),
    ];
    for (request, want) in cases {
        let (code, message) = failure(c.get_status(request).await);
        assert_eq!(code, Code::InvalidArgument, "{message}");
        assert!(message.contains(want), "{message}");
    }
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_start_needs_the_replicas_own_journal() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("node-1");
    let refusal = |config: DispatcherConfig| async move {
        match DispatcherHandle::start(config).await {
            Ok(handle) => {
                handle.shutdown().await;
                panic!("started")
            }
            Err(e) => e.to_string(),
        }
    };
    let plain = DispatcherConfig {
        init: false,
        ..config(1, &dir)
    };
    let err = refusal(plain.clone()).await;
    assert!(
        err.starts_with(&format!(
            "data dir {} holds no journal: it does not exist; pass --init",
            data_dir.display()
        )),
        "{err}"
    );
    assert!(!data_dir.exists());

    let first = DispatcherHandle::start(config(1, &dir)).await.unwrap();
    first.wait_for_leader(WAIT).await.unwrap();
    first.shutdown().await;
    let again = DispatcherHandle::start(plain.clone()).await.unwrap();
    again.wait_for_leader(WAIT).await.unwrap();
    again.shutdown().await;

    let other_cluster = DispatcherConfig {
        cluster_id: "other".into(),
        ..config(1, &dir)
    };
    let err = refusal(other_cluster).await;
    assert!(
        err.contains("belongs to cluster 'sluice' node 1")
            && err.contains("not to cluster 'other' node 1")
            && err.contains("IDENTITY")
            && err.contains("--cluster-id its journal was created with"),
        "{err}"
    );
}

/// A `from_slices` definition of about `bytes` encoded bytes (16 rows of bytes).
fn definition_of(bytes: usize) -> sluice_proto::dataset::DatasetDef {
    let tensor = sluice_element::Tensor::from_raw(
        sluice_element::DType::UInt8,
        vec![16, bytes / 16],
        vec![7u8; bytes / 16 * 16].into(),
    )
    .expect("a valid tensor");
    sluice_pipeline::Dataset::from_slices(tensor).into_def()
}

fn registration(def: sluice_proto::dataset::DatasetDef) -> pb::RegisterDatasetRequest {
    pb::RegisterDatasetRequest {
        dataset: Some(def),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_over_the_limit_is_refused_before_anything_is_proposed() {
    const LIMIT: u64 = 4096;
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    for i in 0..64 {
        std::fs::write(files.join(format!("{i:0>100}.txt")), "a line\n").unwrap();
    }
    let handle = DispatcherHandle::start(DispatcherConfig {
        max_definition_size: LIMIT,
        data_roots: vec![files.clone()],
        ..config(1, &dir)
    })
    .await
    .unwrap();
    handle.wait_for_leader(WAIT).await.unwrap();
    let mut c = client(&handle).await;
    let datasets = || {
        let applied = handle.state().read().expect("state lock poisoned");
        applied.state.datasets().count()
    };

    let pattern = format!("files(\"{}/*.txt\").lines()", files.display());
    let globbed = sluice_pipeline::parse(&pattern).unwrap().into_def();
    let over = definition_of(LIMIT as usize + 100);
    let far_over = definition_of(LIMIT as usize + 5 * 1024 * 1024);
    let cases: Vec<(&str, pb::RegisterDatasetRequest, Code, Vec<String>)> = vec![
        (
            "a little over the limit",
            registration(over.clone()),
            Code::InvalidArgument,
            vec![
                format!("{} bytes as sent", prost::Message::encoded_len(&over)),
                format!("limit of {LIMIT} bytes"),
                "--max-definition-size".into(),
            ],
        ),
        (
            "over the limit once its file pattern is expanded",
            registration(globbed),
            Code::InvalidArgument,
            vec![
                "with its file patterns expanded".into(),
                format!("limit of {LIMIT} bytes"),
            ],
        ),
        (
            "far over: refused by the decode bound, which names both sizes",
            registration(far_over),
            Code::OutOfRange,
            vec![format!(
                "{}",
                LIMIT as usize + crate::config::MESSAGE_MARGIN
            )],
        ),
    ];
    for (name, request, code, wanted) in cases {
        let (got, message) = failure(c.register_dataset(request).await);
        assert_eq!(got, code, "{name}: {message}");
        for want in wanted {
            assert!(
                message.contains(&want),
                "{name}: {message:?} lacks {want:?}"
            );
        }
    }
    assert_eq!(datasets(), 0, "nothing was registered");

    let under = definition_of(LIMIT as usize - 200);
    assert!(prost::Message::encoded_len(&under) <= LIMIT as usize);
    let registered = c.register_dataset(registration(under)).await;
    assert!(registered.is_ok(), "{registered:?}");
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_epoch_jobs_of_random_or_cache_are_refused_when_created() {
    use sluice_rpc::ToProto;
    let dir = tempfile::tempdir().unwrap();
    let handle = DispatcherHandle::start(config(1, &dir)).await.unwrap();
    handle.wait_for_leader(WAIT).await.unwrap();
    let mut c = client(&handle).await;
    for (expr, want) in [
        ("random(seed=1)", "Dataset.random has no splits"),
        (
            "range(3).cache().repeat(2)",
            "cache cannot run in distributed_epoch mode",
        ),
    ] {
        let def = sluice_pipeline::parse(expr).unwrap().into_def();
        let id = c
            .register_dataset(registration(def))
            .await
            .unwrap()
            .into_inner()
            .dataset_id;
        let job = |policy: sluice_types::ShardingPolicy| pb::GetOrCreateJobRequest {
            dataset_id: id.clone(),
            sharding_policy: policy.to_proto() as i32,
            ..Default::default()
        };
        let (code, message) = failure(
            c.get_or_create_job(job(sluice_types::ShardingPolicy::Dynamic))
                .await,
        );
        assert_eq!(code, Code::InvalidArgument, "{expr}: {message}");
        assert!(message.contains(want), "{expr}: {message}");
        // parallel_epochs runs them.
        c.get_or_create_job(job(sluice_types::ShardingPolicy::Off))
            .await
            .unwrap();
    }
}
