//! TLS settings of a server and of a caller, loaded once from PEM files.
//!
//! One rustls configuration (ring's provider, TLS 1.2 and 1.3) serves every listener, gRPC and
//! the raw fetch stream alike. A server with a CA verifies client certificates: optionally on the
//! client API and the worker port (callers may use a token instead), always on the Raft peer
//! listener, where a replica must prove it is one. ALPN offers `h2` for gRPC and [`RAW_ALPN`]
//! for the raw fetch stream.

use crate::role::ServerRole;
use crate::security_error::SecurityError;
use crate::server_role_verifier::ServerRoleVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The ALPN protocol a raw fetch client offers.
pub const RAW_ALPN: &[u8] = b"sluice-raw/1";

/// Whether a server asks callers for a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientCerts {
    /// Verified if presented (against the CA); callers may authenticate with a token instead.
    Optional,
    /// Required and verified: the Raft peer listener.
    Required,
}

/// ring's provider with AES-128-GCM preferred: as safe for this use, and about a third cheaper
/// than AES-256 per byte, which shows when a raw stream moves gigabytes a second.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.sort_by_key(|suite| {
        !matches!(
            suite.suite(),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
                | rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    Arc::new(provider)
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, SecurityError> {
    std::fs::read(path)
        .map_err(|e| SecurityError::Tls(format!("cannot read the {what} {}: {e}", path.display())))
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let pem = read(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SecurityError::Tls(format!("{} is not a PEM {what}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(SecurityError::Tls(format!(
            "{} holds no PEM certificate (expected the {what})",
            path.display()
        )));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, SecurityError> {
    let pem = read(path, "private key")?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        SecurityError::Tls(format!("{} is not a PEM private key: {e}", path.display()))
    })
}

fn roots(path: &Path) -> Result<RootCertStore, SecurityError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(path, "CA certificate")? {
        roots.add(cert).map_err(|e| {
            SecurityError::Tls(format!(
                "{}: not a usable CA certificate: {e}",
                path.display()
            ))
        })?;
    }
    Ok(roots)
}

/// A certificate and its key: what a server presents, or a caller's client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPairFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The TLS files of a server: its certificate and key, and the CA its callers' certificates
/// (and, for a replica, its peers') are verified against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub identity: KeyPairFiles,
    pub ca: Option<PathBuf>,
}

impl ServerTlsFiles {
    /// From the flags `--tls-cert`, `--tls-key`, `--tls-ca`: none, or a certificate with its key
    /// (and optionally a CA). A CA alone on a server is an error: it has nothing to present.
    pub fn from_flags(
        cert: Option<&Path>,
        key: Option<&Path>,
        ca: Option<&Path>,
    ) -> Result<Option<ServerTlsFiles>, SecurityError> {
        match (cert, key) {
            (None, None) if ca.is_none() => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(ServerTlsFiles {
                identity: KeyPairFiles {
                    cert: cert.to_path_buf(),
                    key: key.to_path_buf(),
                },
                ca: ca.map(Path::to_path_buf),
            })),
            (None, None) => Err(SecurityError::Tls(
                "--tls-ca on a server needs --tls-cert and --tls-key too".into(),
            )),
            _ => Err(SecurityError::Tls(
                "--tls-cert and --tls-key go together".into(),
            )),
        }
    }

    /// The rustls configuration of a listener.
    pub fn server_config(&self, client_certs: ClientCerts) -> Result<ServerConfig, SecurityError> {
        let chain = certs(&self.identity.cert, "server certificate")?;
        let key = key(&self.identity.key)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| SecurityError::Tls(format!("TLS versions: {e}")))?;
        let builder = match (&self.ca, client_certs) {
            (Some(ca), mode) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider());
                let verifier = match mode {
                    ClientCerts::Optional => verifier.allow_unauthenticated(),
                    ClientCerts::Required => verifier,
                };
                let verifier = verifier.build().map_err(|e| {
                    SecurityError::Tls(format!("client verifier from {}: {e}", ca.display()))
                })?;
                builder.with_client_cert_verifier(verifier)
            }
            (None, ClientCerts::Optional) => builder.with_no_client_auth(),
            (None, ClientCerts::Required) => {
                return Err(SecurityError::Tls(
                    "replicas authenticate each other with certificates: the peer listener \
                     needs --tls-ca"
                        .into(),
                ))
            }
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            SecurityError::Tls(format!(
                "{} and {} do not make a usable certificate and key: {e}",
                self.identity.cert.display(),
                self.identity.key.display()
            ))
        })?;
        config.alpn_protocols = vec![b"h2".to_vec(), RAW_ALPN.to_vec()];
        Ok(config)
    }
}

/// The TLS settings of a caller: the CA that servers' certificates are verified against, and
/// optionally a client certificate (mutual TLS).
#[derive(Clone, Debug)]
pub struct ClientTls {
    roots: Arc<RootCertStore>,
    identity: Option<ClientIdentity>,
}

#[derive(Clone, Debug)]
struct ClientIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl ClientTls {
    /// Loads the CA and, if given, the caller's own certificate and key.
    pub fn load(ca: &Path, identity: Option<&KeyPairFiles>) -> Result<ClientTls, SecurityError> {
        let identity = identity
            .map(|files| {
                Ok::<_, SecurityError>(ClientIdentity {
                    chain: certs(&files.cert, "client certificate")?,
                    key: Arc::new(key(&files.key)?),
                })
            })
            .transpose()?;
        Ok(ClientTls {
            roots: Arc::new(roots(ca)?),
            identity,
        })
    }

    /// The check of a server's certificate: against the CA, then its role (`expected`).
    pub fn verifier(&self, expected: ServerRole) -> Result<Arc<ServerRoleVerifier>, SecurityError> {
        let webpki = WebPkiServerVerifier::builder_with_provider(self.roots.clone(), provider())
            .build()
            .map_err(|e| SecurityError::Tls(format!("server certificate verifier: {e}")))?;
        Ok(Arc::new(ServerRoleVerifier::new(webpki, expected)))
    }

    /// The rustls configuration of a connection to a server of role `expected` that speaks
    /// `alpn` (`h2` for gRPC, [`RAW_ALPN`] for a raw fetch stream, which workers alone serve).
    pub fn rustls_config(
        &self,
        expected: ServerRole,
        alpn: &[u8],
    ) -> Result<ClientConfig, SecurityError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| SecurityError::Tls(format!("TLS versions: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(self.verifier(expected)?);
        let mut config = match &self.identity {
            Some(id) => builder
                .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
                .map_err(|e| SecurityError::Tls(format!("client certificate: {e}")))?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(config)
    }
}
