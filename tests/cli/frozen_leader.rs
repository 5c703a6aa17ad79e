//! Three dispatcher processes whose leader is SIGSTOPped for 5 s: its ports still accept
//! connections and nothing is answered, as in a long GC or swap pause or a stalled VM. Callers
//! must move to the next leader within an election, and the thawed leader must step down
//! without answering from its stale state.

use crate::failover::{sluice_at, three_replicas, wait_leader, Flags};
use crate::*;
use std::time::{Duration, Instant};

/// How long the leader stays stopped.
const FREEZE: Duration = Duration::from_secs(5);
/// The bound on a caller's wait for the next leader (the default election timeout is
/// 200-400 ms).
const BOUND: Duration = Duration::from_secs(1);

/// The replica's own view in `sluice status` at `addr`: (state, term).
fn own_view(addr: &str) -> Option<(String, u64)> {
    let (ok, out, _) = sluice_at(&["status"], addr, &[]);
    let status: serde_json::Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
    Some((status["state"].as_str()?.to_string(), status["term"].as_u64()?))
}

#[test]
fn a_frozen_leader_stalls_neither_a_running_reader_nor_a_new_epoch() {
    let flags = Flags::plain();
    let data = tempfile::tempdir().expect("temp dir");
    let (nodes, _) = three_replicas(data.path(), &flags);
    let all = nodes
        .iter()
        .map(|n| n.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let _workers = workers(&all, 2);
    let leader = wait_leader(&all, &flags) as usize - 1;
    let (_, term_before) = own_view(&nodes[leader].addr).expect("the leader's status");

    // 4,000 elements a second for 10 s: the freeze falls in the middle.
    let n = 40_000;
    let range = format!("range({n})");
    let running = Reader::start(&[
        "--dispatcher",
        &all,
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
    let mut frozen_at = None;
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
        if frozen_at.is_none() && got.len() >= n as usize / 4 {
            nodes[leader].pause().expect("SIGSTOP the leader");
            frozen_at = Some(Instant::now());
            // A new epoch begins while the leader is stopped: a reader started now, told of
            // every replica (the stopped one first when it is node 1).
            let all = all.clone();
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
        if let Some(at) = frozen_at.filter(|at| at.elapsed() >= FREEZE) {
            if nodes[leader].resume().is_ok() {
                frozen_at = Some(at - Duration::from_secs(3600));
            }
        }
    }
    let (ok, got) = running.finish(got, Duration::from_secs(60));
    assert!(ok, "the running reader failed");
    assert_exactly_once(&got, n);
    let (first_after, ok, lines) = new_epoch
        .expect("the freeze happened")
        .join()
        .expect("the new epoch's reader");
    assert!(ok, "the new epoch's reader failed");
    assert_exactly_once(&lines, 10);

    // The thawed leader learned of the newer term and follows.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match own_view(&nodes[leader].addr) {
            Some((state, term)) if state != "Leader" && term > term_before => break,
            view => assert!(
                Instant::now() < deadline,
                "the thawed leader still leads: {view:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "leader stopped for {FREEZE:?}: new epoch's first element after {first_after:?}, \
         running reader's longest stall {longest_stall:?}"
    );
    assert!(first_after < BOUND, "first element after {first_after:?}");
    assert!(longest_stall < BOUND, "longest stall {longest_stall:?}");
}
