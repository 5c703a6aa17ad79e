//! `Changes`: the workers and iterations that entries applied since the last `take` touched.
//!
//! Long polls wait on one worker (its tasks to start or stop) or one iteration (its tasks,
//! pending tasks and end). Waking every one of thousands of waiting heartbeats after every
//! applied entry, to re-check a state that mostly did not change for them, made the wake-ups
//! the leader's main work at scale; with `Changes`, only the waiters of what an entry touched
//! wake (`crate::watchers`).
//!
//! Not part of the replicated state: it is never encoded, and a new, cloned or decoded state
//! starts with `all` (every waiter re-checks once). Touching is conservative: every mutable
//! access to an iteration and every change of a worker's registration or task index touches
//! it, whether or not what a waiter reads changed. Past `MAX_TOUCHED` keys between two takes
//! the sets collapse to `all`, so nobody taking them costs no memory.

use sluice_types::IterationId;
use std::collections::HashSet;
use std::sync::Mutex;

/// Touched keys kept before they collapse to `all`.
const MAX_TOUCHED: usize = 10_000;

/// What a long poll waits on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Watched {
    /// A worker's tasks (its registration and its index of unfinished tasks).
    Worker(String),
    /// An iteration's tasks, pending tasks, clients and end.
    Iteration(IterationId),
}

/// What changed since the last [`Changes::take`].
#[derive(Debug, PartialEq, Eq)]
pub struct Touched {
    pub keys: HashSet<Watched>,
    /// Everything may have changed.
    pub all: bool,
}

impl Default for Touched {
    fn default() -> Self {
        Touched {
            keys: HashSet::new(),
            all: true,
        }
    }
}

impl Touched {
    pub fn touches(&self, key: &Watched) -> bool {
        self.all || self.keys.contains(key)
    }
}

/// Interior mutability: `apply` touches through `&mut self`, the notifier takes through the
/// shared read lock of the applied state.
#[derive(Debug, Default)]
pub struct Changes(Mutex<Touched>);

impl Clone for Changes {
    /// A clone is another state: it starts with everything changed.
    fn clone(&self) -> Self {
        Changes::default()
    }
}

impl Changes {
    pub fn touch(&self, key: Watched) {
        let mut touched = self.0.lock().expect("changes lock poisoned");
        if touched.all {
            return;
        }
        touched.keys.insert(key);
        if touched.keys.len() > MAX_TOUCHED {
            touched.keys = HashSet::new();
            touched.all = true;
        }
    }

    /// What changed since the last take; starts over with nothing.
    pub fn take(&self) -> Touched {
        let mut touched = self.0.lock().expect("changes lock poisoned");
        std::mem::replace(
            &mut *touched,
            Touched {
                keys: HashSet::new(),
                all: false,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touched_keys_are_taken_once_and_collapse_to_all_past_the_bound() {
        let changes = Changes::default();
        assert!(
            changes.take().all,
            "a new state starts with everything changed"
        );
        assert_eq!(
            changes.take(),
            Touched {
                keys: HashSet::new(),
                all: false
            }
        );
        changes.touch(Watched::Worker("w:1".into()));
        changes.touch(Watched::Iteration(IterationId(7)));
        let touched = changes.take();
        assert!(!touched.all);
        assert!(touched.touches(&Watched::Worker("w:1".into())));
        assert!(touched.touches(&Watched::Iteration(IterationId(7))));
        assert!(!touched.touches(&Watched::Iteration(IterationId(8))));
        assert!(changes.take().keys.is_empty());

        for i in 0..=MAX_TOUCHED as u64 {
            changes.touch(Watched::Iteration(IterationId(i)));
        }
        let touched = changes.take();
        assert!(touched.all && touched.keys.is_empty());
        assert!(changes.clone().take().all, "a clone starts over");
    }
}
