//! The `sluice` binary's library: the subcommands behind the CLI and the demo.
//!
//! Layout:
//! - `cli`: argument definitions (clap) and the `run` entry point.
//! - `commands`: `dispatcher`, `worker`, `read`, `register`, `status`.
//! - `demo`: `sluice demo`, the main job on a fresh machine.
//! - `bench`: `sluice bench`, throughput and latency figures.
//! - `local_cluster`: `LocalCluster`, replicas and workers in one process (demo and tests).
//! - `process`: running `sluice` servers as child processes (bench and tests).

pub mod bench;
pub mod cli;
pub mod commands;
pub mod demo;
pub mod local_cluster;
pub mod process;
