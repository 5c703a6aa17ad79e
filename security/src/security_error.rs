//! `SecurityError`: a credential or TLS setting that cannot be used, found when a process starts.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SecurityError {
    /// A token file or `SLUICE_AUTH_TOKEN` that cannot be used.
    #[error("{0}")]
    Tokens(String),
    /// A certificate, key or CA file that cannot be used, or flags that do not fit together.
    #[error("{0}")]
    Tls(String),
    /// A server that would listen beyond loopback without TLS and authentication.
    #[error("{0}")]
    Exposed(String),
    /// `sluice certs` could not make or write a certificate.
    #[error("{0}")]
    Certs(String),
}
