//! `MemoryBudget`: the bytes a process lets its pipelines hold in buffers (batches being built,
//! shuffle buffers, prefetch queues, a worker's cross-trainer caches), shared by all of them.
//!
//! A worker has one, sized by its `--memory-budget`; every op that holds elements takes a
//! `Reservation` on it and grows it before keeping another element. A growth past the budget is
//! refused with `DatasetError::ResourceExhausted`, naming the op, the bytes it asked for, the
//! budget and the setting that sizes it: that op's task fails, and the process and its other
//! pipelines keep what they hold and go on. Local execution (a user's own process) has no
//! budget: reservations there only count.
//!
//! The accounting is of element payloads plus a fixed cost per element
//! (`element_bytes`), an estimate: it bounds what a definition can make a worker hold, it is
//! not an allocator. Invariant: `used` is the sum of every live reservation's `held`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
    used: AtomicU64,
    /// The setting that sizes this budget, for errors (`--memory-budget`).
    setting: String,
}

impl MemoryBudget {
    /// A budget of `limit` bytes, sized by `setting` (named in errors: what to raise).
    pub fn new(limit: u64, setting: impl Into<String>) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            limit,
            used: AtomicU64::new(0),
            setting: setting.into(),
        })
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held by live reservations.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` for `op`, which already holds `held`; refused if the budget would be
    /// exceeded, with nothing taken.
    fn take(&self, op: &str, held: u64, bytes: u64) -> Result<(), DatasetError> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let next = used.checked_add(bytes).filter(|n| *n <= self.limit);
            let Some(next) = next else {
                return Err(DatasetError::ResourceExhausted {
                    op: op.to_string(),
                    held,
                    needed: bytes,
                    limit: self.limit,
                    in_use: used,
                    setting: self.setting.clone(),
                });
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The bytes one op holds, taken from a budget (or only counted, without one). Given back when
/// dropped, so an op that fails or is dropped mid-pipeline frees its share.
#[derive(Debug)]
pub struct Reservation {
    budget: Option<Arc<MemoryBudget>>,
    op: &'static str,
    /// Atomic: a prefetch queue grows on its producer thread and shrinks on its consumer's.
    held: AtomicU64,
}

impl Reservation {
    pub fn new(budget: Option<Arc<MemoryBudget>>, op: &'static str) -> Reservation {
        Reservation {
            budget,
            op,
            held: AtomicU64::new(0),
        }
    }

    /// Holds `bytes` more, if the budget allows.
    pub fn grow(&self, bytes: u64) -> Result<(), DatasetError> {
        if let Some(budget) = &self.budget {
            budget.take(self.op, self.held(), bytes)?;
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
                    if let Some(budget) = &self.budget {
                        budget.give_back(give);
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
        let a = Reservation::new(Some(budget.clone()), "batch");
        let b = Reservation::new(Some(budget.clone()), "shuffle");
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
        assert_eq!(budget.used(), 40);
        b.clear();
        assert_eq!(budget.used(), 0);
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
        let r = Reservation::new(Some(budget), "batch");
        r.grow(900).unwrap();
        assert_eq!(
            r.grow(200).unwrap_err().to_string(),
            "batch needs 200 more bytes (it holds 900), more than the memory budget of 1000 \
             bytes has left (900 in use); raise --memory-budget or make the batch smaller"
        );
    }
}
