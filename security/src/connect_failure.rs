//! Connection failures that no retry can cure, told apart from those that pass.
//!
//! A caller retries a dispatcher that does not answer (a leader change, a restart) for as long
//! as its retry deadline. A caller that cannot speak to a server as it is configured must not:
//! plain TCP to a TLS server or the reverse, a server certificate the caller's CA does not
//! sign or whose role is not the expected one, a client certificate the server refuses. Each of
//! these ends in a rustls error or in a [`Misconfigured`] error somewhere in the failed call's
//! chain of sources; [`permanent_failure`] finds it and says what is wrong in words.

use std::collections::HashMap;
use std::error::Error;
use std::io;
use std::sync::Mutex;

/// A connection that cannot succeed as the caller is configured (raised by the caller's own
/// transport, e.g. plain TCP that hears a TLS server answer).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Misconfigured(pub String);

/// The causes a caller's connections found, by server address, until a connection to that
/// server reads something again: a failed call looks here, since the cause of a connection's
/// failure in its background task does not reach the calls on it (see `grpc_connector`).
#[derive(Debug, Default)]
pub struct Refusals {
    /// A std mutex: held to read or write the map only, never across an `.await`.
    by_addr: Mutex<HashMap<String, String>>,
}

impl Refusals {
    /// Records why the connection to `addr` failed with `error` if no retry can cure it;
    /// returns the error, as the connection reports it.
    pub fn note(&self, addr: &str, error: io::Error) -> io::Error {
        if let Some(why) = permanent_failure(&error) {
            self.by_addr
                .lock()
                .expect("refusals lock poisoned")
                .insert(addr.to_string(), why);
        }
        error
    }

    /// A connection to `addr` read from its server: whatever was wrong is no more.
    pub fn clear(&self, addr: &str) {
        let mut by_addr = self.by_addr.lock().expect("refusals lock poisoned");
        if !by_addr.is_empty() {
            by_addr.remove(addr);
        }
    }

    /// Why connections to `addr` fail, if a permanent cause was seen.
    pub fn of(&self, addr: &str) -> Option<String> {
        self.by_addr
            .lock()
            .expect("refusals lock poisoned")
            .get(addr)
            .cloned()
    }
}

/// Why a failed call cannot succeed as configured, if that is why it failed; `None` for a
/// failure that may pass (connection refused or reset, a timeout, a status a server sent).
pub fn permanent_failure(error: &(dyn Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(misconfigured) = error.downcast_ref::<Misconfigured>() {
            return Some(misconfigured.0.clone());
        }
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls_failure(tls));
        }
        // `io::Error::source` skips the error it wraps: look at that one too.
        if let Some(inner) = error
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
        {
            if let Some(why) = permanent_failure(inner) {
                return Some(why);
            }
        }
        next = error.source();
    }
    None
}

/// What a TLS handshake's failure says about the caller's configuration.
fn tls_failure(error: &rustls::Error) -> String {
    use rustls::AlertDescription as Alert;
    match error {
        // The role check's own words (`ServerRoleVerifier`).
        rustls::Error::General(why) => why.clone(),
        rustls::Error::InvalidCertificate(e) => format!(
            "the server's certificate is refused: {e} (it must be signed by the CA given with \
             --tls-ca or SLUICE_TLS_CA, be valid now, and name the address it is reached at)"
        ),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "the server does not speak TLS (it answered in plain text): this caller uses TLS \
             because it was given --tls-ca or SLUICE_TLS_CA; drop it for a server without TLS, \
             or check the address"
                .to_string()
        }
        rustls::Error::AlertReceived(
            alert @ (Alert::BadCertificate
            | Alert::UnsupportedCertificate
            | Alert::CertificateRevoked
            | Alert::CertificateExpired
            | Alert::CertificateUnknown
            | Alert::UnknownCA
            | Alert::AccessDenied
            | Alert::CertificateRequired
            // A certificate whose issuer has the CA's name but not its key (another cluster's
            // CA made by `sluice certs`): its signature does not verify.
            | Alert::DecryptError),
        ) => format!(
            "the server refused this caller's certificate (TLS alert {alert:?}): give \
             --tls-cert and --tls-key a certificate signed by the cluster's CA, or none and a \
             token"
        ),
        rustls::Error::AlertReceived(alert) => format!(
            "the server ended the TLS handshake (TLS alert {alert:?}); if this caller presents \
             a certificate (--tls-cert), the server may not trust it"
        ),
        other => format!("the TLS handshake failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permanent_failures_are_found_through_io_errors_and_others_are_not() {
        let cases: Vec<(Box<dyn Error + Send + Sync>, Option<&str>)> = vec![
            (
                Box::new(io::Error::new(
                    io::ErrorKind::InvalidData,
                    rustls::Error::General("wrong role".into()),
                )),
                Some("wrong role"),
            ),
            (
                Box::new(io::Error::new(
                    io::ErrorKind::InvalidData,
                    Misconfigured("speaks TLS".into()),
                )),
                Some("speaks TLS"),
            ),
            (
                Box::new(io::Error::new(
                    io::ErrorKind::InvalidData,
                    rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
                )),
                Some("does not speak TLS"),
            ),
            (
                Box::new(rustls::Error::AlertReceived(
                    rustls::AlertDescription::CertificateRequired,
                )),
                Some("refused this caller's certificate"),
            ),
            (
                Box::new(io::Error::from(io::ErrorKind::ConnectionRefused)),
                None,
            ),
            (
                Box::new(io::Error::from(io::ErrorKind::UnexpectedEof)),
                None,
            ),
        ];
        for (error, want) in cases {
            let got = permanent_failure(error.as_ref());
            match want {
                Some(want) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(want)),
                    "{error}: {got:?}"
                ),
                None => assert_eq!(got, None, "{error}"),
            }
        }
    }
}
