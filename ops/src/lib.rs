//! Operations over HTTP for Sluice's servers: the listener every dispatcher and worker opens
//! with `--metrics-listen`, serving `/metrics` (Prometheus), `/live`, `/ready` and, on a
//! dispatcher, the status page (`/`) and its data (`/status.json`).
//!
//! What a node measures and how it decides readiness is the node's own (`OpsNode`, implemented
//! in the dispatcher and worker crates); this crate holds what both share, so neither depends
//! on the other. Every node has its own `Registry`: a process may run several nodes (the test
//! cluster runs three dispatchers and their workers in one), so nothing here is global.
//!
//! Layout:
//! - `ops_node`: `OpsNode`, what a node hands the listener (its registry, readiness, status).
//! - `ops_server`: `OpsServer`, the HTTP/1 listener and its routes, cancelled with the node.
//! - `rpc_metrics`: `RpcMetrics` and `RpcMetricsLayer`, per-RPC counts, errors and latency as
//!   a tower layer on a tonic server.
//! - `exposition`: a strict reader of the text format, for tests and health checks.
//! - `error`: `OpsError`.

pub mod error;
pub mod exposition;
pub mod ops_node;
pub mod ops_server;
pub mod rpc_metrics;

pub use error::OpsError;
pub use ops_node::{BoxFuture, OpsNode};
pub use ops_server::OpsServer;
pub use prometheus_client;
pub use rpc_metrics::{RpcMetrics, RpcMetricsLayer};

/// Buckets of latency histograms, in seconds: 100 µs to about 13 s, doubling.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 18)
}
