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

#[test]
fn sigkill_of_the_leader_mid_epoch_keeps_the_epoch_exactly_once() {
    let data = tempfile::tempdir().expect("temp dir");
    let addrs = free_addrs(3);
    let peers = format!("1={},2={},3={}", addrs[0], addrs[1], addrs[2]);
    let all = addrs.join(",");
    let mut nodes: Vec<SluiceProcess> = (1..=3)
        .map(|id| {
            let dir = data.path().join(format!("n{id}"));
            let args = [
                "dispatcher",
                "--id",
                &id.to_string(),
                "--data-dir",
                dir.to_str().expect("utf-8"),
                "--peers",
                &peers,
            ]
            .map(str::to_string);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            SluiceProcess::spawn(bin(), &args, STARTUP).expect("dispatcher started")
        })
        .collect();
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
            let node: &mut SluiceProcess = &mut nodes[*previous as usize - 1];
            node.restart(STARTUP).expect("restarted");
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
