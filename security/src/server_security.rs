//! A server's security settings, from its flags: the TLS configuration of its listeners, the
//! [`Authenticator`] of its RPCs, what it presents when it calls other servers, and the rule that
//! keeps an unprotected server on loopback.
//!
//! Exposure rule: a server that listens beyond loopback without TLS *and* authentication refuses
//! to start unless told `--insecure`. Anyone who reaches such a port could rewrite the replicated
//! state, read any task's elements or, with Python functions, run code on the workers.

use crate::authenticator::Authenticator;
use crate::client_security::ClientSecurity;
use crate::role::Role;
use crate::security_error::SecurityError;
use crate::tls::{ClientCerts, ServerTlsFiles};
use crate::token_file::TokenFile;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

/// The security flags of a server (`--tls-cert`, `--tls-key`, `--tls-ca`, `--auth-token-file`,
/// `--insecure`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerSecurityFiles {
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    pub insecure: bool,
}

/// A server's loaded security settings. `Default` is an open, plain-TCP server (loopback only).
#[derive(Clone, Debug, Default)]
pub struct ServerSecurity {
    tls: Option<ServerTlsFiles>,
    tokens: Option<TokenFile>,
    insecure: bool,
}

impl ServerSecurity {
    /// Loads and checks the files (certificates and keys are read now, so a bad file stops the
    /// server at start, not at the first connection).
    pub fn load(files: &ServerSecurityFiles) -> Result<ServerSecurity, SecurityError> {
        let tls = ServerTlsFiles::from_flags(
            files.tls_cert.as_deref(),
            files.tls_key.as_deref(),
            files.tls_ca.as_deref(),
        )?;
        if let Some(tls) = &tls {
            tls.server_config(ClientCerts::Optional)?;
        }
        let tokens = TokenFile::from_flag_or_env(files.token_file.as_deref())?;
        Ok(ServerSecurity {
            tls,
            tokens,
            insecure: files.insecure,
        })
    }

    /// Whether this server's listeners speak TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether this server authenticates callers (tokens, or certificates under its CA).
    pub fn is_authenticated(&self) -> bool {
        self.tokens.is_some() || self.tls.as_ref().is_some_and(|t| t.ca.is_some())
    }

    /// The rustls configuration of one listener, or `None` for plain TCP.
    pub fn tls_config(
        &self,
        client_certs: ClientCerts,
    ) -> Result<Option<Arc<rustls::ServerConfig>>, SecurityError> {
        self.tls
            .as_ref()
            .map(|tls| tls.server_config(client_certs).map(Arc::new))
            .transpose()
    }

    /// The checker of callers' credentials.
    pub fn authenticator(&self) -> Authenticator {
        let certs = self.tls.as_ref().is_some_and(|t| t.ca.is_some());
        Authenticator::new(self.tokens.clone(), certs)
    }

    /// What this server presents when it calls others as `role` (a replica to its peers, a
    /// worker to the dispatcher): its own certificate as a client certificate, its CA to verify
    /// theirs, and its token of that role. Without a CA, calls are plain TCP (a server with a
    /// certificate but no CA still calls others with its token).
    pub fn caller(&self, role: Role) -> Result<ClientSecurity, SecurityError> {
        let tls = match self.tls.as_ref().and_then(|t| t.ca.as_ref()) {
            Some(ca) => Some(crate::tls::ClientTls::load(
                ca,
                self.tls.as_ref().map(|t| &t.identity),
            )?),
            None => None,
        };
        let token = match &self.tokens {
            None => None,
            Some(tokens) => Some(tokens.token_for(role).cloned().ok_or_else(|| {
                SecurityError::Tokens(format!(
                    "the token file has no `{role}` line, which this server presents when it \
                     calls others"
                ))
            })?),
        };
        ClientSecurity::new(tls, token)
    }

    /// Refuses to serve `addr` beyond loopback without TLS and authentication, unless
    /// `--insecure`. `what` names the listener in the message.
    pub fn check_exposure(&self, what: &str, addr: &SocketAddr) -> Result<(), SecurityError> {
        if is_loopback(addr.ip()) || self.insecure || (self.is_tls() && self.is_authenticated()) {
            return Ok(());
        }
        let missing = match (self.is_tls(), self.is_authenticated()) {
            (false, false) => "TLS and authentication",
            (false, true) => "TLS",
            _ => "authentication",
        };
        Err(SecurityError::Exposed(format!(
            "refusing to serve the {what} on {addr} without {missing}: anyone who can reach it \
             could change the cluster's state or read its data. Give --tls-cert/--tls-key/--tls-ca \
             and --auth-token-file (see `sluice certs`), listen on 127.0.0.1, or pass --insecure \
             on a network you trust"
        )))
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposure_table() {
        let open = ServerSecurity::default();
        let insecure = ServerSecurity {
            insecure: true,
            ..ServerSecurity::default()
        };
        let tokens_only = ServerSecurity {
            tokens: Some(TokenFile::parse("aaaaaaaaaaaaaaaa", "t").unwrap()),
            ..ServerSecurity::default()
        };
        let cases: &[(&ServerSecurity, &str, Result<(), &str>)] = &[
            (&open, "127.0.0.1:5000", Ok(())),
            (&open, "[::1]:5000", Ok(())),
            (&open, "0.0.0.0:5000", Err("TLS and authentication")),
            (&open, "10.1.2.3:5000", Err("TLS and authentication")),
            (&insecure, "0.0.0.0:5000", Ok(())),
            (&tokens_only, "0.0.0.0:5000", Err("without TLS:")),
        ];
        for (security, addr, want) in cases {
            let got = security.check_exposure("client API", &addr.parse().unwrap());
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(part)) => assert!(e.to_string().contains(part), "{addr}: {e}"),
                (got, want) => panic!("{addr}: got {got:?}, want {want:?}"),
            }
        }
    }
}
