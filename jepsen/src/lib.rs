//! `sluice-jepsen`: the chaos harness of Sluice. It runs the real `sluice` binary as dispatcher
//! processes, routes their Raft traffic through in-process TCP proxies, runs workers and
//! clients in-process, injects a seeded schedule of faults (SIGKILL, SIGSTOP/SIGCONT, restarts,
//! partitions), records everything in a JSONL history and checks it afterwards.
//!
//! A run is `valid` only when every checker says so; a checker that cannot tell (the faults it
//! was promised did not happen) makes the run `unknown`, never `valid`.
//!
//! Layout:
//! - `cli`: the `run` and `self-test` arguments (clap).
//! - `runner`: one run, phase by phase: setup, faults, heal, final epoch, final reads, checks.
//! - `self_test`: builds the `planted-bug` dispatcher in its own target dir and expects `invalid`.
//! - `cluster`: `Cluster`, the dispatcher processes (spawn, kill, pause, restart, status).
//! - `proxy`: `ProxyNet`, one TCP proxy per directed Raft link, modes pass / blackhole / reset.
//! - `schedule`: `Schedule`, the seeded fault plan, generated up front.
//! - `nemesis`: `Nemesis`, executes the schedule against the cluster and the proxies.
//! - `monitor`: `Monitor`, polls every node's status and records leader changes.
//! - `workload`: in-process workers (with a lease observer) and clients.
//! - `run_security`: `RunSecurity`, the run's certificates and tokens (TLS and tokens unless
//!   `--plain`).
//! - `history`: `History`, the append-only `history.jsonl` and its `Event`s.
//! - `checker`: one property per file, and the verdict.
//! - `report`: `report.html`, a self-contained SVG timeline.

pub mod checker;
pub mod cli;
pub mod cluster;
pub mod history;
pub mod monitor;
pub mod nemesis;
pub mod proxy;
pub mod report;
pub mod run_security;
pub mod runner;
pub mod schedule;
pub mod self_test;
pub mod workload;
