//! `Cluster`: the dispatcher processes of a run, each the real `sluice` binary, started as
//! `sluice dispatcher --id I --data-dir DIR/nI --listen CLIENT --peers ... --raft-routes ...`
//! (plus the run's security flags) with stdout and stderr appended to `DIR/node-I.log`. Only
//! the first start passes `--init`: a restart needs the node's own journal, so a node that
//! came back without it would refuse to start and fail the run.
//!
//! Every node gets the same `--peers` (the real peer addresses; each node's Raft listener binds
//! its own entry) and its own `--raft-routes` (the link proxies, in front of the peer ports).
//! Each node advertises its front proxy (`--advertise-address`, see `worker_net`), so the leader
//! hints callers follow lead through the fronts; the harness's own status reads use the client
//! addresses directly. A node
//! keeps its addresses and data dir across restarts, so a restart recovers from disk alone. Each node sits behind its own tokio
//! mutex: the nemesis and the heal phase act on one node at a time, and a process handle is
//! held across `.await` (waiting for exit or for `READY`).

use crate::fixed_ports;
use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use sluice_proto::dispatcher as pb;
use sluice_proto::dispatcher::dispatcher_client::DispatcherClient as RpcClient;
use sluice_security::{AuthChannel, ClientSecurity};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

/// How the dispatcher processes are started.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub bin: PathBuf,
    pub dir: PathBuf,
    pub election_timeout: Duration,
    pub worker_timeout: Duration,
    /// `--raft-routes` per node id.
    pub routes: BTreeMap<u64, String>,
    /// `--advertise-address` per node id (its front proxy).
    pub advertise: BTreeMap<u64, SocketAddr>,
    /// Flags every node gets besides its addresses (TLS and token files).
    pub server_flags: Vec<String>,
    /// What the status reads present.
    pub status_security: ClientSecurity,
}

/// Where a node's process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    Running,
    Paused,
    Down,
}

/// Which start of a node: the first creates its journal, a restart needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    Init,
    Restart,
}

/// A node's two listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeAddrs {
    /// The client API (clients, workers, status reads).
    pub client: SocketAddr,
    /// The Raft peer listener (reached through the link proxies).
    pub peer: SocketAddr,
}

struct Node {
    id: u64,
    addrs: NodeAddrs,
    child: Option<Child>,
    state: NodeState,
}

pub struct Cluster {
    config: ClusterConfig,
    /// `--peers`: every node's peer address.
    peers: String,
    /// Every node's client address, comma-separated.
    client_addrs: String,
    nodes: BTreeMap<u64, Mutex<Node>>,
    /// One lazily connected channel per node for status reads (reconnects after restarts),
    /// carrying the status reads' token.
    channels: BTreeMap<u64, AuthChannel>,
}

/// How long a node may take to print `READY`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

impl Cluster {
    /// Picks two free ports per node (client and peer), so addresses stay fixed across
    /// restarts (see `fixed_ports`).
    pub fn pick_addrs(n: u64) -> anyhow::Result<BTreeMap<u64, NodeAddrs>> {
        let ports = fixed_ports::pick(2 * n as usize)?;
        Ok((1..=n)
            .zip(ports.chunks(2))
            .map(|(id, pair)| {
                let addrs = NodeAddrs {
                    client: pair[0],
                    peer: pair[1],
                };
                (id, addrs)
            })
            .collect())
    }

    /// Starts every node and waits for each `READY` line.
    pub async fn start(
        config: ClusterConfig,
        addrs: &BTreeMap<u64, NodeAddrs>,
    ) -> anyhow::Result<Cluster> {
        let peers = addrs
            .iter()
            .map(|(id, a)| format!("{id}={}", a.peer))
            .collect::<Vec<_>>()
            .join(",");
        let client_addrs = addrs
            .values()
            .map(|a| a.client.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = BTreeMap::new();
        let mut channels = BTreeMap::new();
        for (&id, &node_addrs) in addrs {
            nodes.insert(
                id,
                Mutex::new(Node {
                    id,
                    addrs: node_addrs,
                    child: None,
                    state: NodeState::Down,
                }),
            );
            let endpoint = config
                .status_security
                .endpoint(&node_addrs.client.to_string())?
                .connect_timeout(Duration::from_millis(300))
                .timeout(Duration::from_millis(700));
            let channel = config
                .status_security
                .connect_lazy(&endpoint, sluice_security::ServerRole::Dispatcher);
            channels.insert(id, config.status_security.authed(channel));
        }
        let cluster = Cluster {
            config,
            peers,
            client_addrs,
            nodes,
            channels,
        };
        // Start all at once: node 1 initializes the cluster and needs the others to elect.
        let starts = cluster.ids().map(|id| cluster.spawn_node(id, Start::Init));
        for result in futures::future::join_all(starts).await {
            result?;
        }
        Ok(cluster)
    }

    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.nodes.keys().copied()
    }

    /// Every node's client address, comma-separated (what workers and clients are given).
    pub fn addrs(&self) -> String {
        self.client_addrs.clone()
    }

    fn node(&self, id: u64) -> anyhow::Result<&Mutex<Node>> {
        self.nodes.get(&id).with_context(|| format!("no node {id}"))
    }

    pub async fn state(&self, id: u64) -> anyhow::Result<NodeState> {
        Ok(self.node(id)?.lock().await.state)
    }

    /// Restarts node `id` (it must be down) from its data dir and waits for its `READY` line.
    pub async fn spawn(&self, id: u64) -> anyhow::Result<()> {
        self.spawn_node(id, Start::Restart).await
    }

    async fn spawn_node(&self, id: u64, start: Start) -> anyhow::Result<()> {
        let mut node = self.node(id)?.lock().await;
        if node.state != NodeState::Down {
            bail!("node {id} is already running");
        }
        let data_dir = self.config.dir.join(format!("n{id}"));
        let log_path = self.config.dir.join(format!("node-{id}.log"));
        let open_log = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .with_context(|| format!("open {}", log_path.display()))
        };
        let stderr = open_log()?;
        let mut stdout_log = open_log()?;
        let mut child = Command::new(&self.config.bin)
            .arg("dispatcher")
            .arg("--id")
            .arg(id.to_string())
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--listen")
            .arg(node.addrs.client.to_string())
            .arg("--peers")
            .arg(&self.peers)
            .arg("--raft-routes")
            .arg(self.config.routes.get(&id).cloned().unwrap_or_default())
            .args(
                self.config
                    .advertise
                    .get(&id)
                    .map(|a| ["--advertise-address".to_string(), a.to_string()])
                    .into_iter()
                    .flatten(),
            )
            .arg("--election-timeout")
            .arg(humantime::format_duration(self.config.election_timeout).to_string())
            .arg("--worker-timeout")
            .arg(humantime::format_duration(self.config.worker_timeout).to_string())
            .args(&self.config.server_flags)
            .args(match start {
                Start::Init => &["--init"][..],
                Start::Restart => &[],
            })
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {}", self.config.bin.display()))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<String>();
        // Copies stdout into the log and reports the READY line.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut ready_tx = Some(ready_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                // A short blocking write per line: the node prints little on stdout.
                let _ = writeln!(stdout_log, "{line}");
                if let Some(addr) = line.strip_prefix("READY dispatcher ") {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(addr.trim().to_string());
                    }
                }
            }
        });
        let ready = tokio::time::timeout(READY_TIMEOUT, ready_rx).await;
        let addr = match ready {
            Ok(Ok(addr)) => addr,
            Ok(Err(_)) => {
                let status = child.wait().await.ok();
                bail!(
                    "node {id} exited before READY ({status:?}); see {}",
                    log_path.display()
                )
            }
            Err(_) => {
                let _ = child.kill().await;
                bail!("node {id} printed no READY within {READY_TIMEOUT:?}")
            }
        };
        // `READY dispatcher CLIENT peer=PEER`.
        let want = format!("{} peer={}", node.addrs.client, node.addrs.peer);
        if addr != want {
            bail!("node {id} serves at {addr}, expected {want}");
        }
        node.child = Some(child);
        node.state = NodeState::Running;
        Ok(())
    }

    fn signal(node: &Node, signal: Signal) -> anyhow::Result<()> {
        let pid = node
            .child
            .as_ref()
            .and_then(|c| c.id())
            .with_context(|| format!("node {} has no process", node.id))?;
        kill(Pid::from_raw(pid as i32), signal)
            .with_context(|| format!("{signal} node {}", node.id))
    }

    /// SIGKILL (after a SIGCONT if paused, so nothing lingers stopped); waits for the exit.
    pub async fn kill(&self, id: u64) -> anyhow::Result<()> {
        self.stop(id, Signal::SIGKILL).await
    }

    /// SIGTERM, a clean shutdown; SIGKILL after 5 s.
    pub async fn terminate(&self, id: u64) -> anyhow::Result<()> {
        self.stop(id, Signal::SIGTERM).await
    }

    async fn stop(&self, id: u64, signal: Signal) -> anyhow::Result<()> {
        let mut node = self.node(id)?.lock().await;
        if node.state == NodeState::Down {
            bail!("node {id} is already down");
        }
        Self::signal(&node, signal)?;
        if node.state == NodeState::Paused {
            Self::signal(&node, Signal::SIGCONT)?;
        }
        let mut child = node.child.take().context("child")?;
        if tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
        node.state = NodeState::Down;
        Ok(())
    }

    pub async fn pause(&self, id: u64) -> anyhow::Result<()> {
        let mut node = self.node(id)?.lock().await;
        if node.state != NodeState::Running {
            bail!("node {id} is not running");
        }
        Self::signal(&node, Signal::SIGSTOP)?;
        node.state = NodeState::Paused;
        Ok(())
    }

    pub async fn resume(&self, id: u64) -> anyhow::Result<()> {
        let mut node = self.node(id)?.lock().await;
        if node.state != NodeState::Paused {
            bail!("node {id} is not paused");
        }
        Self::signal(&node, Signal::SIGCONT)?;
        node.state = NodeState::Running;
        Ok(())
    }

    /// Brings every node back: SIGCONT the paused, start the down. Returns what it did.
    pub async fn heal(&self) -> anyhow::Result<Vec<String>> {
        let mut done = Vec::new();
        for id in self.ids().collect::<Vec<_>>() {
            match self.state(id).await? {
                NodeState::Running => {}
                NodeState::Paused => {
                    self.resume(id).await?;
                    done.push(format!("resumed {id}"));
                }
                NodeState::Down => {
                    self.spawn(id).await?;
                    done.push(format!("restarted {id}"));
                }
            }
        }
        Ok(done)
    }

    /// SIGKILLs every node (end of run).
    pub async fn shutdown(&self) {
        for id in self.ids().collect::<Vec<_>>() {
            let _ = self.kill(id).await;
        }
    }

    /// Node `id`'s `GetStatus` JSON (its own view, never forwarded), or why not.
    pub async fn status(&self, id: u64) -> anyhow::Result<Value> {
        let channel = self
            .channels
            .get(&id)
            .with_context(|| format!("no node {id}"))?
            .clone();
        let mut client = RpcClient::new(channel).max_decoding_message_size(usize::MAX);
        let mut request = tonic::Request::new(pb::GetStatusRequest::default());
        request.set_timeout(Duration::from_millis(700));
        let call = client.get_status(request);
        let response = tokio::time::timeout(Duration::from_millis(800), call)
            .await
            .map_err(|_| anyhow::anyhow!("node {id}: status timed out"))?
            .map_err(|s| anyhow::anyhow!("node {id}: {}", s.message()))?;
        serde_json::from_str(&response.into_inner().json).context("status json")
    }

    /// The leader among the nodes that answer: the highest term among those whose state is
    /// `Leader` (a restarted node may claim an old term for a moment).
    pub async fn leader(&self) -> Option<(u64, u64)> {
        let ids: Vec<u64> = self.ids().collect();
        let views = futures::future::join_all(ids.iter().map(|&id| self.status(id))).await;
        leader_of(views.into_iter().filter_map(Result::ok))
    }
}

/// `(node, term)` of the leader among status views.
pub fn leader_of(views: impl IntoIterator<Item = Value>) -> Option<(u64, u64)> {
    views
        .into_iter()
        .filter(|v| v["state"] == "Leader")
        .filter_map(|v| Some((v["node"].as_u64()?, v["term"].as_u64()?)))
        .max_by_key(|(_, term)| *term)
}
