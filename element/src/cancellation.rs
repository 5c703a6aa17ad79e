//! `Cancellation`: a flag the owner of a pipeline sets to stop it, checked by every op that may
//! loop without yielding (filter, skip, shard, batch, shuffle, repeat, Python ops, split
//! sources), so a stopped pipeline ends within one upstream element of the flag being set,
//! whatever it does: a filter that drops everything does not pin its thread.
//!
//! A cancelled pipeline yields `DatasetError::Cancelled` (the owner knows it asked for that).
//! The default is a flag nobody can set: local iteration stops by dropping the iterator.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::DatasetError;

#[derive(Clone, Debug, Default)]
pub struct Cancellation(Option<Arc<AtomicBool>>);

impl Cancellation {
    /// A flag not set yet.
    pub fn new() -> Cancellation {
        Cancellation(Some(Arc::new(AtomicBool::new(false))))
    }

    /// A cancellation observing `flag` (set by its owner).
    pub fn from_flag(flag: Arc<AtomicBool>) -> Cancellation {
        Cancellation(Some(flag))
    }

    pub fn cancel(&self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::Relaxed);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// `Err(Cancelled)` once the flag is set.
    pub fn check(&self) -> Result<(), DatasetError> {
        if self.is_cancelled() {
            Err(DatasetError::Cancelled)
        } else {
            Ok(())
        }
    }
}
