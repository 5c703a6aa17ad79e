//! `Credentials`: a cluster's certificates and tokens (what `sluice certs` writes), in a temp
//! dir, and the security settings each part of a cluster runs with: the dispatchers (their
//! certificate, the CA, every role's token), the workers (theirs, and the client token they
//! accept), and a trainer (the CA and the client token). The demo, the bench and the tests run
//! secure clusters with it.

use sluice_security::certs::{generate, CertsPlan};
use sluice_security::{
    ClientSecurity, ClientSecurityFiles, Role, SecurityError, ServerSecurity, ServerSecurityFiles,
};
use std::path::{Path, PathBuf};

pub struct Credentials {
    dir: tempfile::TempDir,
}

impl Credentials {
    /// Makes a new CA, certificates for one shared worker identity, and tokens.
    pub fn generate() -> Result<Credentials, SecurityError> {
        let dir = tempfile::tempdir()
            .map_err(|e| SecurityError::Certs(format!("temp dir for credentials: {e}")))?;
        generate(&CertsPlan {
            out: dir.path().to_path_buf(),
            hosts: vec![],
            worker_hosts: vec![],
            workers: vec![],
            days: 1,
        })?;
        Ok(Credentials { dir })
    }

    /// A file `sluice certs` wrote (`ca.pem`, `tokens`, `worker.key`, ...).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn server_files(&self, cert: &str, tokens: &str) -> ServerSecurityFiles {
        ServerSecurityFiles {
            tls_cert: Some(self.path(&format!("{cert}.pem"))),
            tls_key: Some(self.path(&format!("{cert}.key"))),
            tls_ca: Some(self.path("ca.pem")),
            token_file: Some(self.path(tokens)),
            insecure: false,
        }
    }

    /// A server's command-line flags: its certificate (`dispatcher` or `worker`), the CA and
    /// its token file.
    pub fn server_flags(&self, cert: &str, tokens: &str) -> Vec<String> {
        let files = self.server_files(cert, tokens);
        let path = |p: Option<PathBuf>| p.map(|p| p.display().to_string()).unwrap_or_default();
        vec![
            "--tls-cert".into(),
            path(files.tls_cert),
            "--tls-key".into(),
            path(files.tls_key),
            "--tls-ca".into(),
            path(files.tls_ca),
            "--auth-token-file".into(),
            path(files.token_file),
        ]
    }

    /// A dispatcher replica's settings.
    pub fn dispatcher(&self) -> Result<ServerSecurity, SecurityError> {
        ServerSecurity::load(&self.server_files("dispatcher", "tokens"))
    }

    /// A worker's settings.
    pub fn worker(&self) -> Result<ServerSecurity, SecurityError> {
        ServerSecurity::load(&self.server_files("worker", "worker.tokens"))
    }

    /// What a trainer presents: the CA and the client token.
    pub fn client(&self) -> Result<ClientSecurity, SecurityError> {
        self.caller("client.token", Role::Client)
    }

    /// What an operator presents: the CA and the admin token.
    pub fn admin(&self) -> Result<ClientSecurity, SecurityError> {
        self.caller("admin.token", Role::Admin)
    }

    fn caller(&self, token: &str, role: Role) -> Result<ClientSecurity, SecurityError> {
        ClientSecurity::load(
            &ClientSecurityFiles {
                tls_ca: Some(self.path("ca.pem")),
                token_file: Some(self.path(token)),
                ..ClientSecurityFiles::default()
            },
            role,
        )
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
