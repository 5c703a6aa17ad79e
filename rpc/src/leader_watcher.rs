//! The `WatchLeader` streams behind a [`LeaderView`]: one per replica, each feeding what its
//! replica believes (the leader and the term) into the view, reopened after a backoff when it
//! fails or ends.
//!
//! Every replica is watched, the leader too: which one is silent cannot be known in advance (a
//! new process may be told the frozen leader's address first), and with one replica frozen the
//! others still report. The streams hold the view weakly and stop with it.

use crate::leader_view::LeaderView;
use crate::quorum::replica_endpoint;
use sluice_proto::dispatcher as pb;
use sluice_proto::dispatcher::dispatcher_client::DispatcherClient as RpcClient;
use sluice_security::ClientSecurity;
use std::sync::Weak;
use std::time::Duration;
use tracing::debug;

/// First pause before reopening a failed stream; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// HTTP/2 keepalive of a stream's connection: a replica that vanished without closing it (a
/// crashed host, a dropped route) is noticed, and its stream reopened, within a minute. Slow on
/// purpose: the other replicas' streams report in the meantime, and thousands of processes
/// each hold one stream per replica.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// Starts one stream per address in `addrs`, until `view` is dropped.
pub(crate) fn watch_every_replica(
    view: &std::sync::Arc<LeaderView>,
    addrs: &[String],
    security: &ClientSecurity,
) {
    for addr in addrs {
        let follower = Follower {
            view: std::sync::Arc::downgrade(view),
            addr: addr.clone(),
            security: security.clone(),
        };
        let stop = view.stopped();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = follower.run() => {}
            }
        });
    }
}

struct Follower {
    view: Weak<LeaderView>,
    addr: String,
    security: ClientSecurity,
}

/// How one stream ended.
enum Ended {
    /// The view is gone: stop.
    ViewDropped,
    /// Reopen after a backoff.
    Failed,
}

impl Follower {
    async fn run(self) {
        let mut backoff = MIN_BACKOFF;
        loop {
            let opened = std::time::Instant::now();
            match self.follow().await {
                Ended::ViewDropped => return,
                Ended::Failed => {}
            }
            // A stream that lived a while was fine: start the backoff over.
            if opened.elapsed() > MAX_BACKOFF {
                backoff = MIN_BACKOFF;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn follow(&self) -> Ended {
        let endpoint = match replica_endpoint(&self.security, &self.addr) {
            Ok(endpoint) => endpoint,
            Err(e) => {
                debug!(replica = %self.addr, error = %e, "cannot watch the leader there");
                return Ended::Failed;
            }
        };
        let channel = endpoint
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE)
            .keep_alive_while_idle(true)
            .connect_lazy();
        let mut stub = RpcClient::new(self.security.authed(channel));
        let mut updates = match stub.watch_leader(pb::WatchLeaderRequest {}).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                debug!(replica = %self.addr, %status, "watching the leader failed");
                return Ended::Failed;
            }
        };
        loop {
            let update = match updates.message().await {
                Ok(Some(update)) => update,
                Ok(None) => return Ended::Failed,
                Err(status) => {
                    debug!(replica = %self.addr, %status, "the leader stream ended");
                    return Ended::Failed;
                }
            };
            let Some(view) = self.view.upgrade() else {
                return Ended::ViewDropped;
            };
            if let Some(leader) = update.leader {
                if view.learn(leader.clone(), update.term) {
                    debug!(replica = %self.addr, %leader, term = update.term, "a replica named a leader of a newer term");
                }
            }
        }
    }
}
