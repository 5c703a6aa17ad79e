//! `WorkerNet`: the proxies on the links of workers, which the worker nemeses cut.
//!
//! - A front proxy per dispatcher, in front of its client port. Each dispatcher advertises its
//!   front (`--advertise-address`), so leader hints point there too, and workers are given only
//!   the fronts: every connection a worker opens to a dispatcher passes a front. A front names
//!   the caller of each connection (the worker process that owns the other end, see
//!   `socket_owner`; anything else, such as the harness's readers, is `other` and never cut),
//!   so worker I's links to dispatcher D are cut alone.
//! - A reader proxy per worker, in front of its listen port. Each worker advertises its reader
//!   proxy, so every reader's fetch streams to worker I pass it, and cutting it cuts the
//!   readers' links to that worker (all readers at once: they share the harness's process).
//!
//! The worker track of the schedule plays one fault at a time, so a heal sets every link of
//! this net back to pass.

use crate::proxy::{Classifier, Proxy, ANY_CALLER};
use crate::schedule::LinkMode;
use crate::socket_owner;
use crate::worker_pool::WorkerPids;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The caller name of connections no worker process opened.
pub const OTHER_CALLER: &str = "other";

pub struct WorkerNet {
    fronts: BTreeMap<u64, Proxy>,
    readers: BTreeMap<u32, Proxy>,
    cancel: CancellationToken,
}

impl WorkerNet {
    /// Binds a front for each dispatcher (id → client address) and a reader proxy for each
    /// worker (index → listen address).
    pub async fn start(
        dispatchers: &BTreeMap<u64, SocketAddr>,
        workers: &BTreeMap<u32, SocketAddr>,
        pids: WorkerPids,
    ) -> anyhow::Result<WorkerNet> {
        let cancel = CancellationToken::new();
        let classify: Classifier = Arc::new(move |peer, local| {
            socket_owner::owner(peer, local, &pids.pids())
                .and_then(|pid| pids.name_of(pid))
                .unwrap_or_else(|| OTHER_CALLER.to_string())
        });
        let mut fronts = BTreeMap::new();
        for (&id, &addr) in dispatchers {
            let proxy = Proxy::start(addr, Some(classify.clone()), cancel.clone()).await?;
            fronts.insert(id, proxy);
        }
        let mut readers = BTreeMap::new();
        for (&index, &addr) in workers {
            readers.insert(index, Proxy::start(addr, None, cancel.clone()).await?);
        }
        Ok(WorkerNet {
            fronts,
            readers,
            cancel,
        })
    }

    /// Dispatcher `id`'s front.
    pub fn front(&self, id: u64) -> Option<SocketAddr> {
        self.fronts.get(&id).map(Proxy::addr)
    }

    /// Every front, comma-separated (what workers are given).
    pub fn fronts(&self) -> String {
        self.fronts
            .values()
            .map(|p| p.addr().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Worker `index`'s reader proxy (what it advertises).
    pub fn reader_proxy(&self, index: u32) -> Option<SocketAddr> {
        self.readers.get(&index).map(Proxy::addr)
    }

    /// Cuts worker `worker`'s (its name) links to the dispatchers `nodes` with `mode`.
    pub fn cut_worker(&self, worker: &str, nodes: &[u64], mode: LinkMode) {
        for (id, front) in &self.fronts {
            if nodes.contains(id) {
                front.set(worker, mode);
            }
        }
    }

    /// Cuts the readers' links to worker `index` with `mode`.
    pub fn cut_readers(&self, index: u32, mode: LinkMode) {
        if let Some(proxy) = self.readers.get(&index) {
            proxy.set(ANY_CALLER, mode);
        }
    }

    /// Every link back to pass.
    pub fn heal(&self) {
        self.fronts
            .values()
            .chain(self.readers.values())
            .for_each(Proxy::heal);
    }
}

impl Drop for WorkerNet {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
