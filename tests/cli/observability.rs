//! The metrics listener with real outside programs: a real Prometheus (Debian's `prometheus`)
//! scrapes a three-replica quorum and two workers during an epoch, and its query API returns
//! the expected series; the status page loaded in headless Chromium (Debian's `chromium`) shows
//! the three members and the running job, with a screenshot kept in `target/test-artifacts/`.
//!
//! Each outside program is looked up first; a missing one fails the test with the Debian
//! package to install.

use crate::{bin, sluice, STARTUP};
use sluice_tests::http;
use sluice_tests::process::SluiceProcess;
use sluice_tests::wait_until_blocking;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const LISTEN: &str = "127.0.0.1:0";

/// The path of `program`, or a failure naming the Debian package that has it.
fn require(program: &str, package: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "`{program}` is not installed: this test needs Debian's `{package}` package \
             (apt-get install -y {package})"
        )
    })
}

/// A three-replica quorum and two workers, each with a metrics listener, and an epoch being
/// read slowly enough to be watched.
struct Observed {
    _dir: tempfile::TempDir,
    replicas: Vec<SluiceProcess>,
    workers: Vec<SluiceProcess>,
    reader: Child,
}

impl Observed {
    fn start() -> Observed {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut replicas = Vec::new();
        for id in 1..=3u64 {
            let data_dir = dir.path().join(format!("n{id}"));
            let first_start = if id == 1 { "--init" } else { "--join" };
            let id_text = id.to_string();
            let args = [
                "dispatcher",
                "--id",
                &id_text,
                "--data-dir",
                data_dir.to_str().expect("utf-8"),
                "--listen",
                LISTEN,
                "--peer-listen",
                LISTEN,
                "--metrics-listen",
                LISTEN,
                first_start,
            ];
            replicas.push(SluiceProcess::spawn(bin(), &args, STARTUP).expect("a replica"));
        }
        for (index, replica) in replicas.iter().enumerate().skip(1) {
            let id = (index + 1).to_string();
            let peer = replica.peer_addr.clone().expect("a peer address");
            let (ok, out, err) = sluice(&[
                "admin",
                "add-node",
                "--dispatcher",
                &replicas[0].addr,
                "--id",
                &id,
                "--peer-addr",
                &peer,
            ]);
            assert!(ok, "add-node {id}: {out} {err}");
        }
        let all = replicas
            .iter()
            .map(|r| r.addr.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let workers: Vec<SluiceProcess> = (0..2)
            .map(|_| {
                let args = [
                    "worker",
                    "--dispatcher",
                    &all,
                    "--listen",
                    LISTEN,
                    "--metrics-listen",
                    LISTEN,
                ];
                SluiceProcess::spawn(bin(), &args, STARTUP).expect("a worker")
            })
            .collect();
        // About 40 s of reading: the epoch runs while Prometheus scrapes and Chromium looks.
        let reader = Command::new(bin())
            .args([
                "read",
                "--dispatcher",
                &all,
                "--dataset",
                "range(200000)",
                "--mode",
                "distributed_epoch",
                "--job-name",
                "watched",
                "--rate",
                "5000",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("sluice read");
        Observed {
            _dir: dir,
            replicas,
            workers,
            reader,
        }
    }

    fn metrics_addrs(nodes: &[SluiceProcess]) -> Vec<String> {
        nodes
            .iter()
            .map(|n| n.metrics_addr.clone().expect("READY names metrics="))
            .collect()
    }

    /// Waits until some replica serves a status page with three members and the job running.
    fn wait_status(&self) -> (String, serde_json::Value) {
        let mut found = None;
        wait_until_blocking(
            "a leader showing three members and a running iteration",
            Duration::from_secs(60),
            || {
                found = Self::metrics_addrs(&self.replicas)
                    .into_iter()
                    .find_map(|addr| {
                        let Ok((200, body)) = http::get(&addr, "/status.json") else {
                            return None;
                        };
                        let json: serde_json::Value =
                            serde_json::from_str(&body).expect("status.json is JSON");
                        let members = json["members"].as_array().map_or(0, Vec::len);
                        let running = json["iterations"]
                            .as_array()
                            .is_some_and(|its| its.iter().any(|it| it["finished"] == false));
                        (json["role"] == "leader" && members == 3 && running)
                            .then_some((addr, json))
                    });
                found.is_some()
            },
        )
        .unwrap();
        found.expect("waited for it")
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        let _ = self.reader.kill();
        let _ = self.reader.wait();
    }
}

/// A Prometheus server started by the test on a temp config and data dir; killed when dropped.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(dispatchers: &[String], workers: &[String]) -> Prometheus {
        let program = require("prometheus", "prometheus");
        let dir = tempfile::tempdir().expect("a temp dir");
        let targets = |addrs: &[String]| {
            addrs
                .iter()
                .map(|a| format!("'{a}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let config = format!(
            "global:\n  scrape_interval: 200ms\n  scrape_timeout: 150ms\nscrape_configs:\n  \
             - job_name: dispatchers\n    static_configs:\n      - targets: [{}]\n  \
             - job_name: workers\n    static_configs:\n      - targets: [{}]\n",
            targets(dispatchers),
            targets(workers)
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write the config");
        let mut child = Command::new(program)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start prometheus");
        // Prometheus logs the port it bound: `msg="Listening on" address=127.0.0.1:PORT`.
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some((_, after)) = line.split_once("msg=\"Listening on\" address=") {
                    let _ = tx.send(after.split_whitespace().next().unwrap_or("").to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("prometheus logged its listening address within 60 s");
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    /// The instant vector of `query`: each series' labels and value.
    fn query(&self, query: &str) -> Vec<(serde_json::Value, f64)> {
        let path = format!("/api/v1/query?query={}", url_encode(query));
        let Ok((200, body)) = http::get(&self.addr, &path) else {
            return Vec::new();
        };
        let json: serde_json::Value = serde_json::from_str(&body).expect("a JSON answer");
        json["data"]["result"]
            .as_array()
            .map(|series| {
                series
                    .iter()
                    .filter_map(|s| {
                        let value = s["value"][1].as_str()?.parse().ok()?;
                        Some((s["metric"].clone(), value))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until `query` returns `want(series)`; fails with the last answer past 60 s.
    fn wait_for(&self, query: &str, want: impl Fn(&[(serde_json::Value, f64)]) -> bool) {
        let mut got = Vec::new();
        let answered = wait_until_blocking(query, Duration::from_secs(60), || {
            got = self.query(query);
            want(&got)
        });
        if let Err(timed_out) = answered {
            panic!("{timed_out}: got {got:?}");
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_real_prometheus_scrapes_three_replicas_and_two_workers_during_an_epoch() {
    let cluster = Observed::start();
    let dispatchers = Observed::metrics_addrs(&cluster.replicas);
    let workers = Observed::metrics_addrs(&cluster.workers);
    let prometheus = Prometheus::start(&dispatchers, &workers);
    cluster.wait_status();

    let up = |job: &'static str, n: usize| {
        move |series: &[(serde_json::Value, f64)]| {
            series.len() == n
                && series
                    .iter()
                    .all(|(labels, v)| labels["job"] == job && *v == 1.0)
        }
    };
    prometheus.wait_for("up{job=\"dispatchers\"}", up("dispatchers", 3));
    prometheus.wait_for("up{job=\"workers\"}", up("workers", 2));
    prometheus.wait_for("sluice_raft_term", |series| {
        series.len() == 3 && series.iter().all(|(_, term)| *term >= 1.0)
    });
    prometheus.wait_for("sum(sluice_raft_is_leader)", |series| {
        series.first().is_some_and(|(_, v)| *v == 1.0)
    });
    prometheus.wait_for("sluice_workers", |series| {
        series.len() == 3 && series.iter().all(|(_, v)| *v == 2.0)
    });
    prometheus.wait_for("sluice_worker_elements_served_total", |series| {
        series.len() == 2 && series.iter().map(|(_, v)| v).sum::<f64>() > 0.0
    });
    prometheus.wait_for("sum(sluice_splits_leased_total)", |series| {
        series.first().is_some_and(|(_, v)| *v > 0.0)
    });
    prometheus.wait_for(
        "sluice_rpc_requests_total{method=\"WorkerHeartbeat\"}",
        |series| !series.is_empty(),
    );
}

/// Where test artifacts (screenshots) go: `target/test-artifacts/`.
fn artifacts_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.parent().unwrap_or(tmp).join("test-artifacts");
    std::fs::create_dir_all(&dir).expect("create the artifacts dir");
    dir
}

/// Runs headless Chromium on `url` with `extra` flags; its stdout.
fn chromium(url: &str, extra: &[String]) -> String {
    let program = require("chromium", "chromium");
    let profile = tempfile::tempdir().expect("a temp dir");
    let output = Command::new(program)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
            "--window-size=1200,1000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run chromium");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_status_page_in_headless_chromium_shows_the_three_members_and_the_running_job() {
    let cluster = Observed::start();
    let (addr, status) = cluster.wait_status();
    let url = format!("http://{addr}/");
    let dom = chromium(&url, &["--dump-dom".to_string()]);
    let section = |id: &str| {
        let start = dom
            .find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("no #{id} in the page: {dom}"));
        let end = dom[start..]
            .find("</table>")
            .map_or(dom.len(), |e| start + e);
        dom[start..end].to_string()
    };
    let members = section("members");
    let rows = members.matches("<tr>").count() - 1; // less the header row
    assert_eq!(rows, 3, "three members: {members}");
    assert!(members.contains("leader"), "{members}");
    assert!(members.contains("follower"), "{members}");
    let jobs = section("jobs");
    assert!(jobs.contains("watched"), "the job by name: {jobs}");
    let iterations = section("iterations");
    assert!(iterations.contains("running"), "{iterations}");
    assert!(dom.contains("serving"), "the replica says it serves");
    let workers = section("workers");
    let listed = status["workers"].as_array().map_or(0, Vec::len);
    assert_eq!(workers.matches("<tr>").count() - 1, listed, "{workers}");

    // A follower serves the same picture from its own state, marked as a follower of the
    // leader. Asked again, with the leader of that moment, if an election on a loaded machine
    // moved the leadership between reading the leader and loading the page.
    let mut dom = String::new();
    let marked = wait_until_blocking("a follower's page naming its leader", STARTUP, || {
        let (addr, status) = cluster.wait_status();
        let leader = status["node"].as_u64().expect("the leader's id");
        let follower = Observed::metrics_addrs(&cluster.replicas)
            .into_iter()
            .find(|a| *a != addr)
            .expect("a follower's listener");
        dom = chromium(&format!("http://{follower}/"), &["--dump-dom".to_string()]);
        dom.contains(&format!("follower (leader: {leader} at "))
    });
    assert!(marked.is_ok(), "a follower marks itself: {dom}");
    assert!(dom.contains("watched"), "and shows the job: {dom}");

    let screenshot = artifacts_dir().join("status-page.png");
    let _ = std::fs::remove_file(&screenshot);
    chromium(&url, &[format!("--screenshot={}", screenshot.display())]);
    let size = std::fs::metadata(&screenshot).map_or(0, |m| m.len());
    assert!(size > 1000, "a screenshot at {}", screenshot.display());
}
