//! `LeaderView`: what the callers sharing one set of connections know of the quorum's leader
//! beyond the hints they follow: the newest leader a replica named, with its term.
//!
//! A silent leader (frozen, or cut off by the network) answers nothing, not even `Unavailable`
//! with a hint: a caller waiting on it can only learn of its successor from the other replicas.
//! So the view keeps a `WatchLeader` stream open to every replica (`leader_watcher.rs`), each
//! telling its own belief at once and again at every change of leader or term. The answer with
//! the highest term wins, and the view never goes back to a lower term, so a replica that still
//! names the old leader cannot move callers back to it. Every call in flight watches the view:
//! one waiting on a replica other than the newest leader ends its attempt and sends again there,
//! with the same request id. So a long poll ends as soon as a replica reports a newer term.
//!
//! On a healthy quorum the streams are silent: knowing costs nothing per call, and a process
//! holds one stream per replica however many callers share the view.

use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A leader a replica named, and the term it leads in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Leader {
    pub addr: String,
    pub term: u64,
}

pub(crate) struct LeaderView {
    newest: watch::Sender<Option<Leader>>,
    /// Whether the streams have been started (on the first call, which runs in a runtime).
    watching: AtomicBool,
    /// Ends the streams when the last caller sharing the view has gone.
    stop: CancellationToken,
}

impl Drop for LeaderView {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl LeaderView {
    pub fn new() -> LeaderView {
        LeaderView {
            newest: watch::channel(None).0,
            watching: AtomicBool::new(false),
            stop: CancellationToken::new(),
        }
    }

    /// The view's changes, from now on.
    pub fn subscribe(&self) -> watch::Receiver<Option<Leader>> {
        self.newest.subscribe()
    }

    /// The newest leader known.
    pub fn newest(&self) -> Option<Leader> {
        self.newest.borrow().clone()
    }

    /// Records that a replica names `addr` the leader in `term`; true when that is newer than
    /// anything known (Raft has at most one leader per term, so equal terms name the same one).
    pub fn learn(&self, addr: String, term: u64) -> bool {
        self.newest.send_if_modified(|newest| match newest {
            Some(known) if known.term >= term => false,
            _ => {
                *newest = Some(Leader { addr, term });
                true
            }
        })
    }

    /// True exactly once: the caller starts the streams.
    pub fn claim_watching(&self) -> bool {
        !self.watching.load(Ordering::Relaxed) && !self.watching.swap(true, Ordering::AcqRel)
    }

    /// Cancelled when the view is dropped.
    pub fn stopped(&self) -> CancellationToken {
        self.stop.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_newer_term_changes_the_view() {
        let view = LeaderView::new();
        // (replica's answer, whether the view changes, the newest leader after it)
        let table = [
            (("a", 3), true, ("a", 3)),
            (("a", 3), false, ("a", 3)),
            // A stale replica naming an older leader moves nobody back.
            (("b", 2), false, ("a", 3)),
            (("c", 4), true, ("c", 4)),
            (("a", 3), false, ("c", 4)),
        ];
        for (step, ((addr, term), changes, (newest, newest_term))) in table.into_iter().enumerate()
        {
            assert_eq!(view.learn(addr.into(), term), changes, "step {step}");
            assert_eq!(
                view.newest(),
                Some(Leader {
                    addr: newest.into(),
                    term: newest_term
                }),
                "step {step}"
            );
        }
    }

    #[test]
    fn the_streams_are_started_once_and_stopped_with_the_view() {
        let view = LeaderView::new();
        assert!(view.claim_watching());
        assert!(!view.claim_watching());
        let stopped = view.stopped();
        assert!(!stopped.is_cancelled());
        drop(view);
        assert!(stopped.is_cancelled());
    }
}
