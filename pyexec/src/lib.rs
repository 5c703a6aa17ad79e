//! `sluice-pyexec`: a worker's pool of Python executor processes, which run the Python
//! functions (`PyFunctionOp`) of its pipelines outside the worker's address space: in parallel
//! across cores despite the GIL, and with a crash in user code costing one call, never the
//! worker.
//!
//! Layout:
//! - `protocol`: the framed binary protocol on an executor's stdin and stdout (pure).
//! - `executor_process`: one executor child process, its handshake and its pipes.
//! - `executor_pool`: `ExecutorPool`, the `PythonRunner`: the shared FIFO of calls, one thread
//!   per executor, loading functions, restarting executors that die.
//! - `shared_region`: the memory a worker shares with each executor, through which batches and
//!   results travel.
//! - `batch_size`: how many elements one BATCH carries, from what the last batches cost.
//! - `pool_config`: `PoolConfig`, the interpreter and the number of executors.
//! - `error`: `PoolError`, why a pool could not start.
//!
//! The executor's own side is `python -m sluice._executor` in the Python package.

pub mod batch_size;
mod error;
mod executor_pool;
mod executor_process;
mod pool_config;
pub mod protocol;
pub mod shared_region;

pub use error::PoolError;
pub use executor_pool::{ExecutorPool, MAX_LOADED};
pub use pool_config::PoolConfig;
