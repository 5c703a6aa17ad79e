//! Three dispatcher processes whose leader answers nothing for the rest of a running epoch:
//! SIGSTOPped (a long GC or swap pause, a stalled VM), or cut off with its client port and every
//! Raft link to or from it blackholed (a half-open network path). Its ports still accept connections either way.
//! Callers must move to the next leader within an election, and the old leader must step down
//! when the fault ends, without answering from its stale state: no element is lost or repeated.

use crate::failover::{sluice_at, three_replicas, voters, wait_leader, Flags};
use crate::*;
use sluice_testkit::TcpProxy;
use sluice_tests::wait_until_blocking;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long the leader stays silent at most: it is restored when both readers have read
/// everything (the running one about 7.5 s after the fault began), or after this long. Well
/// over `HANG`, so a reader that waited on the silent leader would wait past the bounds below.
const FAULT: Duration = Duration::from_secs(40);
/// The bound on the running reader's longest stall and on the new epoch's first element: only
/// a caller that waited on the silent leader, or hung, crosses it. How long they take is a
/// benchmark figure (`sluice bench --only pause,partition`: `pause_stall_ms`,
/// `pause_first_element_ms`, `partition_stall_ms`, `partition_first_element_ms`): an election
/// for the new epoch (0.65-0.82 s in a release build), and for the running reader, whose
/// workers hold leased splits ahead, usually nothing at all (5-7 ms). This debug build measured
/// 0.08-1.78 s and 0.75-1.7 s on a loaded machine.
const HANG: Duration = sluice_tests::HANG;

/// The replica's own view in `sluice status` at `addr`: (state, term).
fn own_view(addr: &str) -> Option<(String, u64)> {
    let (ok, out, _) = sluice_at(&["status"], addr, &[]);
    let status: serde_json::Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
    Some((
        status["state"].as_str()?.to_string(),
        status["term"].as_u64()?,
    ))
}

/// Three replicas behind proxies: one in front of each client port (callers and leader hints
/// name it) and one on each directed Raft link, by replica index. Every server binds port 0;
/// a proxy learns its target once the server it stands for is ready.
struct ProxiedReplicas {
    nodes: Vec<SluiceProcess>,
    clients: Vec<TcpProxy>,
    links: BTreeMap<(usize, usize), TcpProxy>,
}

impl ProxiedReplicas {
    fn start(data: &std::path::Path) -> ProxiedReplicas {
        let clients: Vec<TcpProxy> = (0..3).map(|_| TcpProxy::bind().expect("a proxy")).collect();
        let links: BTreeMap<(usize, usize), TcpProxy> = (0..3)
            .flat_map(|from| (0..3).map(move |to| (from, to)))
            .filter(|(from, to)| from != to)
            .map(|link| (link, TcpProxy::bind().expect("a proxy")))
            .collect();
        let mut nodes: Vec<SluiceProcess> = Vec::new();
        for (index, client) in clients.iter().enumerate() {
            let routes: Vec<String> = links
                .iter()
                .filter(|((from, _), _)| *from == index)
                .map(|((_, to), link)| format!("{}={}", to + 1, link.addr()))
                .collect();
            let dir = data.join(format!("n{}", index + 1));
            let args = [
                "dispatcher",
                "--id",
                &(index + 1).to_string(),
                "--data-dir",
                dir.to_str().expect("utf-8"),
                "--listen",
                "127.0.0.1:0",
                "--peer-listen",
                "127.0.0.1:0",
                "--advertise-address",
                &client.addr(),
                "--raft-routes",
                &routes.join(","),
                if index == 0 { "--init" } else { "--join" },
            ];
            let node = SluiceProcess::spawn(bin(), &args, STARTUP).expect("dispatcher started");
            let peer_addr = node.peer_addr.clone().expect("a peer address");
            client.set_target(&node.addr).expect("a target");
            for ((_, to), link) in &links {
                if *to == index {
                    link.set_target(&peer_addr).expect("a target");
                }
            }
            if index > 0 {
                let (ok, out, err) = sluice(&[
                    "admin",
                    "add-node",
                    "--dispatcher",
                    &nodes[0].addr,
                    "--id",
                    &(index + 1).to_string(),
                    "--peer-addr",
                    &peer_addr,
                ]);
                assert!(ok, "add-node {}: {out} {err}", index + 1);
            }
            nodes.push(node);
        }
        let replicas = ProxiedReplicas {
            nodes,
            clients,
            links,
        };
        wait_until_blocking("three voters", Duration::from_secs(30), || {
            voters(&replicas.addrs(), &Flags::plain()) == [1, 2, 3]
        })
        .unwrap();
        replicas
    }

    /// The client proxies' addresses, what callers are given.
    fn addrs(&self) -> String {
        self.clients
            .iter()
            .map(TcpProxy::addr)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Blackholes (`true`) or restores replica `index`'s client port and Raft links.
    fn cut_off(&self, index: usize, on: bool) {
        self.clients[index].blackhole(on);
        for ((from, to), link) in &self.links {
            if *from == index || *to == index {
                link.blackhole(on);
            }
        }
    }
}

#[test]
fn a_frozen_leader_stalls_neither_a_running_reader_nor_a_new_epoch() {
    let data = tempfile::tempdir().expect("temp dir");
    let (nodes, _) = three_replicas(data.path(), &Flags::plain());
    let all = nodes
        .iter()
        .map(|n| n.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let _workers = workers(&all, 2);
    let own_addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    silent_leader_mid_epoch(
        &all,
        &own_addrs,
        |leader| nodes[leader].pause().expect("SIGSTOP the leader"),
        |leader| nodes[leader].resume().expect("SIGCONT the leader"),
    );
}

#[test]
fn a_cut_off_leader_stalls_neither_a_running_reader_nor_a_new_epoch() {
    let data = tempfile::tempdir().expect("temp dir");
    let replicas = ProxiedReplicas::start(data.path());
    let all = replicas.addrs();
    let _workers = workers(&all, 2);
    let own_addrs: Vec<String> = replicas.nodes.iter().map(|n| n.addr.clone()).collect();
    silent_leader_mid_epoch(
        &all,
        &own_addrs,
        |leader| replicas.cut_off(leader, true),
        |leader| replicas.cut_off(leader, false),
    );
}

/// A reader of `range(40000)` at 4,000 elements a second; a quarter in, `silence` silences the
/// leader of that moment (by index; `own_addrs` are the replicas' own client addresses) and a
/// new epoch starts; when the running reader is done (or `FAULT` later), `restore` ends the
/// fault. Both epochs arrive exactly once, while the leader is silent: neither the running
/// reader nor the new epoch waits for it (each within `HANG`, which only a wait on the silent
/// leader crosses); and the old leader follows a newer term.
fn silent_leader_mid_epoch(
    all: &str,
    own_addrs: &[String],
    silence: impl Fn(usize),
    restore: impl Fn(usize),
) {
    let n = 40_000;
    let range = format!("range({n})");
    let running = Reader::start(&[
        "--dispatcher",
        all,
        "--dataset",
        &range,
        "--mode",
        "distributed_epoch",
        "--rate",
        "4000",
        "--max-outstanding-requests",
        "16",
    ]);
    let mut got = Vec::new();
    let mut longest_stall = Duration::ZERO;
    let mut last = Instant::now();
    let mut new_epoch = None;
    let mut silent_since = None;
    let mut leader = None;
    let mut restored = false;
    while got.len() < n as usize {
        match running.lines.recv_timeout(Duration::from_millis(20)) {
            Ok(line) => {
                got.push(line);
                longest_stall = longest_stall.max(last.elapsed());
                last = Instant::now();
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if silent_since.is_none() && got.len() >= n as usize / 4 {
            // The leader of this moment: a loaded machine may have elected another since the
            // cluster started.
            let at = wait_leader(all, &Flags::plain()) as usize - 1;
            let (_, term) = own_view(&own_addrs[at]).expect("the leader's status");
            leader = Some((at, term));
            silence(at);
            silent_since = Some(Instant::now());
            // The lines that arrived meanwhile wait in the channel: asking was no stall.
            last = Instant::now();
            // A new epoch begins while the leader is silent: a reader started now, told of
            // every replica.
            let all = all.to_string();
            new_epoch = Some(std::thread::spawn(move || {
                let started = Instant::now();
                let reader = Reader::start(&[
                    "--dispatcher",
                    &all,
                    "--dataset",
                    "range(10)",
                    "--mode",
                    "distributed_epoch",
                ]);
                let first = reader
                    .lines
                    .recv_timeout(Duration::from_secs(30))
                    .expect("the new epoch's first element");
                let first_after = started.elapsed();
                let (ok, lines) = reader.finish(vec![first], Duration::from_secs(30));
                (first_after, ok, lines)
            }));
        }
        if let Some((at, _)) = leader.filter(|_| !restored) {
            if silent_since.is_some_and(|since| since.elapsed() >= FAULT) {
                restore(at);
                restored = true;
            }
        }
    }
    let (leader, term_before) = leader.expect("the fault began");
    // The new epoch, too, is read to its end before the fault ends (unless `FAULT` passed).
    let (first_after, ok, lines) = new_epoch
        .expect("the fault began")
        .join()
        .expect("the new epoch's reader");
    if !restored {
        restore(leader);
    }
    let (running_ok, got) = running.finish(got, Duration::from_secs(60));
    assert!(running_ok, "the running reader failed");
    assert_exactly_once(&got, n);
    assert!(ok, "the new epoch's reader failed");
    assert_exactly_once(&lines, 10);

    // The old leader learned of the newer term and follows.
    let mut view = None;
    let follows = wait_until_blocking("the old leader to follow", Duration::from_secs(30), || {
        view = own_view(&own_addrs[leader]);
        matches!(&view, Some((state, term)) if state != "Leader" && *term > term_before)
    });
    if let Err(timed_out) = follows {
        panic!("{timed_out}: the old leader still leads: {view:?}");
    }
    eprintln!(
        "leader silent (at most {FAULT:?}): new epoch's first element after {first_after:?}, \
         running reader's longest stall {longest_stall:?}"
    );
    assert!(
        first_after < HANG,
        "first element after {first_after:?}: the new epoch waited for the silent leader"
    );
    assert!(
        longest_stall < HANG,
        "longest stall {longest_stall:?}: the running reader waited for the silent leader"
    );
}
