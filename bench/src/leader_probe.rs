//! `Target`: the quorum the scale and soak workloads run against, and what they read of its
//! leader: which replica it is, its process's CPU time and memory (Linux `/proc`), and the
//! sizes `sluice status` reports (the encoded state, the last snapshot).
//!
//! The replicas are child processes in `sluice bench` and run in the test's own process in the
//! bench's tests; there the leader's process is this one.

use anyhow::{bail, Context};
use serde_json::Value;
use sluice_rpc::{DispatcherClient, RetryConfig};
use sluice_security::ClientSecurity;
use std::time::Duration;

const MIB: f64 = 1024.0 * 1024.0;

/// The `/proc/<pid>/stat` times are in clock ticks of `USER_HZ`, 100 on Linux's mainstream
/// configurations.
const TICKS_PER_SECOND: f64 = 100.0;

/// The replicas' client addresses, and their process ids in the same order (empty: they run
/// in this process).
pub struct Target {
    pub addrs: Vec<String>,
    pub pids: Vec<u32>,
    pub security: ClientSecurity,
}

/// The leader's process, `self` or a pid.
#[derive(Clone)]
pub(crate) struct LeaderProcess(String);

/// Sizes from the leader's status.
pub(crate) struct Sizes {
    pub(crate) state_mib: f64,
    pub(crate) snapshot_mib: f64,
    /// Whether another replica leads than at the start.
    pub(crate) leader_changed: bool,
}

impl Target {
    /// A client of the quorum; a caller that cannot get an answer for 10 s reports an error
    /// (each attempt has its own 5 s deadline).
    pub fn client(&self) -> anyhow::Result<DispatcherClient> {
        let retry = RetryConfig {
            retry_timeout: Duration::from_secs(10),
            ..RetryConfig::default()
        };
        Ok(DispatcherClient::connect(
            &self.addrs.join(","),
            retry,
            self.security.clone(),
        )?)
    }

    /// The status JSON of the quorum's leader. Slow on a large state (it lists every worker,
    /// job, iteration and task), hence a patient client of its own.
    /// Returns once the state holds no job (every finished job was removed); polls the status
    /// every half second.
    pub(crate) async fn wait_jobs_removed(&self) {
        loop {
            if let Ok(status) = self.status().await {
                if status["state_sizes"]["jobs"].as_u64() == Some(0) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn status(&self) -> anyhow::Result<Value> {
        let client =
            DispatcherClient::connect(&self.addrs.join(","), patient(), self.security.clone())?;
        let status = client.get_status().await.context("sluice status")?;
        let status: Value = serde_json::from_str(&status)?;
        if status["state"] == "Leader" {
            return Ok(status);
        }
        // A follower answered: ask the leader it names.
        let leader = status["leader_addr"]
            .as_str()
            .context("no leader address in the status")?;
        let client = DispatcherClient::connect(leader, patient(), self.security.clone())?;
        let status = client.get_status().await.context("sluice status")?;
        Ok(serde_json::from_str(&status)?)
    }

    /// The leader's process. Call it while the state is small: it reads the status.
    pub(crate) async fn leader(&self) -> anyhow::Result<LeaderProcess> {
        let status = self.status().await?;
        self.process_of(&status)
    }

    fn process_of(&self, status: &Value) -> anyhow::Result<LeaderProcess> {
        if self.pids.is_empty() {
            return Ok(LeaderProcess("self".into()));
        }
        let leader = status["leader_addr"]
            .as_str()
            .context("no leader address in the status")?;
        let Some(index) = self.addrs.iter().position(|a| a == leader) else {
            bail!("the leader {leader} is none of {:?}", self.addrs);
        };
        Ok(LeaderProcess(self.pids[index].to_string()))
    }

    /// The state and snapshot sizes the leader reports (a replica without a snapshot yet: 0),
    /// and whether the leader is no longer `leader`'s process (said aloud: the CPU and memory
    /// figures are then the deposed leader's).
    pub(crate) async fn sizes(&self, leader: &LeaderProcess) -> anyhow::Result<Sizes> {
        let status = self.status().await?;
        let now = self.process_of(&status)?;
        let leader_changed = now.0 != leader.0;
        if leader_changed {
            println!(
                "the leader changed during the run (process {} then {}): its CPU and RSS \
                 figures are the first leader's",
                leader.0, now.0
            );
        }
        let state = status["state_bytes"]
            .as_u64()
            .context("no state_bytes in the status")?;
        Ok(Sizes {
            state_mib: state as f64 / MIB,
            snapshot_mib: status["snapshot_bytes"].as_u64().unwrap_or(0) as f64 / MIB,
            leader_changed,
        })
    }
}

/// Retries of the status calls, which take seconds on a large state.
fn patient() -> RetryConfig {
    RetryConfig {
        rpc_timeout: Duration::from_secs(120),
        retry_timeout: Duration::from_secs(240),
        ..RetryConfig::default()
    }
}

impl LeaderProcess {
    /// User and system CPU time so far, in seconds.
    pub(crate) fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.0)).context("read /proc stat")?;
        // The fields after the command name, which is in parentheses and may hold spaces:
        // state is field 3, utime 14 and stime 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| -> anyhow::Result<f64> {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .context("cpu times in /proc stat")
        };
        Ok((ticks(11)? + ticks(12)?) / TICKS_PER_SECOND)
    }

    pub(crate) fn rss_mib(&self) -> anyhow::Result<f64> {
        crate::cluster::rss_mib(&self.0)
    }
}
