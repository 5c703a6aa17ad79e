//! `PeerContacts`: when this replica last had an answer from each other replica over the peer
//! listener. Leader-local soft state, never replicated: `remove-node` asks it which voters are
//! live before a change that could leave the cluster without a quorum.
//!
//! Every answered Raft call counts (a leader's heartbeats are appends, so a live follower
//! answers a live leader several times per election timeout); a refused or timed-out call does
//! not. A replica that just became leader knows the voters that granted it their votes.

use sluice_types::NodeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Clone)]
pub struct PeerContacts {
    /// A std mutex: plain map updates, never held across `.await`.
    last: Arc<Mutex<HashMap<NodeId, Instant>>>,
    /// How recent an answer must be for its replica to count as live.
    window: Duration,
}

impl PeerContacts {
    pub fn new(window: Duration) -> Self {
        PeerContacts {
            last: Arc::default(),
            window,
        }
    }

    /// Records an answer from `node` now.
    pub fn answered(&self, node: NodeId) {
        self.answered_at(node, Instant::now());
    }

    fn answered_at(&self, node: NodeId, at: Instant) {
        self.last
            .lock()
            .expect("peer contacts lock poisoned")
            .insert(node, at);
    }

    /// Whether `node` answered within the window.
    pub fn is_live(&self, node: NodeId) -> bool {
        self.last
            .lock()
            .expect("peer contacts lock poisoned")
            .get(&node)
            .is_some_and(|at| at.elapsed() <= self.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_replica_is_live_only_within_the_window_of_its_last_answer() {
        let contacts = PeerContacts::new(Duration::from_secs(2));
        assert!(!contacts.is_live(2), "never answered");
        contacts.answered(2);
        assert!(contacts.is_live(2));
        tokio::time::advance(Duration::from_millis(2001)).await;
        assert!(!contacts.is_live(2), "silent for longer than the window");
        contacts.answered_at(2, Instant::now());
        assert!(contacts.is_live(2));
        assert!(!contacts.is_live(3));
    }
}
