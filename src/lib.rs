//! The `sluice` binary's library: the subcommands behind the CLI and the demo.
//!
//! Deliberately thin: each subcommand parses its arguments and calls the libraries. The bench
//! lives in `sluice-bench`, and the clusters the demo runs on in `sluice-testkit`.
//!
//! Layout:
//! - `cli`: argument definitions (clap), tracing set-up, and the `run` entry point.
//! - `commands`: `dispatcher`, `worker`, `read`, `register`, `status`, `admin`.
//! - `demo`: `sluice demo`, the main job on a fresh machine.
//! - `node_id_arg`: `--id N` or `--id from-hostname` (a StatefulSet pod's ordinal).

pub mod cli;
pub mod commands;
pub mod demo;
pub mod node_id_arg;
