//! The `sluice` binary's library: the subcommands behind the CLI and the demo.
//!
//! Layout:
//! - `cli`: argument definitions (clap) and the `run` entry point.
//! - `commands`: `dispatcher`, `worker`, `read`, `register`, `status`.
//! - `demo`: `sluice demo`, the main job on a fresh machine.
//! - `local_cluster`: `LocalCluster`, replicas and workers in one process (demo and tests).

pub mod cli;
pub mod commands;
pub mod demo;
pub mod local_cluster;
