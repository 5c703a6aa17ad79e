//! `OpsNode`: what a dispatcher or worker hands its operations listener. The listener knows
//! nothing of Raft or tasks; it asks the node.

use prometheus_client::registry::Registry;
use std::future::Future;
use std::pin::Pin;

/// A boxed future borrowing the node (the trait stays object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait OpsNode: Send + Sync + 'static {
    /// The node's metrics; encoded on every scrape, after `refresh`.
    fn registry(&self) -> &Registry;

    /// Brings the values read at scrape time (gauges of the applied state, Raft's indexes) up
    /// to date, and drops series of things the node has forgotten.
    fn refresh(&self) -> BoxFuture<'_, ()>;

    /// `Ok` while the node serves (what that means is the node's: see its implementation),
    /// else the one-line reason it does not.
    fn readiness(&self) -> BoxFuture<'_, Result<(), String>>;

    /// The status page's data; `None` on nodes without a status page (workers).
    fn status_json(&self) -> Option<BoxFuture<'_, serde_json::Value>> {
        None
    }

    /// The status page (one self-contained HTML document); `None` on nodes without one.
    fn status_page(&self) -> Option<&'static str> {
        None
    }
}
