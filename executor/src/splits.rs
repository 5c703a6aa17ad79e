//! `SplitSupplier`: where a source in distributed_epoch mode gets its split indices (the worker
//! implements it with calls to the dispatcher). Counting splits is `sluice-pipeline`'s
//! (`num_splits`).

use sluice_element::DatasetError;

/// Supplies split indices to the source in distributed_epoch mode. May block (it does network
/// calls in the worker). Returns `Ok(None)` at the end of splits for that repetition.
pub trait SplitSupplier: Send + Sync {
    fn next_split(&self, provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError>;
}
