//! `LeaderView`: what the callers sharing one set of connections know of the quorum's leader
//! beyond the hints they follow: the newest leader a replica named, with its term.
//!
//! A silent leader (frozen, or cut off by the network) answers nothing, not even `Unavailable`
//! with a hint: a caller waiting on it learns of its successor only by asking the other
//! replicas (`GetLeader`, answered from each replica's own Raft state). The answer with the
//! highest term wins, and the view never goes back to a lower term, so a replica that still
//! names the old leader cannot move callers back to it. Every call in flight watches the view:
//! one waiting on a replica other than the newest leader ends its attempt and sends again there,
//! with the same request id. So a long poll ends as soon as any caller of the view learns of a
//! newer term.
//!
//! Asking is rate limited per view (one round per interval): thousands of callers sharing
//! connections (a harness, one process's readers) cost one round, not thousands.

use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A leader a replica named, and the term it leads in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Leader {
    pub addr: String,
    pub term: u64,
}

pub(crate) struct LeaderView {
    newest: watch::Sender<Option<Leader>>,
    /// When the last round of asking started. A std mutex: held only to read or update.
    last_round: Mutex<Option<Instant>>,
}

impl LeaderView {
    pub fn new() -> LeaderView {
        LeaderView {
            newest: watch::channel(None).0,
            last_round: Mutex::new(None),
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

    /// Claims the next round of asking: true when no round started within `interval`.
    pub fn claim_round(&self, interval: Duration) -> bool {
        let mut last = self.last_round.lock().expect("leader view lock poisoned");
        let now = Instant::now();
        match *last {
            Some(at) if now < at + interval => false,
            _ => {
                *last = Some(now);
                true
            }
        }
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

    #[tokio::test(start_paused = true)]
    async fn one_round_of_asking_per_interval() {
        let view = LeaderView::new();
        let interval = Duration::from_millis(100);
        assert!(view.claim_round(interval));
        assert!(!view.claim_round(interval), "a round just started");
        tokio::time::advance(interval).await;
        assert!(view.claim_round(interval));
    }
}
