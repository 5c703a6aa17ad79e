//! `LocalCluster`: dispatcher replicas and workers in this process, each a real server on
//! 127.0.0.1 with a port chosen by the OS, each replica with its own temp data dir and two
//! listeners (client API and Raft peer port). Replicas and workers can be killed and restarted
//! at the same addresses (and, for replicas, from the same data dir). The demo runs on it, and the tests use it (as `TestCluster`) to show what survives
//! a crash.
//!
//! Every replica and worker reads files only below one data root, a directory of the cluster's
//! temp dir (`data_root()`): tests put the files their datasets name there.

use crate::credentials::Credentials;
use anyhow::Context;
use sluice_client::{DispatcherClient, RetryConfig};
use sluice_dispatcher::state::DispatcherState;
use sluice_dispatcher::NetworkFaults;
use sluice_dispatcher::{DispatcherConfig, DispatcherHandle};
use sluice_security::ClientSecurity;
use sluice_testwait::wait_until;
use sluice_types::NodeId;
use sluice_worker::{WorkerConfig, WorkerHandle};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;
use tracing::info;

/// Raft timings for a local cluster: fast failover, yet slow enough for a loaded 2-core machine.
/// `peers` are the replicas' peer addresses.
pub fn local_dispatcher_config(
    id: NodeId,
    data_dir: PathBuf,
    peers: BTreeMap<NodeId, String>,
) -> DispatcherConfig {
    DispatcherConfig {
        id,
        data_dir,
        peers,
        heartbeat_interval: Duration::from_millis(50),
        election_timeout: (Duration::from_millis(150), Duration::from_millis(300)),
        worker_timeout: Duration::from_secs(2),
        // Replicas start one after another in one process, so the first one's peers cannot
        // answer its `init` check yet: it goes on in the background at once.
        init_check_wait: Duration::ZERO,
        ..DispatcherConfig::default()
    }
}

struct Replica {
    /// Client API address.
    addr: String,
    /// Raft peer address.
    peer_addr: String,
    data_dir: PathBuf,
    handle: Option<DispatcherHandle>,
}

struct Worker {
    addr: String,
    /// The worker's own settings (tags, cache size, ...), kept for restarts.
    config: WorkerConfig,
    handle: Option<WorkerHandle>,
}

/// Adjusts a replica's config; applied to every replica, at start and restart.
pub type Tune = Arc<dyn Fn(&mut DispatcherConfig) + Send + Sync>;

pub struct LocalCluster {
    _dir: TempDir,
    /// The data root of every replica and worker (inside `_dir`).
    data_root: PathBuf,
    /// Applied to every replica's config, at start and restart.
    tune: Tune,
    /// Raft links cut between replicas (partitions), shared by all of them.
    faults: Arc<NetworkFaults>,
    replicas: BTreeMap<NodeId, Replica>,
    /// The peer list every replica is started with (peer addresses).
    peers: BTreeMap<NodeId, String>,
    workers: Vec<Worker>,
    /// Certificates and tokens of a secure cluster; `None`: plain TCP, no authentication.
    credentials: Option<Arc<Credentials>>,
}

impl LocalCluster {
    /// Starts `replicas` dispatcher replicas (ids 1..=n) and `workers` workers, and waits until
    /// a leader is known.
    pub async fn start(replicas: usize, workers: usize) -> anyhow::Result<LocalCluster> {
        Self::start_with(replicas, workers, |_| {}).await
    }

    /// Like [`LocalCluster::start`], with `tune` applied to every replica's config (it may
    /// capture values, e.g. a worker list).
    pub async fn start_with(
        replicas: usize,
        workers: usize,
        tune: impl Fn(&mut DispatcherConfig) + Send + Sync + 'static,
    ) -> anyhow::Result<LocalCluster> {
        Self::start_inner(replicas, workers, Arc::new(tune), None).await
    }

    /// Like [`LocalCluster::start`], with TLS on every listener and tokens on every call: new
    /// certificates and tokens for the replicas, the workers and [`LocalCluster::client`], as
    /// `sluice certs` makes them.
    pub async fn start_secure(replicas: usize, workers: usize) -> anyhow::Result<LocalCluster> {
        let credentials = Arc::new(Credentials::generate()?);
        let security = credentials.dispatcher()?;
        let tune: Tune = Arc::new(move |config: &mut DispatcherConfig| {
            config.security = security.clone();
        });
        Self::start_inner(replicas, workers, tune, Some(credentials)).await
    }

    async fn start_inner(
        replicas: usize,
        workers: usize,
        tune: Tune,
        credentials: Option<Arc<Credentials>>,
    ) -> anyhow::Result<LocalCluster> {
        let dir = tempfile::tempdir()?;
        let data_root = dir.path().join("data");
        std::fs::create_dir(&data_root).context("create the cluster's data root")?;
        let mut listeners = BTreeMap::new();
        for id in 1..=replicas as NodeId {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let peer_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            listeners.insert(id, (listener, peer_listener));
        }
        let peers: BTreeMap<NodeId, String> = listeners
            .iter()
            .map(|(id, (_, p))| (*id, p.local_addr().expect("bound").to_string()))
            .collect();
        let mut cluster = LocalCluster {
            _dir: dir,
            data_root,
            tune: tune.clone(),
            faults: Arc::new(NetworkFaults::default()),
            replicas: BTreeMap::new(),
            peers: peers.clone(),
            workers: Vec::new(),
            credentials,
        };
        for (id, (listener, peer_listener)) in listeners {
            let data_dir = cluster._dir.path().join(format!("node-{id}"));
            let mut config = local_dispatcher_config(id, data_dir.clone(), peers.clone());
            config.data_roots = vec![cluster.data_root.clone()];
            // The first start creates the journals; restarts need them (see `restart`).
            config.init = true;
            tune(&mut config);
            config.faults = Some(cluster.faults.clone());
            let addr = listener.local_addr()?.to_string();
            let handle = DispatcherHandle::start_on(listener, peer_listener, config).await?;
            cluster.replicas.insert(
                id,
                Replica {
                    addr,
                    peer_addr: peers[&id].clone(),
                    data_dir,
                    handle: Some(handle),
                },
            );
        }
        cluster.wait_for_leader(Duration::from_secs(20)).await?;
        for _ in 0..workers {
            cluster.add_worker().await?;
        }
        Ok(cluster)
    }

    /// Like [`LocalCluster::start`], with every replica configured with the static-sharding
    /// worker list `worker_addresses` (e.g. `127.0.0.1:%port%` once per worker).
    pub async fn start_static(
        replicas: usize,
        workers: usize,
        worker_addresses: &[&str],
    ) -> anyhow::Result<LocalCluster> {
        let list: Vec<String> = worker_addresses.iter().map(|a| a.to_string()).collect();
        Self::start_with(replicas, workers, move |config| {
            config.worker_addresses = list.clone();
        })
        .await
    }

    /// Every replica's client address, comma-separated, as clients and workers are given it.
    pub fn dispatcher_addrs(&self) -> String {
        let addrs: Vec<&str> = self.replicas.values().map(|r| r.addr.as_str()).collect();
        addrs.join(",")
    }

    /// A client of the quorum; on a secure cluster, with the CA and the client token.
    pub fn client(&self) -> DispatcherClient {
        let retry = RetryConfig {
            retry_timeout: Duration::from_secs(60),
            ..RetryConfig::default()
        };
        let security = match &self.credentials {
            Some(credentials) => credentials
                .client()
                .expect("credentials made by the cluster are valid"),
            None => ClientSecurity::default(),
        };
        DispatcherClient::connect(&self.dispatcher_addrs(), retry, security)
            .expect("cluster addresses are valid")
    }

    pub fn replica(&self, id: NodeId) -> Option<&DispatcherHandle> {
        self.replicas.get(&id).and_then(|r| r.handle.as_ref())
    }

    /// Waits until a running replica knows a leader that is running; returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> anyhow::Result<NodeId> {
        let mut found = None;
        wait_until("a running leader", timeout, || {
            found = self.running_leader();
            found.is_some()
        })
        .await?;
        Ok(found.expect("waited for a leader"))
    }

    /// The leader every running replica agrees on, if it is running and leads. A restarted
    /// replica may briefly believe it still leads its old term; agreement rules that out.
    fn running_leader(&self) -> Option<NodeId> {
        let views: Vec<_> = self
            .replicas
            .values()
            .filter_map(|r| r.handle.as_ref())
            .map(|h| h.raft().metrics().borrow().clone())
            .collect();
        let leader = views.first()?.current_leader?;
        let term = views.iter().find(|m| m.id == leader)?.current_term;
        let agreed = views
            .iter()
            .all(|m| m.current_leader == Some(leader) && m.current_term == term);
        let leads = views.iter().any(|m| m.id == leader && m.state.is_leader());
        (agreed && leads).then_some(leader)
    }

    /// Stops a replica abruptly (its data dir stays).
    pub async fn kill(&mut self, id: NodeId) -> anyhow::Result<()> {
        let replica = self.replicas.get_mut(&id).context("no such replica")?;
        if let Some(handle) = replica.handle.take() {
            info!(node = id, "--- killing replica");
            handle.shutdown().await;
        }
        Ok(())
    }

    /// Restarts a killed replica at its address from its data dir, as an operator restarts
    /// one: without `init` or `join`, so a replica whose journal is gone is refused.
    pub async fn restart(&mut self, id: NodeId) -> anyhow::Result<()> {
        self.restart_as(id, false).await
    }

    /// Restarts a killed replica at its addresses with `join`: one whose data dir is gone
    /// comes back empty and waits to be added again (after it was removed).
    pub async fn restart_joining(&mut self, id: NodeId) -> anyhow::Result<()> {
        self.restart_as(id, true).await
    }

    async fn restart_as(&mut self, id: NodeId, join: bool) -> anyhow::Result<()> {
        let peers = self.peers.clone();
        let replica = self.replicas.get_mut(&id).context("no such replica")?;
        anyhow::ensure!(replica.handle.is_none(), "replica {id} is running");
        let listener = bind_again(&replica.addr).await?;
        let peer_listener = bind_again(&replica.peer_addr).await?;
        let mut config = local_dispatcher_config(id, replica.data_dir.clone(), peers);
        config.data_roots = vec![self.data_root.clone()];
        (self.tune)(&mut config);
        config.join = join;
        config.faults = Some(self.faults.clone());
        let handle = DispatcherHandle::start_on(listener, peer_listener, config).await?;
        replica.handle = Some(handle);
        info!(node = id, "--- restarted replica");
        Ok(())
    }

    /// Starts a new, empty replica that waits to be added (`join`); returns its id. Add it with
    /// `DispatcherClient::add_node` at its [`LocalCluster::replica_peer_addr`].
    pub async fn start_joining_replica(&mut self) -> anyhow::Result<NodeId> {
        let id = self.replicas.keys().max().copied().unwrap_or(0) + 1;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let peer_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let peer_addr = peer_listener.local_addr()?.to_string();
        let data_dir = self._dir.path().join(format!("node-{id}"));
        let mut config = local_dispatcher_config(id, data_dir.clone(), BTreeMap::new());
        config.data_roots = vec![self.data_root.clone()];
        (self.tune)(&mut config);
        config.join = true;
        config.faults = Some(self.faults.clone());
        let handle = DispatcherHandle::start_on(listener, peer_listener, config).await?;
        self.peers.insert(id, peer_addr.clone());
        self.replicas.insert(
            id,
            Replica {
                addr,
                peer_addr,
                data_dir,
                handle: Some(handle),
            },
        );
        Ok(id)
    }

    /// The client address of replica `id`.
    pub fn replica_addr(&self, id: NodeId) -> Option<&str> {
        self.replicas.get(&id).map(|r| r.addr.as_str())
    }

    /// The data dir of replica `id`.
    pub fn replica_data_dir(&self, id: NodeId) -> Option<&std::path::Path> {
        self.replicas.get(&id).map(|r| r.data_dir.as_path())
    }

    /// The Raft peer address of replica `id` (what `add_node` takes).
    pub fn replica_peer_addr(&self, id: NodeId) -> Option<&str> {
        self.replicas.get(&id).map(|r| r.peer_addr.as_str())
    }

    /// Forgets a replica that was removed from the quorum (stopping it if running).
    pub async fn forget_replica(&mut self, id: NodeId) -> anyhow::Result<()> {
        self.kill(id).await?;
        self.replicas.remove(&id);
        self.peers.remove(&id);
        Ok(())
    }

    /// Cuts every Raft link between replica `id` and the others (clients still reach it).
    pub fn isolate(&self, id: NodeId) {
        info!(node = id, "--- isolating replica");
        self.faults.isolate(id, self.replicas.keys().copied());
    }

    /// Limits every Raft link to `bytes_per_second` (`None`: unlimited again).
    pub fn limit_link_rate(&self, bytes_per_second: Option<u64>) {
        info!(?bytes_per_second, "--- limiting the Raft links' rate");
        self.faults.limit_rate(bytes_per_second);
    }

    /// Restores every Raft link.
    pub fn heal(&self) {
        info!("--- healing the network");
        self.faults.heal();
    }

    /// A copy of the state replica `id` has applied, if it is running.
    pub fn state_of(&self, id: NodeId) -> Option<DispatcherState> {
        let handle = self.replica(id)?;
        let applied = handle.state().read().expect("state lock poisoned");
        Some(applied.state.clone())
    }

    /// Applied log index of a running replica.
    pub fn applied_index(&self, id: NodeId) -> Option<u64> {
        let handle = self.replica(id)?;
        let metrics = handle.raft().metrics().borrow().clone();
        metrics.last_applied.map(|l| l.index)
    }

    /// The applied index of replica `id` once it holds every worker started so far and has
    /// applied the leader's log: the baseline of a test that checks what reached the log (on a
    /// loaded machine a worker's registration may land after the cluster is up).
    pub async fn settled_index(&self, id: NodeId, timeout: Duration) -> anyhow::Result<u64> {
        let workers = self.workers.len();
        wait_until("every worker's registration", timeout, || {
            self.state_of(id)
                .is_some_and(|state| state.workers().count() == workers)
        })
        .await?;
        self.wait_caught_up(id, timeout).await?;
        self.applied_index(id)
            .with_context(|| format!("replica {id} is not running"))
    }

    /// Waits until replica `id` has applied everything in the leader's log when called.
    ///
    /// The target is the leader's last log index, not its applied index: a leader fresh from an
    /// election applies the entries of earlier terms only once its own first entry commits, so
    /// until then its applied index trails what the cluster has already committed.
    pub async fn wait_caught_up(&self, id: NodeId, timeout: Duration) -> anyhow::Result<()> {
        let leader = self.wait_for_leader(timeout).await?;
        let target = self
            .replica(leader)
            .and_then(|handle| handle.raft().metrics().borrow().last_log_index)
            .unwrap_or(0);
        wait_until(
            &format!("replica {id} to apply index {target}"),
            timeout,
            || {
                self.applied_index(id)
                    .is_some_and(|applied| applied >= target)
            },
        )
        .await?;
        Ok(())
    }

    /// The certificates and tokens of a cluster started with [`LocalCluster::start_secure`].
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_deref()
    }

    pub fn worker_config(&self, listen: String) -> WorkerConfig {
        WorkerConfig {
            dispatcher: self.dispatcher_addrs(),
            listen,
            data_roots: vec![self.data_root.clone()],
            ..WorkerConfig::default()
        }
    }

    /// The directory every replica and worker may read files below (the only one): where a
    /// test writes the files its `files()` datasets name.
    pub fn data_root(&self) -> &std::path::Path {
        &self.data_root
    }

    /// Starts a new worker; returns its index.
    pub async fn add_worker(&mut self) -> anyhow::Result<usize> {
        self.add_worker_with(|_| {}).await
    }

    /// Starts a new worker with `tune` applied to its config (also on restarts), e.g. tags, a
    /// cross-trainer cache size, or `local: false` for a worker that clients in this process
    /// must treat as running on another host; returns its index.
    pub async fn add_worker_with(
        &mut self,
        tune: impl FnOnce(&mut WorkerConfig),
    ) -> anyhow::Result<usize> {
        let mut config = self.worker_config("127.0.0.1:0".into());
        if let Some(credentials) = &self.credentials {
            // A secure cluster's workers serve TLS and tokens, and call the dispatcher with
            // their certificate and worker token.
            config.security = credentials.worker()?;
        }
        tune(&mut config);
        let handle = WorkerHandle::start(config.clone()).await?;
        self.workers.push(Worker {
            addr: handle.addr().to_string(),
            config,
            handle: Some(handle),
        });
        Ok(self.workers.len() - 1)
    }

    /// Workers started so far (running or killed).
    pub fn num_workers(&self) -> usize {
        self.workers.len()
    }

    pub fn worker_addr(&self, index: usize) -> &str {
        &self.workers[index].addr
    }

    pub fn worker(&self, index: usize) -> Option<&WorkerHandle> {
        self.workers.get(index).and_then(|w| w.handle.as_ref())
    }

    pub async fn kill_worker(&mut self, index: usize) -> anyhow::Result<()> {
        if let Some(handle) = self.workers[index].handle.take() {
            handle.shutdown().await;
        }
        Ok(())
    }

    /// Restarts a killed worker at the same address (the dispatcher sees the same worker).
    pub async fn restart_worker(&mut self, index: usize) -> anyhow::Result<()> {
        let addr = self.workers[index].addr.clone();
        let listener = bind_again(&addr).await?;
        let config = WorkerConfig {
            dispatcher: self.dispatcher_addrs(),
            listen: addr,
            ..self.workers[index].config.clone()
        };
        let handle = WorkerHandle::start_on(listener, config).await?;
        self.workers[index].handle = Some(handle);
        Ok(())
    }

    /// Stops everything.
    pub async fn shutdown(mut self) {
        for worker in &mut self.workers {
            if let Some(handle) = worker.handle.take() {
                handle.shutdown().await;
            }
        }
        // All at once, so no replica spends its last moments failing to reach the others.
        let stopping = self
            .replicas
            .values_mut()
            .filter_map(|r| r.handle.take())
            .map(|h| h.shutdown());
        futures::future::join_all(stopping).await;
    }
}

/// Binds an address again; retries briefly while the old socket is being torn down.
pub async fn bind_again(addr: &str) -> anyhow::Result<tokio::net::TcpListener> {
    let mut last = None;
    for _ in 0..100 {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(anyhow::anyhow!(
        "bind {addr} again: {}",
        last.expect("at least one attempt")
    ))
}
