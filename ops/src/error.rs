//! `OpsError`: what can go wrong with the operations listener.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum OpsError {
    #[error("bind the metrics listener {addr}: {message}")]
    Bind { addr: String, message: String },
    #[error("metrics text line {line}: {message}: {text:?}")]
    Exposition {
        line: usize,
        message: String,
        text: String,
    },
}
