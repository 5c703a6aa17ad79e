//! Three dispatcher processes: the leader is SIGKILLed mid-epoch, twice.

use crate::*;
use std::time::{Duration, Instant};

fn leader_of(addrs: &str) -> Option<u64> {
    let (ok, out, _) = sluice(&["status", "--dispatcher", addrs]);
    if !ok {
        return None;
    }
    let status: serde_json::Value = serde_json::from_str(&out).ok()?;
    (status["state"] == "Leader")
        .then(|| status["node"].as_u64())
        .flatten()
}

fn wait_leader(addrs: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(leader) = leader_of(addrs) {
            return leader;
        }
        assert!(Instant::now() < deadline, "no leader within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A replica's arguments, serving clients at `listen` and Raft at `peer_listen`.
fn replica_args(
    id: u64,
    dir: &std::path::Path,
    join: bool,
    listen: &str,
    peer_listen: &str,
) -> Vec<String> {
    let mut args = [
        "dispatcher",
        "--id",
        &id.to_string(),
        "--data-dir",
        dir.to_str().expect("utf-8"),
        "--listen",
        listen,
        "--peer-listen",
        peer_listen,
    ]
    .map(str::to_string)
    .to_vec();
    if join {
        args.push("--join".into());
    }
    args
}

fn spawn(args: &[String]) -> SluiceProcess {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    SluiceProcess::spawn(bin(), &args, STARTUP).expect("dispatcher started")
}

/// The voters `sluice status` reports, sorted.
fn voters(addrs: &str) -> Vec<u64> {
    let (ok, out, _) = sluice(&["status", "--dispatcher", addrs]);
    let status: serde_json::Value = match ok.then(|| serde_json::from_str(&out)) {
        Some(Ok(status)) => status,
        _ => return Vec::new(),
    };
    let mut voters: Vec<u64> = status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["voter"] == true)
        .filter_map(|m| m["id"].as_u64())
        .collect();
    voters.sort_unstable();
    voters
}

/// Each member's (client, peer) address as `sluice status` reports it, by id.
fn member_addrs(addrs: &str) -> Vec<(String, String)> {
    let (ok, out, _) = sluice(&["status", "--dispatcher", addrs]);
    let status: serde_json::Value = match ok.then(|| serde_json::from_str(&out)) {
        Some(Ok(status)) => status,
        _ => return Vec::new(),
    };
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let mut members: Vec<(u64, (String, String))> = status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m["id"].as_u64()?, (text(&m["addr"]), text(&m["peer_addr"])))))
        .collect();
    members.sort_unstable_by_key(|(id, _)| *id);
    members.into_iter().map(|(_, addrs)| addrs).collect()
}

/// Three replicas, each on a port the OS chose: replica 1 initializes a one-node cluster,
/// replicas 2 and 3 start empty (`--join`) and are added with `sluice admin add-node` at the
/// peer addresses their READY lines reported. No port is picked before its server binds it.
/// Returns the replicas and their arguments (each serving at its addresses, for restarts).
fn three_replicas(data: &std::path::Path) -> (Vec<SluiceProcess>, Vec<Vec<String>>) {
    let mut nodes = Vec::new();
    let mut args = Vec::new();
    for id in 1..=3u64 {
        let dir = data.join(format!("n{id}"));
        let node = spawn(&replica_args(
            id,
            &dir,
            id > 1,
            "127.0.0.1:0",
            "127.0.0.1:0",
        ));
        let peer_addr = node
            .peer_addr
            .clone()
            .expect("a dispatcher's READY names its peer port");
        // A restarted replica serves at the addresses it has: its peer address is its identity.
        args.push(replica_args(id, &dir, id > 1, &node.addr, &peer_addr));
        nodes.push(node);
    }
    for (id, node) in nodes.iter().enumerate().skip(1) {
        let id = (id + 1).to_string();
        let (ok, out, err) = sluice(&[
            "admin",
            "add-node",
            "--dispatcher",
            &nodes[0].addr,
            "--id",
            &id,
            "--peer-addr",
            node.peer_addr.as_deref().expect("a peer address"),
        ]);
        assert!(ok, "add-node {id}: {out} {err}");
    }
    let all = nodes
        .iter()
        .map(|n| n.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let deadline = Instant::now() + Duration::from_secs(30);
    while voters(&all) != [1, 2, 3] {
        assert!(Instant::now() < deadline, "three voters within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every replica records its own client address; status lists both of each member's.
    let want: Vec<(String, String)> = nodes
        .iter()
        .map(|n| (n.addr.clone(), n.peer_addr.clone().expect("a peer address")))
        .collect();
    while member_addrs(&all) != want {
        assert!(
            Instant::now() < deadline,
            "every member's addresses in status within 30 s: {:?}",
            member_addrs(&all)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (nodes, args)
}

#[test]
fn sigkill_of_the_leader_mid_epoch_keeps_the_epoch_exactly_once() {
    let data = tempfile::tempdir().expect("temp dir");
    let (mut nodes, args) = three_replicas(data.path());
    let all = nodes
        .iter()
        .map(|n| n.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let _workers = workers(&all, 2);
    let first = wait_leader(&all);

    let n = 200_000;
    let range = format!("range({n})");
    let reader = Reader::start(&[
        "--dispatcher",
        &all,
        "--dataset",
        &range,
        "--mode",
        "distributed_epoch",
        "--rate",
        "40000",
        "--max-outstanding-requests",
        "16",
    ]);
    let mut got = Vec::new();
    let mut kills = Vec::new();
    let mut longest_stall = Duration::ZERO;
    for at in [n / 3, 2 * n / 3, n] {
        let mut last = Instant::now();
        while (got.len() as i64) < at {
            let line = reader
                .lines
                .recv_timeout(Duration::from_secs(30))
                .expect("elements keep coming");
            got.push(line);
            longest_stall = longest_stall.max(last.elapsed());
            last = Instant::now();
        }
        if at == n {
            break;
        }
        if let Some(previous) = kills.last() {
            let index = *previous as usize - 1;
            nodes[index] = spawn(&args[index]);
        }
        let leader = if kills.is_empty() {
            first
        } else {
            wait_leader(&all)
        };
        nodes[leader as usize - 1].kill();
        kills.push(leader);
    }
    let (ok, got) = reader.finish(got, Duration::from_secs(60));
    assert!(ok, "the reader failed");
    assert_exactly_once(&got, n);
    assert_eq!(kills.len(), 2);
    // The reader reads 40,000 lines/s, so lines are ~25 µs apart; a failover shows as the
    // longest gap. The quorum issue's bound: under 2 s (aim: under 1 s).
    eprintln!("longest stall seen by the reader: {longest_stall:?}");
    assert!(
        longest_stall < Duration::from_secs(2),
        "longest stall {longest_stall:?}"
    );
}
