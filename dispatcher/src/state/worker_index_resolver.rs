//! `WorkerIndexResolver`: the fixed worker list of static sharding, and each worker's index in
//! it (tf.data's `WorkerIndexResolver`).
//!
//! The list comes from the dispatcher's configuration (`worker_addresses`). Entries are
//! `host:port`, or a host without port, or `host:%port%` / `host:%port_name%` (any port). A
//! registering worker's address is valid iff it equals an entry, or an entry without a concrete
//! port names its host; registration replaces that entry by the concrete address, so the
//! position of a worker in the list is its index for good: a worker restarted at the same
//! address matches its own entry again, and a host can hold only as many workers as it has
//! entries. An empty list lets any worker register, and then workers have no index.
//!
//! Replication: every replica must resolve the same indices, so the list is not read from the
//! local configuration inside `apply`. The leader puts its configured list into each
//! `RegisterWorker` update; the first one applied is recorded here, and a later update carrying a
//! different list (a replica started with other `--worker-addresses`) is refused instead of
//! silently giving workers other indices.

use crate::state::update::Rejection;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerIndexResolver {
    /// The list as configured, placeholders intact; `None` until the first worker registers.
    configured: Option<Vec<String>>,
    /// The list with each placeholder that a worker took replaced by that worker's address.
    addresses: Vec<String>,
}

impl WorkerIndexResolver {
    /// Records the configured list the first time; afterwards checks that `configured` is the
    /// same list.
    pub fn record_config(&mut self, configured: &[String]) -> Result<(), Rejection> {
        match &self.configured {
            None => {
                self.configured = Some(configured.to_vec());
                self.addresses = configured.to_vec();
                Ok(())
            }
            Some(recorded) if recorded.as_slice() == configured => Ok(()),
            Some(recorded) => Err(Rejection::FailedPrecondition(format!(
                "this dispatcher is configured with worker addresses [{}], but the cluster \
                 recorded [{}] from the replica that first registered a worker; every dispatcher \
                 replica must run with the same --worker-addresses",
                configured.join(", "),
                recorded.join(", ")
            ))),
        }
    }

    /// Registers `address`: takes its entry (exact, else the first free entry for its host), or
    /// refuses it with tf.data's text. Registering an address again keeps its entry.
    pub fn add_worker(&mut self, address: &str) -> Result<(), Rejection> {
        if self.addresses.is_empty() || self.addresses.iter().any(|a| a == address) {
            return Ok(());
        }
        match self
            .addresses
            .iter_mut()
            .find(|entry| takes_any_port(entry, address))
        {
            Some(entry) => {
                *entry = address.to_string();
                Ok(())
            }
            None => Err(Rejection::FailedPrecondition(format!(
                "Failed to assign an index for worker {address}. Configured workers list: [{}]. \
                 The worker's address is not configured, or other workers are already running at \
                 the configured host. If your worker has restarted, make sure it runs at the same \
                 address and port.",
                self.addresses.join(", ")
            ))),
        }
    }

    /// The worker's position in the list, if it has one.
    pub fn index(&self, address: &str) -> Option<u64> {
        self.addresses
            .iter()
            .position(|a| a == address)
            .map(|i| i as u64)
    }

    /// Length of the list: the number of static shards.
    pub fn num_workers(&self) -> u64 {
        self.addresses.len() as u64
    }

    /// The list with the addresses of registered workers in place of their placeholders.
    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }
}

/// Splits `host:port`; `[v6]:port` keeps its brackets in the host, and a bare IPv6 literal
/// (several colons, no brackets) is all host.
fn host_and_port(address: &str) -> (&str, Option<&str>) {
    if address.starts_with('[') {
        return match address.split_once("]:") {
            Some((host, port)) => (&address[..host.len() + 1], Some(port)),
            None => (address, None),
        };
    }
    match address.split_once(':') {
        Some((host, port)) if !port.contains(':') => (host, Some(port)),
        _ => (address, None),
    }
}

/// Whether the entry leaves the port open (none, `%port%`, `%port_name%`) and names the host of
/// `address`, which has a port.
fn takes_any_port(entry: &str, address: &str) -> bool {
    let (entry_host, entry_port) = host_and_port(entry);
    let (host, port) = host_and_port(address);
    let open_port = match entry_port {
        None => true,
        Some(p) => p.starts_with("%port") && p.ends_with('%'),
    };
    open_port && port.is_some() && entry_host == host
}
