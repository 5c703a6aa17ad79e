//! `Watchers`: the long polls waiting on each worker and iteration, woken only when an applied
//! entry touched what they wait on (see `state::changes`).
//!
//! A long poll registers a [`Watch`] on its key before it first reads the state, so a change
//! applied after that read always wakes it. The replica's notifier (in `state_reader`) takes the
//! state's touched keys after each applied entry and wakes their watchers; a change of
//! leadership wakes everyone. A key's entry lives while a watch of it does.

use crate::state::{Touched, Watched};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

#[derive(Default)]
pub struct Watchers {
    /// A std mutex: map updates only, never held across `.await`.
    waiting: Mutex<HashMap<Watched, watch::Sender<u64>>>,
}

impl Watchers {
    pub fn new() -> Arc<Watchers> {
        Arc::new(Watchers::default())
    }

    /// Starts watching `key`: changes from now on wake [`Watch::changed`].
    pub fn watch(self: &Arc<Self>, key: Watched) -> Watch {
        let mut waiting = self.waiting.lock().expect("watchers lock poisoned");
        let receiver = waiting
            .entry(key.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Watch {
            key,
            receiver,
            watchers: self.clone(),
        }
    }

    /// Wakes the watchers of what `touched` touched (everyone when `all`).
    pub fn wake(&self, touched: &Touched) {
        let waiting = self.waiting.lock().expect("watchers lock poisoned");
        let bump = |sender: &watch::Sender<u64>| sender.send_modify(|n| *n = n.wrapping_add(1));
        if touched.all || touched.keys.len() > waiting.len() {
            waiting
                .iter()
                .filter(|(key, _)| touched.touches(key))
                .for_each(|(_, sender)| bump(sender));
        } else {
            touched
                .keys
                .iter()
                .filter_map(|key| waiting.get(key))
                .for_each(bump);
        }
    }

    /// Keys watched now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.lock().expect("watchers lock poisoned").len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One long poll's registration on a key.
pub struct Watch {
    key: Watched,
    receiver: watch::Receiver<u64>,
    watchers: Arc<Watchers>,
}

impl Watch {
    /// Marks every wake so far as seen (call before reading the state).
    pub fn mark_seen(&mut self) {
        self.receiver.borrow_and_update();
    }

    /// Waits for a wake not yet seen.
    pub async fn changed(&mut self) {
        // The sender lives while this watch does (it is removed only with its last watch).
        let _ = self.receiver.changed().await;
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut waiting = self
            .watchers
            .waiting
            .lock()
            .expect("watchers lock poisoned");
        // This watch's receiver is still alive here: it is the last one when the count is 1.
        if waiting
            .get(&self.key)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            waiting.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_types::IterationId;
    use std::collections::HashSet;
    use std::time::Duration;

    fn touched(keys: &[Watched], all: bool) -> Touched {
        Touched {
            keys: keys.iter().cloned().collect::<HashSet<_>>(),
            all,
        }
    }

    async fn woken(watch: &mut Watch) -> bool {
        tokio::time::timeout(Duration::from_millis(50), watch.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn only_the_watchers_of_a_touched_key_wake() {
        let watchers = Watchers::new();
        let worker = Watched::Worker("w:1".into());
        let iteration = Watched::Iteration(IterationId(3));
        let mut a = watchers.watch(worker.clone());
        let mut b = watchers.watch(worker.clone());
        let mut c = watchers.watch(iteration.clone());

        let cases: Vec<(&str, Touched, [bool; 3])> = vec![
            (
                "the worker",
                touched(std::slice::from_ref(&worker), false),
                [true, true, false],
            ),
            (
                "the iteration",
                touched(std::slice::from_ref(&iteration), false),
                [false, false, true],
            ),
            (
                "another key",
                touched(&[Watched::Iteration(IterationId(4))], false),
                [false, false, false],
            ),
            ("nothing", touched(&[], false), [false, false, false]),
            ("everything", touched(&[], true), [true, true, true]),
        ];
        for (name, touched, expected) in cases {
            for w in [&mut a, &mut b, &mut c] {
                w.mark_seen();
            }
            watchers.wake(&touched);
            let got = [
                woken(&mut a).await,
                woken(&mut b).await,
                woken(&mut c).await,
            ];
            assert_eq!(got, expected, "{name}");
        }
    }

    #[tokio::test]
    async fn a_key_is_forgotten_with_its_last_watch() {
        let watchers = Watchers::new();
        let key = Watched::Worker("w:1".into());
        let first = watchers.watch(key.clone());
        let second = watchers.watch(key.clone());
        assert_eq!(watchers.len(), 1);
        drop(first);
        assert_eq!(watchers.len(), 1);
        drop(second);
        assert!(watchers.is_empty());
    }

    #[tokio::test]
    async fn a_wake_before_the_wait_is_not_lost() {
        let watchers = Watchers::new();
        let key = Watched::Iteration(IterationId(1));
        let mut watch = watchers.watch(key.clone());
        watch.mark_seen();
        watchers.wake(&touched(&[key], false));
        assert!(woken(&mut watch).await);
    }
}
