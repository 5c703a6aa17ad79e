//! `Cluster`: a dispatcher quorum and workers as child processes of the `sluice` binary (as
//! tf.data service's figures were taken: dispatcher, worker and client in separate processes),
//! and what the bench reads of them (the leader, a process's memory).

use crate::leader_probe::Target;
use anyhow::{bail, Context};
use serde_json::Value;
use sluice_client::DispatcherClient;
use sluice_security::ClientSecurity;
use sluice_testkit::{Credentials, SluiceProcess, TcpProxy};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

const STARTUP: Duration = Duration::from_secs(30);
/// Children log errors only: the failover workload kills a leader on purpose.
const CHILD_LOG: &str = "error,openraft=off";

/// A dispatcher quorum and workers as child processes; killed when dropped.
pub(crate) struct Cluster {
    _dir: tempfile::TempDir,
    pub(crate) dispatchers: Vec<SluiceProcess>,
    pub(crate) workers: Vec<SluiceProcess>,
    addrs: String,
    /// What the bench's own calls present (plain without credentials).
    security: ClientSecurity,
    /// With [`Cluster::start_proxied`]: what stands in front of each replica's ports.
    proxies: Option<Proxies>,
}

/// A proxy in front of each replica's client port (callers, and the leader hints, name the
/// proxy), and one on each directed Raft link, by replica index: a replica is cut off by
/// blackholing its client proxy and every link to or from it.
struct Proxies {
    clients: Vec<TcpProxy>,
    links: BTreeMap<(usize, usize), TcpProxy>,
}

/// Addresses of free ports, for replicas that must know each other's address before they start.
/// The listeners are dropped before the replicas bind, so another process may take a port in
/// between (rare on an idle machine).
fn free_addrs(n: usize) -> anyhow::Result<Vec<String>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.to_string()))
        .collect::<Result<Vec<_>, _>>()?)
}

impl Cluster {
    /// Starts `dispatchers` replicas of one quorum and `workers` workers of `sluice` (the
    /// binary's path), each waited for until it prints its READY line.
    /// With `creds`, every server runs with TLS and tokens and the bench's calls present the
    /// client's.
    pub(crate) fn start(
        sluice: &Path,
        dispatchers: usize,
        workers: usize,
        creds: Option<&Credentials>,
    ) -> anyhow::Result<Cluster> {
        Self::start_with(sluice, dispatchers, workers, creds, &[])
    }

    /// As [`Cluster::start`], each dispatcher also given `dispatcher_args`.
    pub(crate) fn start_with(
        sluice: &Path,
        dispatchers: usize,
        workers: usize,
        creds: Option<&Credentials>,
        dispatcher_args: &[&str],
    ) -> anyhow::Result<Cluster> {
        Self::launch(sluice, dispatchers, workers, creds, dispatcher_args, false)
    }

    /// As [`Cluster::start`], with proxies in front of every replica's client port and on
    /// every Raft link, so [`Cluster::cut_off`] can isolate a replica.
    pub(crate) fn start_proxied(
        sluice: &Path,
        dispatchers: usize,
        workers: usize,
        creds: Option<&Credentials>,
    ) -> anyhow::Result<Cluster> {
        Self::launch(sluice, dispatchers, workers, creds, &[], true)
    }

    /// Blackholes (`true`) or restores the client port of replica `index` and every Raft link
    /// to or from it.
    pub(crate) fn cut_off(&self, index: usize, on: bool) -> anyhow::Result<()> {
        let proxies = self
            .proxies
            .as_ref()
            .context("the cluster was started without proxies")?;
        proxies.clients[index].blackhole(on);
        for ((from, to), link) in &proxies.links {
            if *from == index || *to == index {
                link.blackhole(on);
            }
        }
        Ok(())
    }

    fn launch(
        sluice: &Path,
        dispatchers: usize,
        workers: usize,
        creds: Option<&Credentials>,
        dispatcher_args: &[&str],
        proxied: bool,
    ) -> anyhow::Result<Cluster> {
        let flags = |cert: &str, tokens: &str| match creds {
            Some(creds) => creds.server_flags(cert, tokens),
            None => Vec::new(),
        };
        let (dispatcher_flags, worker_flags) = (
            flags("dispatcher", "tokens"),
            flags("worker", "worker.tokens"),
        );
        let dir = tempfile::tempdir()?;
        // Each replica: a client address (`--listen`) and a Raft peer address (`--peers`).
        let mut addrs = free_addrs(2 * dispatchers)?;
        let peer_addrs = addrs.split_off(dispatchers);
        let peers: Vec<String> = peer_addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        let peers = peers.join(",");
        let proxies = match proxied {
            true => Some(Proxies {
                clients: addrs
                    .iter()
                    .map(|a| TcpProxy::to(a))
                    .collect::<anyhow::Result<_>>()?,
                links: (0..dispatchers)
                    .flat_map(|from| (0..dispatchers).map(move |to| (from, to)))
                    .filter(|(from, to)| from != to)
                    .map(|(from, to)| Ok(((from, to), TcpProxy::to(&peer_addrs[to])?)))
                    .collect::<anyhow::Result<_>>()?,
            }),
            false => None,
        };
        let mut procs = Vec::new();
        for id in 1..=dispatchers {
            let data = dir.path().join(format!("n{id}"));
            let args = [
                "--log",
                CHILD_LOG,
                "dispatcher",
                "--id",
                &id.to_string(),
                "--data-dir",
                data.to_str().context("utf-8 path")?,
                "--listen",
                &addrs[id - 1],
                "--peers",
                &peers,
                "--init",
            ]
            .map(str::to_string);
            // Behind proxies: the replica names its client proxy as its address, and reaches
            // each peer through the link's proxy.
            let proxy_args = match &proxies {
                Some(proxies) => {
                    let routes: Vec<String> = proxies
                        .links
                        .iter()
                        .filter(|((from, _), _)| *from == id - 1)
                        .map(|((_, to), link)| format!("{}={}", to + 1, link.addr()))
                        .collect();
                    vec![
                        "--advertise-address".to_string(),
                        proxies.clients[id - 1].addr(),
                        "--raft-routes".to_string(),
                        routes.join(","),
                    ]
                }
                None => Vec::new(),
            };
            let args: Vec<&str> = args
                .iter()
                .chain(&dispatcher_flags)
                .chain(&proxy_args)
                .map(String::as_str)
                .chain(dispatcher_args.iter().copied())
                .collect();
            procs.push(SluiceProcess::spawn(sluice, &args, STARTUP)?);
        }
        let all = match &proxies {
            Some(proxies) => proxies
                .clients
                .iter()
                .map(TcpProxy::addr)
                .collect::<Vec<_>>()
                .join(","),
            None => addrs.join(","),
        };
        let workers = (0..workers)
            .map(|_| {
                let mut args = vec!["--log", CHILD_LOG, "worker", "--dispatcher", &all];
                args.extend(["--listen", "127.0.0.1:0"]);
                args.extend(worker_flags.iter().map(String::as_str));
                SluiceProcess::spawn(sluice, &args, STARTUP)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Cluster {
            _dir: dir,
            dispatchers: procs,
            workers,
            addrs: all,
            security: match creds {
                Some(creds) => creds.client()?,
                None => ClientSecurity::default(),
            },
            proxies,
        })
    }

    /// The quorum as the scale workloads see it: client addresses and process ids.
    pub(crate) fn target(&self) -> anyhow::Result<Target> {
        let pids = self
            .dispatchers
            .iter()
            .map(|d| d.pid().context("a dispatcher's pid"))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Target {
            addrs: self.addrs.split(',').map(str::to_string).collect(),
            pids,
            security: self.security.clone(),
        })
    }

    pub(crate) fn client(&self) -> anyhow::Result<DispatcherClient> {
        Ok(DispatcherClient::connect(
            &self.addrs,
            sluice_client::RetryConfig::default(),
            self.security.clone(),
        )?)
    }

    /// The index of the replica that leads (highest term among those claiming it).
    pub(crate) async fn leader(&self) -> anyhow::Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut best: Option<(u64, usize)> = None;
            for (i, addr) in self.addrs.split(',').enumerate() {
                let retry = sluice_client::RetryConfig {
                    retry_timeout: Duration::from_millis(300),
                    ..Default::default()
                };
                let client = DispatcherClient::connect(addr, retry, self.security.clone())?;
                if let Ok(status) = client.get_status().await {
                    let v: Value = serde_json::from_str(&status)?;
                    let term = v["term"].as_u64().unwrap_or(0);
                    if v["state"] == "Leader" && best.is_none_or(|(t, _)| term > t) {
                        best = Some((term, i));
                    }
                }
            }
            if let Some((_, i)) = best {
                return Ok(i);
            }
            if Instant::now() > deadline {
                bail!("no leader within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Resident set size of a process, in MiB (Linux `/proc`; `self` for this one).
pub(crate) fn rss_mib(pid: &str) -> anyhow::Result<f64> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).context("read /proc status")?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS in /proc status")?;
    Ok(kib / 1024.0)
}
