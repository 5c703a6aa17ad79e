//! Membership changes and `--init` through the binary, as an operator makes them: a replica
//! that does not catch up never becomes a voter, bad ids and addresses are refused, a removal
//! that would lose the quorum is refused, and a replica that lost its disk cannot erase
//! acknowledged writes by starting with `--init`: it takes the documented way back (remove it,
//! start it with `--join`, add it).

use crate::failover::{replica_args, sluice_at, spawn, three_replicas, voters, wait_leader, Flags};
use crate::security::certs;
use crate::*;
use sluice_tests::wait_until_blocking;
use std::io::Read;
use std::time::Duration;

/// A peer address where nothing listens: a port bound, then released.
fn unreachable_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("bound").to_string()
}

fn joined(nodes: &[SluiceProcess]) -> String {
    nodes
        .iter()
        .map(|n| n.addr.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// `sluice admin <command> --dispatcher <addrs> <args>` with the admin's flags.
fn admin(command: &str, addrs: &str, args: &[&str], flags: &Flags) -> (bool, String, String) {
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    all.extend(flags.admin.iter().cloned());
    sluice_at(&["admin", command], addrs, &all)
}

/// `--peers` naming each replica's peer address.
fn peers_flag(nodes: &[SluiceProcess]) -> String {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            format!(
                "{}={}",
                i + 1,
                n.peer_addr.as_deref().expect("a peer address")
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The dataset ids replica `addr` itself has applied (`sluice status` of that replica alone).
fn dataset_ids(addr: &str, flags: &Flags) -> Vec<String> {
    let (ok, out, _) = sluice_at(&["status"], addr, &flags.client);
    let Some(Ok(status)) = ok.then(|| serde_json::from_str::<serde_json::Value>(&out)) else {
        return Vec::new();
    };
    status["datasets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d.as_str().map(str::to_string))
        .collect()
}

#[test]
fn add_node_of_an_unreachable_address_leaves_the_voters_unchanged_and_names_the_node() {
    let flags = Flags::plain();
    let data = tempfile::tempdir().expect("temp dir");
    let (mut nodes, _) = three_replicas(data.path(), &flags);
    let all = joined(&nodes);

    let nowhere = unreachable_addr();
    let started = std::time::Instant::now();
    let (ok, out, err) = admin(
        "add-node",
        &all,
        &[
            "--id",
            "4",
            "--peer-addr",
            &nowhere,
            "--catch-up-timeout",
            "2s",
        ],
        &flags,
    );
    assert!(!ok, "an unreachable node was added: {out}");
    assert!(
        err.contains(&format!(
            "node 4 at peer address {nowhere} did not catch up within 2s"
        )) && err.contains("the voters are unchanged ({1, 2, 3})")
            && err.contains("it was removed as a learner"),
        "{err}"
    );
    eprintln!("refused after {:?}", started.elapsed());
    assert_eq!(voters(&all, &flags), [1, 2, 3]);

    // Each refused before anything is proposed, with what was wrong.
    let node_2_peer = nodes[1].peer_addr.clone().expect("a peer address");
    let cases: [(&str, &str, &str); 6] = [
        ("0", "127.0.0.1:7001", "node id 0 is not valid"),
        ("4", "\\0junk", "peer address \"\\\\0junk\" has no port"),
        (
            "4",
            "bad\u{7}host:7001",
            "holds the control character '\\u{7}'",
        ),
        ("4", "127.0.0.1:0", "has port 0"),
        ("1", "127.0.0.1:7001", "node 1 is already a voter"),
        ("4", &node_2_peer, "is already node 2's"),
    ];
    for (id, addr, words) in cases {
        let (ok, out, err) = admin("add-node", &all, &["--id", id, "--peer-addr", addr], &flags);
        assert!(
            !ok,
            "add-node --id {id} --peer-addr {addr:?} was accepted: {out}"
        );
        assert!(
            err.contains(words),
            "add-node --id {id} --peer-addr {addr:?}: {err}"
        );
    }
    assert_eq!(voters(&all, &flags), [1, 2, 3]);

    // The quorum is intact: with a follower stopped, the other two still commit.
    let leader = wait_leader(&all, &flags);
    let stopped = if leader == 3 { 2 } else { 3 };
    nodes[stopped as usize - 1].kill();
    let (ok, _, err) = sluice_at(
        &["register"],
        &all,
        &[
            vec![
                "--dataset".into(),
                "range(3)".into(),
                "--dataset-id".into(),
                "after".into(),
            ],
            flags.client.clone(),
        ]
        .concat(),
    );
    assert!(ok, "{err}");
    // Removing a live voter now would leave the live ones no majority.
    let live = (1..=3u64)
        .find(|id| *id != leader && *id != stopped)
        .expect("a third");
    let (ok, out, err) = admin("remove-node", &all, &["--id", &live.to_string()], &flags);
    assert!(!ok, "a removal that loses the quorum was accepted: {out}");
    assert!(err.contains("pass --force"), "{err}");
    assert_eq!(voters(&all, &flags), [1, 2, 3]);
}

#[test]
fn init_against_a_live_cluster_that_knows_the_node_is_refused() {
    let creds = certs();
    let flags = Flags::secure(&creds);
    let data = tempfile::tempdir().expect("temp dir");
    let (mut nodes, _) = three_replicas(data.path(), &flags);
    let all = joined(&nodes);
    let peers = peers_flag(&nodes);
    wait_leader(&all, &flags);

    // Replica 3 loses its disk and is started again with --init, at its own addresses.
    let (addr3, peer3) = (
        nodes[2].addr.clone(),
        nodes[2].peer_addr.clone().expect("peer"),
    );
    nodes[2].kill();
    let dir3 = data.path().join("n3");
    std::fs::remove_dir_all(&dir3).expect("wipe replica 3");
    let mut args = replica_args(3, &dir3, Some("--init"), &addr3, &peer3, &flags);
    // Replicas 1 and 2 answer at once; the long wait only bounds a hang, so the refusal comes
    // before READY however loaded the machine is.
    args.extend([
        "--peers".to_string(),
        peers,
        "--init-check-wait".into(),
        "60s".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = sluice(&args);
    assert!(!ok, "--init on a known node started: {out}");
    assert!(!out.contains("READY"), "{out}");
    let err = err.trim_end();
    assert!(!err.contains('\n'), "more than one line: {err}");
    assert!(
        err.starts_with("error: --init refused: peer ")
            && err.contains("belongs to a running cluster (voters {1, 2, 3}")
            && err.contains(&format!("in which node 3 has served (at {addr3})"))
            && err.contains(
                "`sluice admin remove-node --id 3`, start it with --join instead of --init"
            )
            && err.contains("`sluice admin add-node --id 3 --peer-addr"),
        "{err}"
    );
    assert!(!dir3.exists(), "a refused start made the data dir");
    assert_eq!(voters(&all, &flags), [1, 2, 3]);
}

/// The scenario of a replica that lost its disk: stop replica 2; register a dataset through 1
/// and 3 (acknowledged); stop 1 and 3; wipe 3's data dir and start it with `--init` while no
/// peer runs, then 2 normally. Replica 3 refuses once 2 answers (instead of voting 2, which
/// lacks the dataset, into leadership), 1 returns, and the documented recovery (remove-node,
/// `--join`, add-node) ends with the dataset on all three replicas.
#[test]
fn a_replica_that_lost_its_disk_rejoins_by_the_documented_path_and_no_write_is_lost() {
    let flags = Flags::plain();
    let data = tempfile::tempdir().expect("temp dir");
    let (mut nodes, args) = three_replicas(data.path(), &flags);
    let all = joined(&nodes);
    let peers = peers_flag(&nodes);
    wait_leader(&all, &flags);

    nodes[1].kill();
    let (ok, _, err) = sluice_at(
        &["register"],
        &all,
        &[
            "--dataset".into(),
            "range(7)".into(),
            "--dataset-id".into(),
            "kept".into(),
        ],
    );
    assert!(ok, "registration with replicas 1 and 3: {err}");
    nodes[0].kill();
    nodes[2].kill();
    let dir3 = data.path().join("n3");
    std::fs::remove_dir_all(&dir3).expect("wipe replica 3");

    // Replica 3 with --init, while no peer answers: it serves, but takes no part in Raft.
    let (addr3, peer3) = (
        nodes[2].addr.clone(),
        nodes[2].peer_addr.clone().expect("peer"),
    );
    let mut init_args = replica_args(3, &dir3, Some("--init"), &addr3, &peer3, &flags);
    // No peer runs: it says it serves after a short wait, and keeps asking.
    init_args.extend([
        "--peers".to_string(),
        peers,
        "--init-check-wait".into(),
        "1s".into(),
    ]);
    let mut init3 = std::process::Command::new(bin())
        .args(&init_args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn replica 3");
    let stdout = init3.stdout.take().expect("stdout");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            if line.starts_with("READY dispatcher") {
                let _ = ready_tx.send(line);
            }
        }
    });
    let mut stderr = init3.stderr.take().expect("stderr");
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    // It says it serves once its wait for answers is over (the check goes on).
    ready_rx
        .recv_timeout(STARTUP)
        .expect("replica 3 serves while it waits for its peers");

    // Replica 2 restarts normally; replica 3 hears from it and stops.
    nodes[1] = spawn(&args[1]);
    let mut status = None;
    wait_until_blocking("replica 3 stops", Duration::from_secs(60), || {
        status = init3.try_wait().expect("wait for replica 3");
        status.is_some()
    })
    .unwrap();
    assert!(
        !status.expect("exited").success(),
        "replica 3 exited cleanly"
    );
    let errors = errors.join().expect("stderr");
    assert!(
        errors.contains("--init refused: peer 2 belongs to a running cluster")
            && errors.contains("in which node 3 has served"),
        "{errors}"
    );

    // Replica 1 returns: 1 and 2 elect a leader, and the dataset is there.
    nodes[0] = spawn(&args[0]);
    let two = format!("{},{}", nodes[0].addr, nodes[1].addr);
    wait_leader(&two, &flags);

    // The way back: remove node 3, start it with --join (empty data dir, same id and
    // addresses), add it; it catches up and becomes a voter.
    let (ok, out, err) = admin("remove-node", &two, &["--id", "3"], &flags);
    assert!(ok, "remove-node 3: {out} {err}");
    assert_eq!(voters(&two, &flags), [1, 2]);
    nodes[2] = spawn(&replica_args(
        3,
        &dir3,
        Some("--join"),
        &addr3,
        &peer3,
        &flags,
    ));
    let (ok, out, err) = admin(
        "add-node",
        &two,
        &["--id", "3", "--peer-addr", &peer3],
        &flags,
    );
    assert!(ok, "add-node 3: {out} {err}");
    assert_eq!(voters(&all, &flags), [1, 2, 3]);

    for node in &nodes {
        let mut ids = Vec::new();
        let present = wait_until_blocking(
            "the acknowledged dataset on every replica",
            Duration::from_secs(30),
            || {
                ids = dataset_ids(&node.addr, &flags);
                ids.iter().any(|id| id == "kept")
            },
        );
        if let Err(timed_out) = present {
            panic!("{timed_out}: replica at {} has {ids:?}", node.addr);
        }
    }
}
