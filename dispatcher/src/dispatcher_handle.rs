//! Starting and stopping one dispatcher replica: journal, Raft, proposer, and the gRPC server
//! that carries both the dispatcher service and the Raft peer service on one address.
//!
//! Bootstrap: every replica gets the same peer list; on first start the
//! replica with the lowest id initializes the cluster once. A restarted replica recovers from
//! its own data dir alone (its journal knows the membership).

use crate::config::DispatcherConfig;
use crate::error::DispatcherError;
use crate::ids::NodeId;
use crate::liveness::Liveness;
use crate::proposer::ProposerHandle;
use crate::raft_error::raft_error;
use crate::raft_network::PeerNetwork;
use crate::raft_service::RaftPeerService;
use crate::raft_types::{NodeInfo, Raft, StateHandle, TypeConfig};
use crate::service::DispatcherService;
use crate::state::DispatcherState;
use crate::timers::{TimerLoop, Timers};
use openraft::error::{InitializeError, RaftError};
use openraft::SnapshotPolicy;
use sluice_dataset::DataRoots;
use sluice_journal::Journal;
use sluice_proto::dispatcher::dispatcher_server::DispatcherServer;
use sluice_proto::raft::raft_peer_server::RaftPeerServer;
use sluice_security::{incoming, ClientCerts, Role};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tracing::{info, warn};

/// Largest gRPC message accepted (Raft batches and snapshot chunks can be large).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// A running dispatcher replica.
pub struct DispatcherHandle {
    id: NodeId,
    addr: SocketAddr,
    raft: Raft,
    state: StateHandle,
    shutdown: CancellationToken,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl DispatcherHandle {
    /// Opens the journal, starts Raft and serves. Returns once the server is listening.
    pub async fn start(config: DispatcherConfig) -> Result<DispatcherHandle, DispatcherError> {
        config.validate().map_err(DispatcherError::Startup)?;
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .map_err(|e| DispatcherError::Startup(format!("bind {}: {e}", config.listen)))?;
        Self::start_on(listener, config).await
    }

    /// Like [`DispatcherHandle::start`], serving on an already bound listener (`config.listen`
    /// is ignored). Lets a test harness learn every replica's port before any replica starts.
    pub async fn start_on(
        listener: tokio::net::TcpListener,
        config: DispatcherConfig,
    ) -> Result<DispatcherHandle, DispatcherError> {
        config.validate().map_err(DispatcherError::Startup)?;
        let addr = listener
            .local_addr()
            .map_err(|e| DispatcherError::Startup(format!("local address: {e}")))?;
        let security = &config.security;
        let startup = |e: sluice_security::SecurityError| DispatcherError::Startup(e.to_string());
        security
            .check_exposure("dispatcher", &addr)
            .map_err(startup)?;
        let tls = security
            .tls_config(ClientCerts::Optional)
            .map_err(startup)?;
        let authenticator = security.authenticator();
        let peer_caller = security.caller(Role::Peer).map_err(startup)?;
        let data_roots = DataRoots::new(&config.data_roots)
            .map_err(|e| DispatcherError::Startup(e.to_string()))?;
        let journal = Journal::open(&config.data_dir)?;
        let log_store = journal.log_store::<TypeConfig>();
        let state_machine = journal.state_machine::<TypeConfig, DispatcherState>()?;
        let state = state_machine.handle();

        let raft_config = openraft::Config {
            cluster_name: "sluice-dispatcher".into(),
            heartbeat_interval: config.heartbeat_interval.as_millis() as u64,
            election_timeout_min: config.election_timeout.0.as_millis() as u64,
            election_timeout_max: config.election_timeout.1.as_millis() as u64,
            install_snapshot_timeout: 3000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_logs_since_last),
            max_in_snapshot_log_to_keep: config.logs_kept_after_snapshot,
            purge_batch_size: 256,
            ..Default::default()
        }
        .validate()
        .map_err(|e| DispatcherError::Startup(format!("raft config: {e}")))?;
        let raft = Raft::new(
            config.id,
            Arc::new(raft_config),
            PeerNetwork::new(
                config.id,
                config.faults.clone(),
                config.raft_routes.clone(),
                peer_caller,
            ),
            log_store,
            state_machine,
        )
        .await
        .map_err(raft_error)?;

        let proposer = ProposerHandle::spawn(raft.clone());
        let liveness = Arc::new(Liveness::default());
        let service = DispatcherService::new(
            &config,
            raft.clone(),
            proposer.clone(),
            state.clone(),
            liveness.clone(),
            data_roots,
        );
        let shutdown = CancellationToken::new();
        let timers = TimerLoop {
            id: config.id,
            raft: raft.clone(),
            state: state.clone(),
            proposer,
            liveness,
            timers: Timers::new(&config),
        };
        tokio::spawn(timers.run(shutdown.clone()));
        let server = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(InterceptedService::new(
                DispatcherServer::new(service)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
                authenticator.interceptor(),
            ))
            .add_service(InterceptedService::new(
                RaftPeerServer::new(RaftPeerService::new(raft.clone()))
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
                authenticator.interceptor(),
            ))
            .serve_with_incoming_shutdown(
                // `incoming` sets TCP_NODELAY on accepted sockets (the builder's `tcp_nodelay`
                // only reaches sockets tonic binds itself; without it, Nagle held the tail of
                // each message until the peer's delayed ACK, ~40 ms a message) and runs TLS
                // handshakes off the accept loop.
                incoming(listener, tls),
                shutdown.clone().cancelled_owned(),
            );
        let server = tokio::spawn(server);

        let peers = if config.peers.is_empty() {
            BTreeMap::from([(config.id, addr.to_string())])
        } else {
            config.peers.clone()
        };
        if !config.join {
            bootstrap(&raft, config.id, &peers).await?;
        }
        info!(node = config.id, %addr, data_dir = %config.data_dir.display(), "dispatcher serving");
        Ok(DispatcherHandle {
            id: config.id,
            addr,
            raft,
            state,
            shutdown,
            server,
        })
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The address both services are served on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Read access to the applied state (tests and status).
    pub fn state(&self) -> &StateHandle {
        &self.state
    }

    /// Waits until some replica is known as leader; returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<NodeId, DispatcherError> {
        let metrics = self
            .raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "a leader is known")
            .await
            .map_err(|e| DispatcherError::QuorumUnavailable(e.to_string()))?;
        Ok(metrics.current_leader.expect("waited for a known leader"))
    }

    /// Stops at once: connections are cut (long polls included, as after a crash) and Raft is
    /// shut down; the journal closes when the last handle drops.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.server.abort();
        if let Err(e) = self.raft.shutdown().await {
            warn!(node = self.id, error = %e, "raft shutdown");
        }
        let _ = self.server.await;
    }

    /// Serves until `stop` is cancelled or the server fails, then shuts down.
    pub async fn run_until(self, stop: CancellationToken) -> Result<(), DispatcherError> {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = self.shutdown.cancelled() => {}
        }
        self.shutdown().await;
        Ok(())
    }
}

/// Initializes a pristine cluster from the replica with the lowest id, once.
async fn bootstrap(
    raft: &Raft,
    id: NodeId,
    peers: &BTreeMap<NodeId, String>,
) -> Result<(), DispatcherError> {
    let lowest = *peers.keys().next().expect("peers is never empty here");
    if id != lowest {
        return Ok(());
    }
    let initialized = raft.is_initialized().await.map_err(raft_error)?;
    if initialized {
        return Ok(());
    }
    let members: BTreeMap<NodeId, NodeInfo> = peers
        .iter()
        .map(|(id, addr)| (*id, NodeInfo { addr: addr.clone() }))
        .collect();
    match raft.initialize(members).await {
        Ok(()) => {
            info!(
                node = id,
                members = peers.len(),
                "initialized a new cluster"
            );
            Ok(())
        }
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(DispatcherError::RaftStopped(e.to_string())),
    }
}
