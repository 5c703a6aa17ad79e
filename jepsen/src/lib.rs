//! `sluice-jepsen`: the chaos harness of Sluice. It runs the real `sluice` binary as dispatcher
//! and worker processes, routes their Raft traffic, the workers' calls to the dispatchers and
//! the readers' fetch streams through in-process TCP proxies, runs clients (readers)
//! in-process, injects a seeded schedule of faults on dispatchers and workers (SIGKILL,
//! SIGSTOP/SIGCONT, restarts, partitions), records everything in a JSONL history and checks it
//! afterwards.
//!
//! A run is `valid` only when every checker says so; a checker that cannot tell (the faults it
//! was promised did not happen) makes the run `unknown`, never `valid`.
//!
//! Layout:
//! - `cli`: the `run` and `self-test` arguments (clap).
//! - `runner`: one run, phase by phase: setup, faults, heal, final epoch, final reads, checks.
//! - `self_test`: builds binaries with planted bugs in their own target dirs and expects
//!   `invalid` from each.
//! - `cluster`: `Cluster`, the dispatcher processes (spawn, kill, pause, restart, status).
//! - `worker_pool`: `WorkerPool`, the worker processes, their incarnations and leases.
//! - `fixed_ports`: ports for processes that keep their address across restarts.
//! - `proxy`: `Proxy`, one cuttable TCP proxy, with per-caller modes.
//! - `proxy_net`: `ProxyNet`, a proxy per directed Raft link.
//! - `worker_net`: `WorkerNet`, the dispatchers' fronts and the workers' reader proxies.
//! - `socket_owner`: which local process opened a loopback connection (for the fronts).
//! - `schedule`: `Schedule`, the seeded fault plan (a dispatcher track and a worker track).
//! - `nemesis`: `Nemesis`, executes the schedule against the processes and the proxies.
//! - `monitor`: `Monitor`, polls every node's status; records leader changes, jobs'
//!   iterations, workers registered and removed.
//! - `lease_book`: `LeaseBook`, the leases seen so far, to name each element's worker.
//! - `workload`: in-process clients.
//! - `run_security`: `RunSecurity`, the run's certificates and tokens (TLS and tokens unless
//!   `--plain`).
//! - `history`: `History`, the append-only `history.jsonl` and its `Event`s.
//! - `checker`: one property per file, and the verdict.
//! - `report`: `report.html`, a self-contained SVG timeline.

pub mod checker;
pub mod cli;
pub mod cluster;
pub mod fixed_ports;
pub mod history;
pub mod lease_book;
pub mod monitor;
pub mod nemesis;
pub mod proxy;
pub mod proxy_net;
pub mod report;
pub mod run_security;
pub mod runner;
pub mod schedule;
pub mod self_test;
pub mod socket_owner;
pub mod trainer;
pub mod worker_net;
pub mod worker_pool;
pub mod workload;
