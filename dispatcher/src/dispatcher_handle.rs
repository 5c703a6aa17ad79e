//! Starting and stopping one dispatcher replica: journal, Raft, proposer, and its two listeners
//! (see `grpc_servers`): the client API and the Raft peer listener.
//!
//! Bootstrap: every replica gets the same peer list (peer addresses); on first start (`init`)
//! the replica with the lowest id initializes the cluster once, knowing only its own client
//! address; every replica then records its own (see `client_addr_announcer`). A restarted
//! replica recovers from its own data dir alone (its journal knows the membership).
//!
//! Raft and the peer listener run on the replica's own `RaftRuntime`; everything else on the
//! caller's runtime.
//!
//! Data-dir identity: only `init` and `join` may create a journal; a plain start needs this
//! replica's own (same cluster id, same node id). A voter that lost its disk therefore cannot
//! come back with an empty log and no vote, where it could help elect a leader that lacks
//! committed entries: it refuses to start and says what to do. With `init` and an empty
//! journal, a replica first asks its peers whether they already form a cluster that knows it
//! (see `init_check`), and refuses to start if they do.

use crate::blobs::Blobs;
use crate::client_addr_announcer::ClientAddrAnnouncer;
use crate::config::DispatcherConfig;
use crate::dispatcher_ops::OpsSetup;
use crate::error::DispatcherError;
use crate::grpc_servers::{self, ServerTask};
use crate::init_check::{InitCheck, PeerGate, Verdict};
use crate::leader_watch::LeaderWatch;
use crate::liveness::Liveness;
use crate::raft_error::raft_error;
use crate::raft_network::PeerNetwork;
use crate::raft_runtime::RaftRuntime;
use crate::raft_service::RaftPeerService;
use crate::raft_types::{NodeInfo, Raft, StateHandle, TypeConfig};
use crate::service::DispatcherService;
use crate::state::DispatcherState;
use crate::timers::{TimerLoop, Timers};
use openraft::error::{InitializeError, RaftError};
use openraft::SnapshotPolicy;
use sluice_formats::DataRoots;
use sluice_journal::{IfMissing, Journal, JournalError};
use sluice_security::{ClientCerts, Role};
use sluice_types::NodeId;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// A running dispatcher replica.
pub struct DispatcherHandle {
    id: NodeId,
    addr: SocketAddr,
    peer_addr: SocketAddr,
    raft: Raft,
    state: StateHandle,
    shutdown: CancellationToken,
    servers: [ServerTask; 2],
    /// The metrics listener (`--metrics-listen`), if any.
    ops: Option<sluice_ops::OpsServer>,
    /// Where Raft and the peer listener run (see `raft_runtime`).
    raft_runtime: RaftRuntime,
    /// Why this replica stopped on its own after it started (its `--init` check refused once
    /// its peers answered). A std mutex: set once, read at the end, never across `.await`.
    failure: Arc<Mutex<Option<String>>>,
}

/// Binds `addr`, naming what it is for when that fails.
async fn bind(what: &str, addr: &str) -> Result<TcpListener, DispatcherError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| DispatcherError::Startup(format!("bind {what} {addr}: {e}")))
}

fn local_addr(listener: &TcpListener) -> Result<SocketAddr, DispatcherError> {
    listener
        .local_addr()
        .map_err(|e| DispatcherError::Startup(format!("local address: {e}")))
}

impl DispatcherHandle {
    /// Opens the journal, starts Raft and serves. Returns once both listeners are bound.
    pub async fn start(config: DispatcherConfig) -> Result<DispatcherHandle, DispatcherError> {
        config.validate().map_err(DispatcherError::Startup)?;
        let listener = bind("client address", &config.listen).await?;
        let peer_listener = bind("peer address", &config.peer_listen).await?;
        Self::start_on(listener, peer_listener, config).await
    }

    /// Like [`DispatcherHandle::start`], serving the client API on `listener` and the Raft peer
    /// service on `peer_listener`, both already bound (`config.listen` and `config.peer_listen`
    /// are ignored). Lets a test harness learn every replica's ports before any replica starts.
    pub async fn start_on(
        listener: TcpListener,
        peer_listener: TcpListener,
        config: DispatcherConfig,
    ) -> Result<DispatcherHandle, DispatcherError> {
        config.validate().map_err(DispatcherError::Startup)?;
        let addr = local_addr(&listener)?;
        let peer_addr = local_addr(&peer_listener)?;
        let client_addr = config
            .advertise_address
            .clone()
            .unwrap_or_else(|| addr.to_string());
        let security = &config.security;
        let startup = |e: sluice_security::SecurityError| DispatcherError::Startup(e.to_string());
        security
            .check_exposure("dispatcher client API", &addr)
            .map_err(startup)?;
        security
            .check_exposure("dispatcher peer listener", &peer_addr)
            .map_err(startup)?;
        // Callers may authenticate with a token instead of a certificate on the client API;
        // on the peer listener a replica must present its certificate.
        let client_tls = security
            .tls_config(ClientCerts::Optional)
            .map_err(startup)?;
        let peer_tls = security
            .tls_config(ClientCerts::Required)
            .map_err(startup)?;
        let authenticator = security.authenticator();
        let peer_caller = security.caller(Role::Peer).map_err(startup)?;
        let data_roots = DataRoots::new(&config.data_roots)
            .map_err(|e| DispatcherError::Startup(e.to_string()))?;
        if let Some(path) = &config.object_store_config {
            sluice_formats::load_object_store_settings(path).map_err(DispatcherError::Startup)?;
        }
        let identity = config
            .journal_identity()
            .map_err(DispatcherError::Startup)?;
        let network = PeerNetwork::new(
            config.id,
            config.faults.clone(),
            config.raft_routes.clone(),
            peer_caller,
            config.peer_message_limit(),
        );
        let others: BTreeMap<NodeId, String> = config
            .peers
            .iter()
            .filter(|(id, _)| **id != config.id)
            .map(|(id, addr)| (*id, addr.clone()))
            .collect();
        let init_check = InitCheck {
            me: config.id,
            peers: others,
            network: network.clone(),
        };
        let checks_peers = config.init && !init_check.peers.is_empty();
        // With `init`, the peers are asked before a journal is created, so a refusal leaves
        // the data dir as it was; the answer waits at most `init_check_wait` here.
        let mut first_verdict = None;
        let journal = match Journal::open(&config.data_dir, &identity, IfMissing::Refuse) {
            Err(JournalError::NoJournal { .. }) if config.init || config.join => {
                if checks_peers {
                    let deadline = tokio::time::Instant::now() + config.init_check_wait;
                    match init_check.until(deadline).await {
                        Verdict::Refuse(why) => return Err(DispatcherError::Startup(why)),
                        verdict => first_verdict = Some(verdict),
                    }
                }
                Journal::open(&config.data_dir, &identity, IfMissing::Create)
            }
            opened => opened,
        }
        .map_err(data_dir_refused)?;
        let log_store = journal.log_store::<TypeConfig>();
        let ops_log = log_store.clone();
        let ops = OpsSetup::bind(config.metrics_listen.as_deref())
            .await
            .map_err(|e| DispatcherError::Startup(e.to_string()))?;
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
            // One purge per snapshot: each purge holds up Raft's core for a flush.
            purge_batch_size: config.snapshot_logs_since_last.max(256),
            ..Default::default()
        }
        .validate()
        .map_err(|e| DispatcherError::Startup(format!("raft config: {e}")))?;
        let raft_runtime = RaftRuntime::new(config.id)?;
        let peer_listener = raft_runtime.adopt(peer_listener)?;
        let raft = raft_runtime
            .run(Raft::new(
                config.id,
                Arc::new(raft_config),
                network.clone(),
                log_store,
                state_machine,
            ))
            .await?
            .map_err(raft_error)?;
        // Only a new, empty journal is checked (one just created, or one that never got an
        // entry or a vote): `init` on a restart changes nothing.
        let check = match checks_peers && !raft.is_initialized().await.map_err(raft_error)? {
            true => Some(init_check),
            false => None,
        };
        let gate = PeerGate::new(check.is_none() || first_verdict == Some(Verdict::Proceed));

        let proposer = ops.proposer(&raft, config.commit_timeout);
        let liveness = Arc::new(Liveness::default());
        let shutdown = CancellationToken::new();
        let blobs = Blobs::open(
            &config.data_dir,
            config.max_blob_store_size,
            config.blob_gc_grace,
            raft.clone(),
            network.clone(),
        )?;
        tokio::spawn(blobs.clone().maintain(
            state.clone(),
            config.blob_maintenance_interval,
            shutdown.clone(),
        ));
        let service = DispatcherService::new(
            &config,
            raft.clone(),
            proposer.clone(),
            state.clone(),
            liveness.clone(),
            data_roots,
            LeaderWatch::spawn(&raft, shutdown.clone()),
            network.clone(),
            blobs.clone(),
        );
        let timers = TimerLoop {
            id: config.id,
            raft: raft.clone(),
            state: state.clone(),
            proposer,
            liveness,
            timers: Timers::new(&config),
        };
        tokio::spawn(timers.run(shutdown.clone()));
        let announcer = ClientAddrAnnouncer {
            id: config.id,
            addr: client_addr.clone(),
            raft: raft.clone(),
            network,
        };
        tokio::spawn(announcer.run(shutdown.clone()));
        let servers = [
            grpc_servers::serve_client_api(
                listener,
                service,
                config.client_message_limit(),
                client_tls,
                authenticator.clone(),
                ops.rpc_layer(),
                shutdown.clone(),
            ),
            raft_runtime.enter(|| {
                grpc_servers::serve_peers(
                    peer_listener,
                    RaftPeerService::new(raft.clone(), gate.clone(), blobs),
                    config.peer_message_limit(),
                    peer_tls,
                    authenticator,
                    ops.rpc_layer(),
                    shutdown.clone(),
                )
            }),
        ];

        let ops = ops
            .serve(
                raft.clone(),
                state.clone(),
                ops_log,
                config.election_timeout.1,
                shutdown.clone(),
            )
            .map_err(|e| DispatcherError::Startup(e.to_string()))?;

        let peers = if config.peers.is_empty() {
            BTreeMap::from([(config.id, peer_addr.to_string())])
        } else {
            config.peers.clone()
        };
        let handle = DispatcherHandle {
            id: config.id,
            addr,
            peer_addr,
            raft,
            state,
            shutdown,
            servers,
            ops,
            raft_runtime,
            failure: Arc::default(),
        };
        let Some(check) = check else {
            // Only a first start initializes: a restart's journal has the membership, and one
            // whose log is still empty (added by `join`, or a replica whose quorum was never
            // initialized) must not make up a cluster of its own.
            if config.init {
                if let Err(e) = bootstrap(&handle.raft, config.id, &client_addr, &peers).await {
                    handle.shutdown().await;
                    return Err(e);
                }
            }
            handle.log_serving(&config);
            return Ok(handle);
        };
        // A refusal the peers give at once is reported before this replica says it serves; when
        // they do not answer yet (a new cluster starting), the check goes on in the background.
        let verdict = match first_verdict {
            Some(verdict) => verdict,
            None => {
                let deadline = tokio::time::Instant::now() + config.init_check_wait;
                check.until(deadline).await
            }
        };
        match verdict {
            Verdict::Refuse(why) => {
                handle.shutdown().await;
                return Err(DispatcherError::Startup(why));
            }
            Verdict::Proceed => {
                gate.open();
                if let Err(e) = bootstrap(&handle.raft, config.id, &client_addr, &peers).await {
                    handle.shutdown().await;
                    return Err(e);
                }
            }
            Verdict::Wait(silent) => {
                info!(
                    node = config.id,
                    ?silent,
                    "waiting for peers to answer the --init check before taking part in raft"
                );
                let raft = handle.raft.clone();
                let shutdown = handle.shutdown.clone();
                let failure = handle.failure.clone();
                let id = config.id;
                tokio::spawn(async move {
                    let verdict = tokio::select! {
                        verdict = check.decide() => verdict,
                        _ = shutdown.cancelled() => return,
                    };
                    let refusal = match verdict {
                        Verdict::Refuse(why) => why,
                        _ => {
                            gate.open();
                            info!(
                                node = id,
                                "peers answered the --init check: taking part in raft"
                            );
                            match bootstrap(&raft, id, &client_addr, &peers).await {
                                Ok(()) => return,
                                Err(e) => e.to_string(),
                            }
                        }
                    };
                    error!(node = id, %refusal, "stopping");
                    *failure.lock().expect("failure lock poisoned") = Some(refusal);
                    shutdown.cancel();
                });
            }
        }
        handle.log_serving(&config);
        Ok(handle)
    }

    fn log_serving(&self, config: &DispatcherConfig) {
        info!(
            node = self.id,
            addr = %self.addr,
            peer_addr = %self.peer_addr,
            data_dir = %config.data_dir.display(),
            "dispatcher serving"
        );
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The client API's address (the `Dispatcher` service).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The Raft peer listener's address (the `RaftPeer` service).
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// The metrics listener's address (`--metrics-listen`), if it has one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.ops.as_ref().map(|ops| ops.addr())
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
        for server in &self.servers {
            server.abort();
        }
        if let Err(e) = self.raft.shutdown().await {
            warn!(node = self.id, error = %e, "raft shutdown");
        }
        for server in self.servers {
            let _ = server.await;
        }
        if let Some(ops) = self.ops {
            ops.join().await;
        }
        self.raft_runtime.shutdown().await;
    }

    /// Serves until `stop` is cancelled or the server fails, then shuts down.
    pub async fn run_until(self, stop: CancellationToken) -> Result<(), DispatcherError> {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = self.shutdown.cancelled() => {}
        }
        let failure = self.failure.clone();
        self.shutdown().await;
        let failure = failure.lock().expect("failure lock poisoned").take();
        match failure {
            Some(why) => Err(DispatcherError::Startup(why)),
            None => Ok(()),
        }
    }
}

/// A journal that is not this replica's, with what the operator can do about it; other journal
/// errors stay as they are.
fn data_dir_refused(err: JournalError) -> DispatcherError {
    let advice = match &err {
        JournalError::NoJournal { .. } => {
            "pass --init on the first start of a new quorum, or --join to wait to be added \
             with `sluice admin add-node`; a replica that lost its data dir may rejoin only as \
             a new member: remove it with `sluice admin remove-node`, then start it with --join \
             and add it"
        }
        JournalError::IdentityMismatch { .. } => {
            "start each replica with its own data dir and the --id and --cluster-id its journal \
             was created with"
        }
        _ => return DispatcherError::Journal(err),
    };
    DispatcherError::Startup(format!("{err}; {advice}"))
}

/// Initializes a pristine cluster from the replica with the lowest id, once. It knows its own
/// client address (`client_addr`); the others' stay empty until they record theirs. A replica
/// whose journal has a log entry or a vote is initialized already (openraft would refuse) and
/// is left alone, so `init` on a restart changes nothing.
async fn bootstrap(
    raft: &Raft,
    id: NodeId,
    client_addr: &str,
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
        .map(|(member, peer_addr)| {
            let addr = match *member == id {
                true => client_addr.to_string(),
                false => String::new(),
            };
            let peer_addr = peer_addr.clone();
            (*member, NodeInfo { addr, peer_addr })
        })
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
