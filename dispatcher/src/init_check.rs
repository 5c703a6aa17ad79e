//! `--init` that cannot erase a cluster: before a replica with a new, empty journal takes part
//! in Raft, it asks its configured peers what they know, and refuses to start if they already
//! form a cluster in which it has served (or one that does not include it).
//!
//! The hazard: a voter that lost its disk and comes back with `--init` has an empty log and no
//! vote. It grants its vote to any candidate, so with it a replica that lacks acknowledged
//! writes can win an election, and the new leader then truncates those writes on every
//! replica. Raft's safety assumes a voter never forgets what it acknowledged.
//!
//! What counts as "has served": a running replica records its client address in the
//! membership (see `client_addr_announcer`), so a peer whose membership holds this replica's id
//! with a client address knows that this id served in its cluster. On a first start of a new
//! cluster the replicas' addresses are empty until each has served, so replicas started with
//! `--init` one after another, even after the lowest id has initialized the cluster, pass.
//! A peer that belongs to a cluster without this id refuses too: this replica would otherwise
//! wait for ever (or, as the lowest id, make up a cluster of its own beside it).
//!
//! Until the check passes, the replica serves only `Probe` on its peer listener (see
//! [`PeerGate`]): Raft's own calls are refused, so it votes for nobody. It needs answers from
//! enough peers that they and it make a majority of the configured replicas; peers that do not
//! answer yet (a new cluster starting) are asked again until enough do. Deliberately not
//! checked: a replica started with `--init` and no `--peers` (a one-node cluster; it has no
//! one to ask), and one whose journal is not empty (`--init` changes nothing there).

use crate::raft_network::PeerNetwork;
use sluice_proto::raft::ProbeResponse;
use sluice_types::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How long one peer may take to answer a probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between rounds of probes that did not decide.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

/// Whether this replica takes part in Raft yet: closed while a replica started with `--init`
/// checks its peers. Shared by the peer service and the check.
#[derive(Clone)]
pub struct PeerGate(Arc<AtomicBool>);

impl PeerGate {
    pub fn new(open: bool) -> Self {
        PeerGate(Arc::new(AtomicBool::new(open)))
    }

    pub fn open(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_open(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What the check concludes from the answers so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Enough peers answered, none of them a cluster this replica may not start beside.
    Proceed,
    /// A peer's cluster knows this replica (or excludes it): the reason, with the way back.
    Refuse(String),
    /// Too few answers yet; the peers that gave none.
    Wait(Vec<NodeId>),
}

/// Judges the `answers` of this replica's (`me`) peers; `replicas` is the number of configured
/// replicas, this one included.
pub fn judge(
    me: NodeId,
    replicas: usize,
    answers: &BTreeMap<NodeId, Result<ProbeResponse, String>>,
) -> Verdict {
    for (peer, answer) in answers {
        let Ok(view) = answer else { continue };
        if view.voters.is_empty() {
            continue;
        }
        let voters: BTreeSet<u64> = view.voters.iter().copied().collect();
        let leader = match view.leader {
            0 => "none known".to_string(),
            leader => leader.to_string(),
        };
        if !view.member {
            return Verdict::Refuse(format!(
                "--init refused: peer {peer} belongs to a running cluster (voters {voters:?}, \
                 leader {leader}) of which node {me} is not a member; start this replica with \
                 --join instead, then add it with `sluice admin add-node --id {me} --peer-addr \
                 <its peer address>`"
            ));
        }
        if !view.member_addr.is_empty() {
            return Verdict::Refuse(format!(
                "--init refused: peer {peer} belongs to a running cluster (voters {voters:?}, \
                 leader {leader}) in which node {me} has served (at {}); its acknowledged \
                 writes live on those replicas, and a new empty journal here could help elect a \
                 leader that lacks them. To bring this replica back with an empty data dir: \
                 `sluice admin remove-node --id {me}`, start it with --join instead of --init, \
                 then `sluice admin add-node --id {me} --peer-addr <its peer address>`",
                view.member_addr
            ));
        }
    }
    let answered = answers.values().filter(|a| a.is_ok()).count();
    match (answered + 1) * 2 > replicas {
        true => Verdict::Proceed,
        false => Verdict::Wait(
            answers
                .iter()
                .filter(|(_, a)| a.is_err())
                .map(|(peer, _)| *peer)
                .collect(),
        ),
    }
}

/// The check of one replica started with `--init` on an empty journal.
pub struct InitCheck {
    pub me: NodeId,
    /// The other replicas' peer addresses.
    pub peers: BTreeMap<NodeId, String>,
    pub network: PeerNetwork,
}

impl InitCheck {
    /// Asks every peer once; the verdict on all the answers.
    pub async fn round(&self) -> Verdict {
        let mut calls = JoinSet::new();
        for (peer, addr) in &self.peers {
            let (peer, addr, network) = (*peer, addr.clone(), self.network.clone());
            calls.spawn(async move { (peer, network.probe(peer, &addr, PROBE_TIMEOUT).await) });
        }
        let mut answers = BTreeMap::new();
        while let Some(joined) = calls.join_next().await {
            if let Ok((peer, answer)) = joined {
                answers.insert(peer, answer);
            }
        }
        for (peer, answer) in &answers {
            if let Err(e) = answer {
                tracing::debug!(node = self.me, peer, error = %e, "peer gave no answer to the --init check");
            }
        }
        judge(self.me, self.peers.len() + 1, &answers)
    }

    /// Asks in rounds until a verdict other than `Wait`, or `deadline` (then the last `Wait`;
    /// a deadline already past asks nobody).
    pub async fn until(&self, deadline: Instant) -> Verdict {
        if Instant::now() >= deadline {
            return Verdict::Wait(self.peers.keys().copied().collect());
        }
        loop {
            let verdict = self.round().await;
            if !matches!(verdict, Verdict::Wait(_)) || Instant::now() + ROUND_PAUSE >= deadline {
                return verdict;
            }
            tokio::time::sleep(ROUND_PAUSE).await;
        }
    }

    /// Asks in rounds until a verdict other than `Wait`, with no deadline.
    pub async fn decide(&self) -> Verdict {
        loop {
            let verdict = self.round().await;
            if !matches!(verdict, Verdict::Wait(_)) {
                return verdict;
            }
            tokio::time::sleep(ROUND_PAUSE).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(voters: &[u64], member: bool, addr: &str) -> Result<ProbeResponse, String> {
        Ok(ProbeResponse {
            initialized: !voters.is_empty(),
            voters: voters.to_vec(),
            learners: Vec::new(),
            leader: voters.first().copied().unwrap_or(0),
            member,
            member_addr: addr.to_string(),
            has_log: !voters.is_empty(),
            last_log_index: 7,
        })
    }

    fn pristine() -> Result<ProbeResponse, String> {
        view(&[], false, "")
    }

    fn silent() -> Result<ProbeResponse, String> {
        Err("Unavailable: connection refused".into())
    }

    #[test]
    fn verdicts_table() {
        // (me, replicas, answers, the verdict or the refusal's words)
        type Case = (
            u64,
            usize,
            Vec<(u64, Result<ProbeResponse, String>)>,
            Result<Verdict, &'static str>,
        );
        let cases: Vec<Case> = vec![
            // A new cluster: the peers are pristine too, or not up yet.
            (
                2,
                3,
                vec![(1, pristine()), (3, silent())],
                Ok(Verdict::Proceed),
            ),
            (
                1,
                3,
                vec![(2, silent()), (3, silent())],
                Ok(Verdict::Wait(vec![2, 3])),
            ),
            (
                1,
                5,
                vec![(2, pristine()), (3, silent()), (4, silent()), (5, silent())],
                Ok(Verdict::Wait(vec![3, 4, 5])),
            ),
            (
                1,
                5,
                vec![
                    (2, pristine()),
                    (3, pristine()),
                    (4, silent()),
                    (5, silent()),
                ],
                Ok(Verdict::Proceed),
            ),
            // The lowest id initialized already; this replica never served: its address is empty.
            (
                3,
                3,
                vec![(1, view(&[1, 2, 3], true, "")), (2, silent())],
                Ok(Verdict::Proceed),
            ),
            // A replica that lost its disk: a peer knows it served.
            (
                3,
                3,
                vec![(1, silent()), (2, view(&[1, 2, 3], true, "127.0.0.1:5053"))],
                Err("in which node 3 has served (at 127.0.0.1:5053)"),
            ),
            // Refused even before enough answers: one is proof enough.
            (
                1,
                5,
                vec![
                    (2, view(&[1, 2, 3, 4, 5], true, "h1:5051")),
                    (3, silent()),
                    (4, silent()),
                    (5, silent()),
                ],
                Err("sluice admin remove-node --id 1"),
            ),
            // A cluster without this id: --join, not --init.
            (
                4,
                3,
                vec![(1, view(&[1, 2, 3], false, "")), (2, silent())],
                Err("of which node 4 is not a member; start this replica with --join"),
            ),
        ];
        for (me, replicas, answers, want) in cases {
            let answers: BTreeMap<_, _> = answers.into_iter().collect();
            let got = judge(me, replicas, &answers);
            match (&want, &got) {
                (Ok(want), got) => assert_eq!(want, got, "node {me}: {answers:?}"),
                (Err(words), Verdict::Refuse(why)) => {
                    assert!(why.contains(words), "{why}");
                    assert!(why.starts_with("--init refused: "), "{why}");
                }
                (Err(words), got) => {
                    panic!("node {me}: wanted a refusal with {words:?}, got {got:?}")
                }
            }
        }
    }
}
