//! Sluice's local, synchronous executor: definitions (`sluice-pipeline`) to iterators of
//! elements, with the stateful ops, the sources (whole or split by split for distributed_epoch),
//! the memory budget of the ops that hold elements, and the runtime of users' Python ops. No
//! networking and no async: workers and clients drive these iterators from their own threads.
//!
//! Layout:
//! - `executor`: `iterate` and `apply_ops`, definitions to element iterators, and `ExecOptions`.
//! - `ops`: the stateful op iterators (batch, shuffle, repeat, prefetch).
//! - `sources`: range, slices and files sources, whole or split by split.
//! - `splits`: `SplitSupplier`, where split indices come from (the worker implements it).
//! - `stack_guard`: guards in long op chains, so building, running and dropping them fits any
//!   thread's stack.
//! - `memory_budget`: `MemoryBudget`, the bytes pipelines may hold in buffers, and the
//!   `Reservation` each buffering op takes on it.
//! - `python_fn`: the stage that runs users' Python ops with a `PythonRunner` (the traits are
//!   `sluice-element`'s), calls in flight in order.

mod executor;
mod memory_budget;
mod ops;
mod python_fn;
mod sources;
mod splits;
mod stack_guard;

pub use executor::{apply_ops, iterate, ExecOptions};
pub use memory_budget::{MemoryBudget, MemoryShare, Reservation};
pub use splits::SplitSupplier;
