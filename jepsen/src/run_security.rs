//! `RunSecurity`: what a run's processes present and accept. A run is secure by default, as a
//! cluster on a shared network must be, so the faults hit the code paths production runs:
//! - the files of `sluice certs` are made in `OUT/certs`: a CA, the dispatchers' certificate,
//!   one certificate and token per worker (`worker-I`), the client's and admin's tokens;
//! - the dispatcher processes serve TLS on both listeners and check tokens; replicas speak
//!   mutual TLS to each other through the link proxies, which forward TCP bytes and never look
//!   inside (the certificates name 127.0.0.1, the address every route dials);
//! - each worker process serves TLS and tokens and calls the dispatchers as itself, so the
//!   dispatcher's rule that a worker acts only on its own tasks holds under every fault;
//! - clients, readers and the harness's own status reads present the CA and the client token.
//!
//! `--plain` runs everything on plain TCP with no tokens (every caller trusted).

use anyhow::Context;
use sluice_security::certs::{generate, CertsPlan};
use sluice_security::{ClientSecurity, ClientSecurityFiles, Role};
use std::path::{Path, PathBuf};

/// A run's credentials: `None` for a plain run, else the directory `sluice certs` wrote.
#[derive(Clone, Debug)]
pub struct RunSecurity {
    dir: Option<PathBuf>,
}

impl RunSecurity {
    /// No TLS, no tokens.
    pub fn plain() -> RunSecurity {
        RunSecurity { dir: None }
    }

    /// Makes a new CA, certificates and tokens in `dir` (which must not hold them yet), with a
    /// worker identity for each of workers `1..=workers`.
    pub fn generate(dir: &Path, workers: u32) -> anyhow::Result<RunSecurity> {
        generate(&CertsPlan {
            out: dir.to_path_buf(),
            hosts: vec![],
            worker_hosts: vec![],
            workers: (1..=workers).map(|i| i.to_string()).collect(),
            days: 1,
        })
        .with_context(|| format!("make certificates and tokens in {}", dir.display()))?;
        Ok(RunSecurity {
            dir: Some(dir.to_path_buf()),
        })
    }

    /// One line for the run's banner.
    pub fn describe(&self) -> String {
        match &self.dir {
            None => "plain TCP, no tokens (--plain)".into(),
            Some(dir) => format!(
                "TLS and tokens on every port, mutual TLS between replicas (credentials in {})",
                dir.display()
            ),
        }
    }

    fn file(dir: &Path, name: &str) -> PathBuf {
        dir.join(name)
    }

    /// A dispatcher process's security flags (none for a plain run).
    pub fn dispatcher_flags(&self) -> Vec<String> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let flag = |name: &str, file: &str| {
            [
                name.to_string(),
                Self::file(dir, file).display().to_string(),
            ]
        };
        [
            flag("--tls-cert", "dispatcher.pem"),
            flag("--tls-key", "dispatcher.key"),
            flag("--tls-ca", "ca.pem"),
            flag("--auth-token-file", "tokens"),
        ]
        .concat()
    }

    /// Worker `index`'s flags: its certificate, the CA, its token file (its own token, and the
    /// client token it accepts). None for a plain run.
    pub fn worker_flags(&self, index: u32) -> Vec<String> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let name = format!("worker-{index}");
        let flag = |flag: &str, file: String| {
            [
                flag.to_string(),
                Self::file(dir, &file).display().to_string(),
            ]
        };
        [
            flag("--tls-cert", format!("{name}.pem")),
            flag("--tls-key", format!("{name}.key")),
            flag("--tls-ca", "ca.pem".into()),
            flag("--auth-token-file", format!("{name}.tokens")),
        ]
        .concat()
    }

    /// The flags of a `sluice read` process presenting the client's credentials (none for a
    /// plain run).
    pub fn client_flags(&self) -> Vec<String> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        vec![
            "--tls-ca".to_string(),
            Self::file(dir, "ca.pem").display().to_string(),
            "--auth-token-file".to_string(),
            Self::file(dir, "client.token").display().to_string(),
        ]
    }

    /// What clients, readers and the harness's status reads present: the CA and the client
    /// token.
    pub fn client(&self) -> anyhow::Result<ClientSecurity> {
        let Some(dir) = &self.dir else {
            return Ok(ClientSecurity::default());
        };
        ClientSecurity::load(
            &ClientSecurityFiles {
                tls_ca: Some(Self::file(dir, "ca.pem")),
                token_file: Some(Self::file(dir, "client.token")),
                ..ClientSecurityFiles::default()
            },
            Role::Client,
        )
        .context("load the client's credentials")
    }
}
