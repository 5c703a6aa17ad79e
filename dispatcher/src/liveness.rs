//! `Liveness`: when this replica last heard from each worker and client. Leader-local soft
//! state, never replicated: it only feeds the leader's timers, which propose updates.
//!
//! A replica that becomes leader has heard from nobody yet. Rather than expiring everyone, the
//! timers treat the moment of election as everyone's last contact (the grace period): a worker
//! or client is only expired after a full timeout of silence towards this leader.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio::time::Instant;

#[derive(Default)]
pub struct Liveness {
    /// A std mutex: plain map updates, never held across `.await`.
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    workers: HashMap<String, Instant>,
    clients: HashMap<u64, Instant>,
}

impl Liveness {
    pub fn worker_seen(&self, address: &str) {
        self.worker_seen_at(address, Instant::now());
    }

    pub fn client_seen(&self, client_id: u64) {
        self.client_seen_at(client_id, Instant::now());
    }

    /// Records a worker's contact at `at` (the timers' tests pass their own times).
    pub fn worker_seen_at(&self, address: &str, at: Instant) {
        self.seen
            .lock()
            .expect("liveness lock poisoned")
            .workers
            .insert(address.to_string(), at);
    }

    pub fn client_seen_at(&self, client_id: u64, at: Instant) {
        self.seen
            .lock()
            .expect("liveness lock poisoned")
            .clients
            .insert(client_id, at);
    }

    /// Last contact with a worker, or `grace_start` if later or never heard from.
    pub fn worker_last_seen(&self, address: &str, grace_start: Instant) -> Instant {
        let seen = self.seen.lock().expect("liveness lock poisoned");
        seen.workers
            .get(address)
            .map_or(grace_start, |t| (*t).max(grace_start))
    }

    pub fn client_last_seen(&self, client_id: u64, grace_start: Instant) -> Instant {
        let seen = self.seen.lock().expect("liveness lock poisoned");
        seen.clients
            .get(&client_id)
            .map_or(grace_start, |t| (*t).max(grace_start))
    }

    /// Forgets entities the state no longer has.
    pub fn retain(&self, workers: impl Fn(&str) -> bool, clients: impl Fn(u64) -> bool) {
        let mut seen = self.seen.lock().expect("liveness lock poisoned");
        seen.workers.retain(|w, _| workers(w));
        seen.clients.retain(|c, _| clients(*c));
    }
}
