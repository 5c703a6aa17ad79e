//! `ServerRoleVerifier`: a caller's check of a server's certificate, the CA's verdict (rustls'
//! WebPKI verifier: chain, validity, host name) and then the role the certificate carries.
//!
//! Verifying against the CA alone lets any certificate the CA signed pass as any server: a
//! process serving with a worker's certificate at a dispatcher's address would receive the
//! readers' client tokens and `sluice admin`'s admin token. The role is checked during the
//! handshake, before the caller's own certificate (TLS 1.3 sends it after the server's is
//! verified) and before any token, which travels in the first request after the handshake: a
//! server of the wrong role learns no credential.

use crate::cert_identity::cert_identity;
use crate::role::ServerRole;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::sync::Arc;

/// The CA's verifier, then the role check (see the module header).
#[derive(Debug)]
pub struct ServerRoleVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    expected: ServerRole,
}

impl ServerRoleVerifier {
    pub fn new(webpki: Arc<WebPkiServerVerifier>, expected: ServerRole) -> ServerRoleVerifier {
        ServerRoleVerifier { webpki, expected }
    }
}

/// Why a verified certificate is not one of `expected`'s, or `None` when it is.
pub fn role_mismatch(der: &[u8], server: &str, expected: ServerRole) -> Option<String> {
    let want = expected.cert_role();
    match cert_identity(der) {
        Ok(identity) if identity.role == want => None,
        Ok(identity) => Some(format!(
            "the server at {server} presents the certificate of {identity} (organization \
             '{}'), not a {expected}'s (organization '{want}'): refusing to send it any \
             credential; check the address, or the certificate that server runs with",
            identity.role
        )),
        Err(why) => Some(format!(
            "the server at {server} presents a certificate without the {expected} role \
             (organization '{want}'): {why}; refusing to send it any credential"
        )),
    }
}

impl ServerCertVerifier for ServerRoleVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        match role_mismatch(end_entity, &server_name.to_str(), self.expected) {
            None => Ok(verified),
            Some(why) => {
                tracing::warn!("{why}");
                Err(rustls::Error::General(why))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
