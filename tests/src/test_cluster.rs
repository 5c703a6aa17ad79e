//! `TestCluster`: dispatcher replicas and workers in this process, each a real server on
//! 127.0.0.1 with a port chosen by the OS, each replica with its own temp data dir. Replicas
//! and workers can be killed and restarted at the same address (and, for replicas, from the same
//! data dir), which is how tests show what survives a crash.

use anyhow::Context;
use sluice_client::{DispatcherClient, RetryConfig};
use sluice_dispatcher::ids::NodeId;
use sluice_dispatcher::{DispatcherConfig, DispatcherHandle};
use sluice_worker::{WorkerConfig, WorkerHandle};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tempfile::TempDir;
use tracing::info;

/// Raft timings for tests: fast, yet slow enough for a loaded 2-core machine.
pub fn test_dispatcher_config(
    id: NodeId,
    data_dir: PathBuf,
    peers: BTreeMap<NodeId, String>,
) -> DispatcherConfig {
    DispatcherConfig {
        id,
        data_dir,
        peers,
        heartbeat_interval: Duration::from_millis(50),
        election_timeout: (Duration::from_millis(300), Duration::from_millis(600)),
        ..DispatcherConfig::default()
    }
}

struct Replica {
    addr: String,
    data_dir: PathBuf,
    handle: Option<DispatcherHandle>,
}

struct Worker {
    addr: String,
    handle: Option<WorkerHandle>,
}

pub struct TestCluster {
    _dir: TempDir,
    replicas: BTreeMap<NodeId, Replica>,
    peers: BTreeMap<NodeId, String>,
    workers: Vec<Worker>,
}

impl TestCluster {
    /// Starts `replicas` dispatcher replicas (ids 1..=n) and `workers` workers, and waits until
    /// a leader is known.
    pub async fn start(replicas: usize, workers: usize) -> anyhow::Result<TestCluster> {
        crate::init_tracing();
        let dir = tempfile::tempdir()?;
        let mut listeners = BTreeMap::new();
        for id in 1..=replicas as NodeId {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            listeners.insert(id, listener);
        }
        let peers: BTreeMap<NodeId, String> = listeners
            .iter()
            .map(|(id, l)| (*id, l.local_addr().expect("bound").to_string()))
            .collect();
        let mut cluster = TestCluster {
            _dir: dir,
            replicas: BTreeMap::new(),
            peers: peers.clone(),
            workers: Vec::new(),
        };
        for (id, listener) in listeners {
            let data_dir = cluster._dir.path().join(format!("node-{id}"));
            let config = test_dispatcher_config(id, data_dir.clone(), peers.clone());
            let handle = DispatcherHandle::start_on(listener, config).await?;
            cluster.replicas.insert(
                id,
                Replica {
                    addr: peers[&id].clone(),
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

    /// Every replica's address, comma-separated, as clients and workers are given it.
    pub fn dispatcher_addrs(&self) -> String {
        self.peers.values().cloned().collect::<Vec<_>>().join(",")
    }

    pub fn client(&self) -> DispatcherClient {
        let retry = RetryConfig {
            retry_timeout: Duration::from_secs(60),
            ..RetryConfig::default()
        };
        DispatcherClient::with_retry(&self.dispatcher_addrs(), retry)
            .expect("cluster addresses are valid")
    }

    pub fn replica(&self, id: NodeId) -> Option<&DispatcherHandle> {
        self.replicas.get(&id).and_then(|r| r.handle.as_ref())
    }

    /// Waits until a running replica knows a leader that is running; returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> anyhow::Result<NodeId> {
        let mut found = None;
        crate::wait_until("a running leader", timeout, || {
            let leader = self.running_leader();
            found = leader;
            async move { leader.is_some() }
        })
        .await?;
        Ok(found.expect("waited for a leader"))
    }

    fn running_leader(&self) -> Option<NodeId> {
        self.replicas
            .values()
            .filter_map(|r| r.handle.as_ref())
            .find_map(|h| {
                let metrics = h.raft().metrics().borrow().clone();
                let leader = metrics.current_leader?;
                let alive = self
                    .replicas
                    .get(&leader)
                    .is_some_and(|r| r.handle.is_some());
                (alive && leader == h.id() && metrics.state.is_leader()).then_some(leader)
            })
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

    /// Restarts a killed replica at its address from its data dir.
    pub async fn restart(&mut self, id: NodeId) -> anyhow::Result<()> {
        let peers = self.peers.clone();
        let replica = self.replicas.get_mut(&id).context("no such replica")?;
        anyhow::ensure!(replica.handle.is_none(), "replica {id} is running");
        let listener = bind_again(&replica.addr).await?;
        let config = test_dispatcher_config(id, replica.data_dir.clone(), peers);
        replica.handle = Some(DispatcherHandle::start_on(listener, config).await?);
        info!(node = id, "--- restarted replica");
        Ok(())
    }

    /// Applied log index of a running replica.
    pub fn applied_index(&self, id: NodeId) -> Option<u64> {
        let handle = self.replica(id)?;
        let metrics = handle.raft().metrics().borrow().clone();
        metrics.last_applied.map(|l| l.index)
    }

    pub fn worker_config(&self, listen: String) -> WorkerConfig {
        WorkerConfig {
            dispatcher: self.dispatcher_addrs(),
            listen,
            ..WorkerConfig::default()
        }
    }

    /// Starts a new worker; returns its index.
    pub async fn add_worker(&mut self) -> anyhow::Result<usize> {
        let handle = WorkerHandle::start(self.worker_config("127.0.0.1:0".into())).await?;
        self.workers.push(Worker {
            addr: handle.addr().to_string(),
            handle: Some(handle),
        });
        Ok(self.workers.len() - 1)
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
        let handle = WorkerHandle::start_on(listener, self.worker_config(addr)).await?;
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
        for replica in self.replicas.values_mut() {
            if let Some(handle) = replica.handle.take() {
                handle.shutdown().await;
            }
        }
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
