//! `NetworkFaults`: cut Raft links between replicas of one process, for tests of partitions.
//!
//! A cut link `(from, to)` makes every Raft RPC `from` sends to `to` fail as unreachable, like a
//! silent network partition. Only test harnesses install it; production replicas have none.

use crate::ids::NodeId;
use std::collections::HashSet;
use std::sync::RwLock;

#[derive(Debug, Default)]
pub struct NetworkFaults {
    /// A std lock: read on every RPC, written by the test between phases.
    cut: RwLock<HashSet<(NodeId, NodeId)>>,
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

    pub fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.cut
            .read()
            .expect("fault lock poisoned")
            .contains(&(from, to))
    }
}
