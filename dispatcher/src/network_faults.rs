//! `NetworkFaults`: cut or slow Raft links between replicas of one process, for tests of
//! partitions and of slow networks.
//!
//! A cut link `(from, to)` makes every Raft RPC `from` sends to `to` fail as unreachable, like a
//! silent network partition. A link rate makes every Raft RPC wait, before it is sent, for as
//! long as its payload would take at that rate, within the RPC's deadline, like a link of that
//! bandwidth. Only test harnesses install it; production replicas have none.

use sluice_types::NodeId;
use std::collections::HashSet;
use std::sync::RwLock;
use std::time::Duration;

#[derive(Debug, Default)]
pub struct NetworkFaults {
    /// A std lock: read on every RPC, written by the test between phases.
    cut: RwLock<HashSet<(NodeId, NodeId)>>,
    /// Bytes per second every Raft link carries, if limited.
    rate: RwLock<Option<u64>>,
}

impl NetworkFaults {
    /// Cuts every link between `node` and `others`, both ways.
    pub fn isolate(&self, node: NodeId, others: impl IntoIterator<Item = NodeId>) {
        let mut cut = self.cut.write().expect("fault lock poisoned");
        for other in others.into_iter().filter(|o| *o != node) {
            cut.insert((node, other));
            cut.insert((other, node));
        }
    }

    /// Restores every link.
    pub fn heal(&self) {
        self.cut.write().expect("fault lock poisoned").clear();
    }

    /// Limits every Raft link to `bytes_per_second` (`None`: unlimited again).
    pub fn limit_rate(&self, bytes_per_second: Option<u64>) {
        *self.rate.write().expect("fault lock poisoned") = bytes_per_second.filter(|r| *r > 0);
    }

    /// How long `bytes` take on a link at the limited rate (zero without a limit).
    pub fn transfer_time(&self, bytes: usize) -> Duration {
        match *self.rate.read().expect("fault lock poisoned") {
            Some(rate) => Duration::from_secs_f64(bytes as f64 / rate as f64),
            None => Duration::ZERO,
        }
    }

    pub fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.cut
            .read()
            .expect("fault lock poisoned")
            .contains(&(from, to))
    }
}
