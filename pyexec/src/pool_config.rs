//! `PoolConfig`: which interpreter a worker's executor pool runs, and how many executors.

use std::path::PathBuf;

use crate::error::PoolError;

/// The interpreter an executor pool runs, with its number of executors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The Python interpreter (`python3`, or a path); it must import `sluice`, `numpy` and
    /// `cloudpickle`.
    pub python: PathBuf,
    /// How many executor processes run (at least 1).
    pub executors: usize,
}

impl PoolConfig {
    /// `python` with one executor per available core.
    pub fn with_cores(python: impl Into<PathBuf>) -> PoolConfig {
        PoolConfig {
            python: python.into(),
            executors: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        }
    }

    pub fn validate(&self) -> Result<(), PoolError> {
        if self.executors == 0 {
            return Err(PoolError::Config(
                "a Python executor pool needs at least one executor".into(),
            ));
        }
        if self.python.as_os_str().is_empty() {
            return Err(PoolError::Config(
                "the Python interpreter path is empty".into(),
            ));
        }
        Ok(())
    }
}
