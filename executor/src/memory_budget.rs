//! `MemoryBudget`: the bytes a process lets its pipelines hold in buffers (batches being built,
//! shuffle buffers, prefetch queues, a worker's cross-trainer caches), shared by all of them;
//! `MemoryShare`: one task's part of it.
//!
//! A worker has one budget, sized by its `--memory-budget`, and gives each task a share of it;
//! every op that holds elements takes a `Reservation` on its task's share and grows it before
//! keeping another element. A growth the budget cannot allow is refused with a
//! `DatasetError`, naming the op, the bytes it asked for and whom to blame: that op's task
//! fails, and the process and its other pipelines keep what they hold and go on. Local
//! execution (a user's own process) has no budget: reservations there only count.
//!
//! Fairness: one task's buffers must not fail another's small ones. The budget therefore keeps
//! a reserve (`--memory-reserve`, an eighth of the budget by default) that only a task within
//! its fair share may take, the fair share being the budget less the reserve, divided by the
//! tasks holding shares. A task alone may hold the budget less the reserve; a task that arrives
//! later takes from the reserve. When the budget is full all the same (the tasks that were
//! within their shares when they grew are over them now that more tasks share it), the task
//! that holds the most beyond its share is marked to give back: its next growth fails, naming
//! it, and the task that found the budget full is told which task held it.
//!
//! The accounting is of element payloads plus a fixed cost per element
//! (`element_bytes`), an estimate: it bounds what a definition can make a worker hold, it is
//! not an allocator. Invariant: `used` is the sum of every share's `used`, and a share's
//! `used` the sum of its live reservations' `held`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use sluice_element::{DatasetError, Element};

/// What holding one element costs besides its payload (the element's own struct, its tensors'
/// shapes, the slot that holds it): so that a buffer of empty tensors is not free.
pub(crate) const ELEMENT_OVERHEAD_BYTES: u64 = 64;

/// The bytes a buffer holding `e` is charged for it.
pub(crate) fn element_bytes(e: &Element) -> u64 {
    (e.byte_size() as u64).saturating_add(ELEMENT_OVERHEAD_BYTES)
}

#[derive(Debug)]
pub struct MemoryBudget {
    limit: u64,
    /// Bytes that only a share within its fair share may take.
    reserve: u64,
    used: AtomicU64,
    /// The live shares, for the fair share's divisor and for finding whom to blame.
    shares: Mutex<Vec<Weak<MemoryShare>>>,
    /// The setting that sizes this budget, for errors (`--memory-budget`).
    setting: String,
}

impl MemoryBudget {
    /// A budget of `limit` bytes without a reserve: shares take from it first come, first
    /// served. `setting` is named in errors (what to raise).
    pub fn new(limit: u64, setting: impl Into<String>) -> Arc<MemoryBudget> {
        MemoryBudget::with_reserve(limit, 0, setting)
    }

    /// A budget of `limit` bytes of which `reserve` (at most `limit`) is kept for shares within
    /// their fair share.
    pub fn with_reserve(limit: u64, reserve: u64, setting: impl Into<String>) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            limit,
            reserve: reserve.min(limit),
            used: AtomicU64::new(0),
            shares: Mutex::new(Vec::new()),
            setting: setting.into(),
        })
    }

    /// A new share of this budget for `holder` (named in errors: "task 7 (iteration 3)").
    pub fn share(self: &Arc<Self>, holder: impl Into<String>) -> Arc<MemoryShare> {
        let share = Arc::new(MemoryShare {
            budget: self.clone(),
            holder: holder.into(),
            used: AtomicU64::new(0),
            give_back: AtomicBool::new(false),
            on_give_back: OnceLock::new(),
        });
        let mut shares = self.lock_shares();
        shares.retain(|s| s.strong_count() > 0);
        shares.push(Arc::downgrade(&share));
        share
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Bytes held by live reservations.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn lock_shares(&self) -> std::sync::MutexGuard<'_, Vec<Weak<MemoryShare>>> {
        // A panic while holding the lock leaves the list as it was: still usable.
        self.shares.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The holders the budget is divided among: the live shares that hold memory, and
    /// `asking` (a task whose pipeline ended but that is not yet deleted divides nothing).
    fn holders_with(&self, asking: &MemoryShare) -> Vec<Arc<MemoryShare>> {
        self.lock_shares()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| s.used() > 0 || std::ptr::eq(s.as_ref(), asking))
            .collect()
    }

    /// What each share may hold when the budget is divided fairly among `holders` shares.
    fn fair_share(&self, holders: u64) -> u64 {
        (self.limit - self.reserve) / holders.max(1)
    }

    /// Takes `bytes` for `op` of `share`, which already holds `held`; refused with nothing
    /// taken if the budget would be exceeded, or if the share would pass its fair share and
    /// leave less than the reserve free.
    fn take(
        &self,
        share: &MemoryShare,
        op: &str,
        held: u64,
        bytes: u64,
    ) -> Result<(), DatasetError> {
        if share.give_back.load(Ordering::Relaxed) {
            return Err(self.over_share(share, op, held, bytes, true));
        }
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let share_next = share.used().saturating_add(bytes);
            let next = used.checked_add(bytes).filter(|n| *n <= self.limit);
            let leaves_reserve = next.is_some_and(|n| self.limit - n >= self.reserve);
            let Some(next) =
                next.filter(|_| leaves_reserve || self.within_fair_share(share, share_next))
            else {
                return Err(self.refuse(share, op, held, bytes, used));
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    share.used.fetch_add(bytes, Ordering::Relaxed);
                    return Ok(());
                }
                Err(now) => used = now,
            }
        }
    }

    fn within_fair_share(&self, share: &MemoryShare, share_bytes: u64) -> bool {
        share_bytes <= self.fair_share(self.holders(share))
    }

    fn holders(&self, asking: &MemoryShare) -> u64 {
        self.holders_with(asking).len() as u64
    }

    /// The error for a refused growth: the share's own when it is past its fair share (or
    /// there is only one); otherwise the budget is full with other shares past theirs, and the
    /// one past it by most is told to give back.
    fn refuse(
        &self,
        share: &MemoryShare,
        op: &str,
        held: u64,
        bytes: u64,
        in_use: u64,
    ) -> DatasetError {
        let live = self.holders_with(share);
        let fair = self.fair_share(live.len() as u64);
        let share_next = share.used().saturating_add(bytes);
        if live.len() <= 1 && self.reserve == 0 {
            return DatasetError::ResourceExhausted {
                op: op.to_string(),
                held,
                needed: bytes,
                limit: self.limit,
                in_use,
                setting: self.setting.clone(),
            };
        }
        if share_next > fair {
            return self.over_share(share, op, held, bytes, false);
        }
        let culprit = live
            .iter()
            .filter(|s| !std::ptr::eq(s.as_ref(), share) && s.used() > fair)
            .max_by_key(|s| s.used() - fair);
        match culprit {
            Some(culprit) => {
                let holders = live.len();
                culprit.ask_back(format!(
                    "{} held {} bytes, more than its fair share of the memory budget ({fair} of \
                     {} bytes, shared by {holders} holders), when {} found the budget full; it \
                     is failed to give them back; raise {} or run fewer jobs on a worker at once",
                    culprit.holder,
                    culprit.used(),
                    self.limit,
                    share.holder,
                    self.setting,
                ));
                DatasetError::MemoryShareExceeded {
                    op: op.to_string(),
                    holder: share.holder.clone(),
                    held,
                    needed: bytes,
                    reason: format!(
                        "the memory budget of {} bytes is full, and {} holds {} bytes of it, more \
                         than its fair share of {fair} ({holders} holders); that one is failed to \
                         give them back, so trying this one again may succeed",
                        self.limit,
                        culprit.holder,
                        culprit.used(),
                    ),
                }
            }
            // Every holder within its share and still no room: only the reserve's rounding.
            None => self.over_share(share, op, held, bytes, false),
        }
    }

    fn over_share(
        &self,
        share: &MemoryShare,
        op: &str,
        held: u64,
        bytes: u64,
        asked_back: bool,
    ) -> DatasetError {
        let holders = self.holders(share);
        let fair = self.fair_share(holders);
        if holders == 1 && !asked_back {
            return DatasetError::MemoryShareExceeded {
                op: op.to_string(),
                holder: share.holder.clone(),
                held,
                needed: bytes,
                reason: format!(
                    "it would hold {} bytes, more than one holder may take of the memory budget \
                     of {} bytes ({fair}: the budget less {} kept in reserve for others); raise \
                     {} or make the {op} smaller",
                    share.used().saturating_add(bytes),
                    self.limit,
                    self.reserve,
                    self.setting,
                ),
            };
        }
        let why = if asked_back {
            " and another holder found the budget full"
        } else {
            ""
        };
        let holds = if asked_back {
            format!("it holds {} bytes", share.used())
        } else {
            format!("it would hold {} bytes", share.used().saturating_add(bytes))
        };
        DatasetError::MemoryShareExceeded {
            op: op.to_string(),
            holder: share.holder.clone(),
            held,
            needed: bytes,
            reason: format!(
                "{holds}, more than its fair share of the memory budget{why}: {fair} of {} bytes, \
                 shared by {holders} holder{}, with {} kept in reserve; raise {} or make the {op} \
                 smaller",
                self.limit,
                if holders == 1 { "" } else { "s" },
                self.reserve,
                self.setting,
            ),
        }
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Told why a holder must give back what it holds (see `MemoryShare::on_give_back`).
type GiveBack = Box<dyn Fn(String) + Send + Sync>;

/// One holder's part of a `MemoryBudget` (a worker's task): its reservations take from the
/// budget through it, and its use decides its fair share. Leaves the budget's holders when the
/// last reference to it (its pipeline's reservations, its task) is dropped.
pub struct MemoryShare {
    budget: Arc<MemoryBudget>,
    holder: String,
    used: AtomicU64,
    /// Set when another holder found the budget full while this one held more than its fair
    /// share: its next growth fails.
    give_back: AtomicBool,
    /// Called once when `give_back` is set, so that a holder that is not growing (a pipeline
    /// waiting for its reader) can be failed at once.
    on_give_back: OnceLock<GiveBack>,
}

impl std::fmt::Debug for MemoryShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryShare")
            .field("holder", &self.holder)
            .field("used", &self.used)
            .field("give_back", &self.give_back)
            .finish()
    }
}

impl MemoryShare {
    /// What to do when another holder finds the budget full while this one holds more than
    /// its fair share (a worker fails the task, so its buffers are dropped): called at most
    /// once, with the reason, on the other holder's thread. Only the first call sets it.
    pub fn on_give_back(&self, give_back: impl Fn(String) + Send + Sync + 'static) {
        let _ = self.on_give_back.set(Box::new(give_back));
    }

    /// Marks this share to give back, telling its owner once.
    fn ask_back(&self, reason: String) {
        if !self.give_back.swap(true, Ordering::Relaxed) {
            if let Some(give_back) = self.on_give_back.get() {
                give_back(reason);
            }
        }
    }

    /// Bytes held by this share's live reservations.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
        self.budget.give_back(bytes);
    }
}

/// The bytes one op holds, taken from a share of a budget (or only counted, without one).
/// Given back when dropped, so an op that fails or is dropped mid-pipeline frees its part.
#[derive(Debug)]
pub struct Reservation {
    share: Option<Arc<MemoryShare>>,
    op: &'static str,
    /// Atomic: a prefetch queue grows on its producer thread and shrinks on its consumer's.
    held: AtomicU64,
}

impl Reservation {
    pub fn new(share: Option<Arc<MemoryShare>>, op: &'static str) -> Reservation {
        Reservation {
            share,
            op,
            held: AtomicU64::new(0),
        }
    }

    /// Holds `bytes` more, if the budget allows.
    pub fn grow(&self, bytes: u64) -> Result<(), DatasetError> {
        if let Some(share) = &self.share {
            share.budget.take(share, self.op, self.held(), bytes)?;
        }
        self.held.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Holds `bytes` fewer (at most what is held).
    pub fn shrink(&self, bytes: u64) {
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            let give = bytes.min(held);
            match self.held.compare_exchange_weak(
                held,
                held - give,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if let Some(share) = &self.share {
                        share.give_back(give);
                    }
                    return;
                }
                Err(now) => held = now,
            }
        }
    }

    /// Gives back everything held (the buffer was handed on or emptied).
    pub fn clear(&self) {
        self.shrink(u64::MAX);
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_growth_past_the_budget_is_refused_and_takes_nothing() {
        let budget = MemoryBudget::new(100, "--memory-budget");
        let share = budget.share("task 1");
        let a = Reservation::new(Some(share.clone()), "batch");
        let b = Reservation::new(Some(share.clone()), "shuffle");
        a.grow(60).unwrap();
        let err = b.grow(50).unwrap_err();
        assert_eq!(
            err,
            DatasetError::ResourceExhausted {
                op: "shuffle".into(),
                held: 0,
                needed: 50,
                limit: 100,
                in_use: 60,
                setting: "--memory-budget".into(),
            }
        );
        assert_eq!(budget.used(), 60);
        b.grow(40).unwrap();
        assert_eq!(budget.used(), 100);
        a.shrink(10);
        assert_eq!((a.held(), budget.used()), (50, 90));
        drop(a);
        assert_eq!((budget.used(), share.used()), (40, 40));
        b.clear();
        assert_eq!((budget.used(), share.used()), (0, 0));
    }

    #[test]
    fn without_a_budget_a_reservation_only_counts() {
        let r = Reservation::new(None, "prefetch");
        r.grow(u64::MAX).unwrap();
        r.shrink(1);
        assert_eq!(r.held(), u64::MAX - 1);
    }

    #[test]
    fn the_error_names_the_op_the_bytes_the_budget_and_the_setting() {
        let budget = MemoryBudget::new(1000, "--memory-budget");
        let r = Reservation::new(Some(budget.share("task 1")), "batch");
        r.grow(900).unwrap();
        assert_eq!(
            r.grow(200).unwrap_err().to_string(),
            "batch needs 200 more bytes (it holds 900), more than the memory budget of 1000 \
             bytes has left (900 in use); raise --memory-budget or make the batch smaller"
        );
    }

    /// A step of the fairness table: `holder` grows `op` by `bytes`; the result is Ok or the
    /// error's text contains `want`.
    struct Step {
        holder: usize,
        bytes: u64,
        want: Result<(), &'static str>,
    }

    fn ok(holder: usize, bytes: u64) -> Step {
        Step {
            holder,
            bytes,
            want: Ok(()),
        }
    }

    fn refused(holder: usize, bytes: u64, text: &'static str) -> Step {
        Step {
            holder,
            bytes,
            want: Err(text),
        }
    }

    /// Budgets of 800 bytes with 100 in reserve shared by tasks 0, 1 and 2 (shares created in
    /// that order before the steps; `holders` of them): each row is a sequence of growths and
    /// what each gives.
    #[test]
    fn a_holder_cannot_take_the_reserve_past_its_fair_share() {
        let rows: Vec<(&str, usize, Vec<Step>)> = vec![
            (
                "alone, a task holds the budget less the reserve",
                1,
                vec![
                    ok(0, 700),
                    refused(
                        0,
                        1,
                        "batch of task 0 needs 1 more bytes (it holds 700): it would \
                                   hold 701 bytes, more than one holder may take of the memory \
                                   budget of 800 bytes (700: the budget less 100 kept in reserve \
                                   for others); raise --memory-budget or make the batch smaller",
                    ),
                ],
            ),
            (
                "a small task's batch succeeds while a big one holds all it may",
                2,
                vec![
                    ok(0, 700),
                    ok(1, 72),
                    ok(1, 28),
                    // Past the budget.
                    refused(
                        1,
                        1,
                        "task 0 holds 700 bytes of it, more than its fair share of 350",
                    ),
                    // Task 0 was told to give back.
                    refused(
                        0,
                        1,
                        "more than its fair share of the memory budget and another \
                                   holder found the budget full: 350 of 800 bytes, shared by 2 \
                                   holders",
                    ),
                ],
            ),
            (
                "past its fair share, a task may still grow while the reserve stays free",
                2,
                vec![
                    ok(1, 50),
                    ok(0, 600),
                    ok(0, 50),
                    refused(0, 1, "more than its fair share"),
                ],
            ),
            (
                "within its fair share, a task may take the reserve",
                3,
                vec![
                    ok(0, 400),
                    ok(1, 200),
                    ok(2, 100),
                    ok(2, 100),
                    refused(2, 1, "task 0 holds 400"),
                ],
            ),
        ];
        for (name, holders, steps) in rows {
            let budget = MemoryBudget::with_reserve(800, 100, "--memory-budget");
            let shares: Vec<_> = (0..holders)
                .map(|i| budget.share(format!("task {i}")))
                .collect();
            let ops: Vec<_> = shares
                .iter()
                .map(|s| Reservation::new(Some(s.clone()), "batch"))
                .collect();
            for (i, step) in steps.iter().enumerate() {
                let before = budget.used();
                let got = ops[step.holder].grow(step.bytes);
                match (step.want, got) {
                    (Ok(()), Ok(())) => {}
                    (Err(text), Err(e)) => {
                        assert!(e.to_string().contains(text), "{name}, step {i}: {e}");
                        assert_eq!(budget.used(), before, "{name}, step {i}: nothing taken");
                    }
                    (want, got) => panic!("{name}, step {i}: want {want:?}, got {got:?}"),
                }
                assert!(budget.used() <= budget.limit(), "{name}, step {i}");
            }
            drop(ops);
            assert_eq!(budget.used(), 0, "{name}: every byte given back");
        }
    }

    #[test]
    fn only_holders_that_hold_memory_divide_the_budget() {
        let budget = MemoryBudget::with_reserve(800, 100, "--memory-budget");
        let a = Reservation::new(Some(budget.share("task 0")), "batch");
        let c = Reservation::new(Some(budget.share("task 1")), "batch");
        let gone = Reservation::new(Some(budget.share("task 2")), "batch");
        let _idle = budget.share("task 3");
        a.grow(300).unwrap();
        c.grow(400).unwrap();
        gone.grow(50).unwrap();
        // Into the reserve: 340 is past a third of 700 (three hold memory), within a half.
        assert!(a.grow(40).is_err());
        drop(gone);
        a.grow(40).unwrap();
        assert_eq!(budget.used(), 740);
    }

    #[test]
    fn a_holder_past_its_share_is_told_once_when_another_finds_the_budget_full() {
        let budget = MemoryBudget::with_reserve(800, 100, "--memory-budget");
        let big = budget.share("task 0");
        let told = Arc::new(Mutex::new(Vec::new()));
        let sink = told.clone();
        big.on_give_back(move |reason| sink.lock().unwrap().push(reason));
        let a = Reservation::new(Some(big.clone()), "shuffle");
        let b = Reservation::new(Some(budget.share("task 1")), "batch");
        a.grow(700).unwrap();
        b.grow(100).unwrap();
        assert!(b.grow(1).is_err());
        assert!(b.grow(1).is_err());
        assert_eq!(
            *told.lock().unwrap(),
            [
                "task 0 held 700 bytes, more than its fair share of the memory budget (350 of 800 \
              bytes, shared by 2 holders), when task 1 found the budget full; it is failed to \
              give them back; raise --memory-budget or run fewer jobs on a worker at once"
            ]
        );
        drop(a);
        b.grow(1).unwrap();
    }
}
