//! `PoolError`: why an executor pool could not start. Errors of calls are `DatasetError`s, the
//! pipeline's own boundary.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("{0}")]
    Config(String),
    #[error("cannot start Python executor `{} -m sluice._executor`: {message}", python.display())]
    Spawn { python: PathBuf, message: String },
    #[error("Python executor `{} -m sluice._executor` did not start: {message}", python.display())]
    Handshake { python: PathBuf, message: String },
    #[error("cannot start a Python executor thread: {0}")]
    Thread(String),
}
