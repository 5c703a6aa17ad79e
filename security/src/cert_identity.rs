//! The identity a verified client certificate carries, read as Kubernetes reads its client
//! certificates: the subject's organization (O) is the role, its common name (CN) the name.
//!
//! Only certificates that TLS has already verified against the server's CA reach here; one
//! without a known role in O authenticates no one (its holder may still present a token).

use crate::role::{Identity, Role};
use x509_parser::prelude::{FromDer, X509Certificate};

/// The identity of a verified leaf certificate, or why it carries none.
pub fn cert_identity(der: &[u8]) -> Result<Identity, String> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| format!("unreadable client certificate: {e}"))?;
    let subject = cert.subject();
    let role = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .find_map(|o| o.parse::<Role>().ok())
        .ok_or_else(|| {
            format!(
                "client certificate '{subject}' names no role: its organization (O) must be \
                 peer, worker, client or admin"
            )
        })?;
    let name = subject
        .iter_common_name()
        .find_map(|cn| cn.as_str().ok())
        .unwrap_or_default();
    Ok(Identity::new(role, name))
}
