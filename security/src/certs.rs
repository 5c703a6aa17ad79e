//! `sluice certs`: a cluster's certificates and tokens made offline, with no tool beyond the
//! binary, so that turning security on is one command.
//!
//! One CA signs a certificate per role; the subject's organization (O) carries the role and the
//! common name (CN) the name, as servers read them and as callers check a server's role. Each
//! certificate gets only the names and usages of its role: the dispatcher's names the
//! dispatcher's hosts (`--host`), a worker's only its own (`--worker NAME=HOST,...` and
//! `--worker-host`), both with `localhost`, `127.0.0.1` and `::1`, and both serve and call
//! (serverAuth and clientAuth: replicas call each other, workers call the dispatcher); client
//! and admin certificates name no host and only call (clientAuth). Keys are written readable by
//! their owner only, and nothing existing is overwritten.

use crate::role::Role;
use crate::security_error::SecurityError;
use crate::token_file::Token;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What to make.
#[derive(Clone, Debug)]
pub struct CertsPlan {
    /// The directory written into (created if missing).
    pub out: PathBuf,
    /// Host names or IP addresses the dispatcher replicas are reached at, beyond the loopback
    /// ones.
    pub hosts: Vec<String>,
    /// Host names or IP addresses every worker certificate names, beyond the loopback ones
    /// (e.g. a wildcard of the workers' DNS zone).
    pub worker_hosts: Vec<String>,
    /// Workers that get their own certificate and token, so the dispatcher can tell them apart
    /// (a worker may only act on its own tasks), as `NAME` or `NAME=HOST[,HOST...]` with the
    /// hosts that worker alone is reached at. Empty: one `worker` identity.
    pub workers: Vec<String>,
    /// Validity of every certificate, in days.
    pub days: u32,
}

fn err(what: &str, e: impl std::fmt::Display) -> SecurityError {
    SecurityError::Certs(format!("{what}: {e}"))
}

fn name(role: Role, cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, role.as_str());
    dn.push(DnType::CommonName, cn);
    dn
}

fn params(days: u32) -> CertificateParams {
    let mut params = CertificateParams::default();
    let now = rcgen::date_time_ymd(1970, 1, 1)
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
    params.not_before = now - std::time::Duration::from_secs(3600);
    params.not_after = now + std::time::Duration::from_secs(u64::from(days) * 86_400);
    params
}

/// Writes `text` to a new file (never over an existing one); `secret` files are owner-only.
fn write_new(path: &Path, text: &str, secret: bool) -> Result<(), SecurityError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    let mut file = options
        .open(path)
        .map_err(|e| err(&format!("cannot create {}", path.display()), e))?;
    file.write_all(text.as_bytes())
        .map_err(|e| err(&format!("cannot write {}", path.display()), e))
}

/// A server certificate's names: the loopback ones and `hosts` (DNS names, wildcards or IP
/// addresses).
fn sans(hosts: &[String]) -> Result<Vec<SanType>, SecurityError> {
    let mut sans = vec![
        SanType::DnsName("localhost".try_into().map_err(|e| err("localhost", e))?),
        SanType::IpAddress([127, 0, 0, 1].into()),
        SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
    ];
    for host in hosts {
        sans.push(match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.clone()
                    .try_into()
                    .map_err(|e| err(&format!("host '{host}'"), e))?,
            ),
        });
    }
    Ok(sans)
}

/// A `--worker` value: `NAME` or `NAME=HOST[,HOST...]`.
fn worker_spec(spec: &str) -> Result<(String, Vec<String>), SecurityError> {
    let (name, hosts) = match spec.split_once('=') {
        None => (spec, vec![]),
        Some((name, hosts)) => (
            name,
            hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(str::to_string)
                .collect(),
        ),
    };
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Err(SecurityError::Certs(format!(
            "--worker '{spec}': expected NAME or NAME=HOST[,HOST...], the name made of letters, \
             digits, '-', '_' and '.'"
        )));
    }
    Ok((name.to_string(), hosts))
}

/// Makes the CA, the certificates and the token files; returns the files written.
pub fn generate(plan: &CertsPlan) -> Result<Vec<PathBuf>, SecurityError> {
    if plan.days == 0 {
        return Err(SecurityError::Certs("--days must be at least 1".into()));
    }
    // (file, name, own hosts) of each worker certificate, checked before anything is written.
    let workers: Vec<(String, String, Vec<String>)> = if plan.workers.is_empty() {
        vec![("worker".into(), "worker".into(), vec![])]
    } else {
        plan.workers
            .iter()
            .map(|spec| {
                let (name, hosts) = worker_spec(spec)?;
                Ok((format!("worker-{name}"), name, hosts))
            })
            .collect::<Result<_, SecurityError>>()?
    };
    sans(&plan.hosts)?;
    for (_, _, hosts) in &workers {
        sans(hosts)?;
    }
    sans(&plan.worker_hosts)?;
    std::fs::create_dir_all(&plan.out)
        .map_err(|e| err(&format!("cannot create {}", plan.out.display()), e))?;
    let mut written = Vec::new();
    let mut write = |file: &str, text: &str, secret: bool| {
        let path = plan.out.join(file);
        write_new(&path, text, secret)?;
        written.push(path);
        Ok::<_, SecurityError>(())
    };

    let ca_key = KeyPair::generate().map_err(|e| err("CA key", e))?;
    let mut ca_params = params(plan.days);
    let mut ca_name = DistinguishedName::new();
    ca_name.push(DnType::CommonName, "sluice cluster CA");
    ca_params.distinguished_name = ca_name;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(|e| err("CA certificate", e))?;
    write("ca.pem", &ca_cert.pem(), false)?;
    write("ca.key", &ca_key.serialize_pem(), true)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let dispatcher_sans = sans(&plan.hosts)?;
    let worker_sans = |own: &[String]| {
        let mut hosts = plan.worker_hosts.clone();
        hosts.extend_from_slice(own);
        sans(&hosts)
    };

    // `sans`: the names of a server's certificate; `None` for a caller's (no serverAuth).
    let mut issue = |file: &str, role: Role, cn: &str, sans: Option<Vec<SanType>>| {
        let key = KeyPair::generate().map_err(|e| err("key", e))?;
        let mut p = params(plan.days);
        p.distinguished_name = name(role, cn);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if let Some(sans) = sans {
            p.extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
            p.subject_alt_names = sans;
        }
        let cert = p
            .signed_by(&key, &issuer)
            .map_err(|e| err(&format!("{file} certificate"), e))?;
        write(&format!("{file}.pem"), &cert.pem(), false)?;
        write(&format!("{file}.key"), &key.serialize_pem(), true)
    };
    issue(
        "dispatcher",
        Role::Peer,
        "dispatcher",
        Some(dispatcher_sans),
    )?;
    for (file, cn, hosts) in &workers {
        issue(file, Role::Worker, cn, Some(worker_sans(hosts)?))?;
    }
    issue("client", Role::Client, "client", None)?;
    issue("admin", Role::Admin, "admin", None)?;

    let admin = Token::random();
    let client = Token::random();
    let peer = Token::random();
    let worker_tokens: Vec<(String, String, Token)> = workers
        .iter()
        .map(|(file, cn, _)| (file.clone(), cn.clone(), Token::random()))
        .collect();
    let mut cluster = format!(
        "# role name token: the dispatchers' token file\nadmin admin {}\nclient client {}\npeer dispatcher {}\n",
        admin.expose(),
        client.expose(),
        peer.expose()
    );
    for (_, cn, token) in &worker_tokens {
        cluster.push_str(&format!("worker {cn} {}\n", token.expose()));
    }
    write("tokens", &cluster, true)?;
    for (file, cn, token) in &worker_tokens {
        write(
            &format!("{file}.tokens"),
            &format!(
                "# role name token: a worker's token file (it presents its worker line and accepts clients)\nworker {cn} {}\nclient client {}\n",
                token.expose(),
                client.expose()
            ),
            true,
        )?;
    }
    write("client.token", &format!("{}\n", client.expose()), true)?;
    write("admin.token", &format!("{}\n", admin.expose()), true)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cert_identity::cert_identity;
    use crate::token_file::TokenFile;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    #[test]
    fn generated_files_name_roles_and_never_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let plan = CertsPlan {
            out: dir.path().to_path_buf(),
            hosts: vec!["10.0.0.7".into(), "dispatcher-0.sluice".into()],
            worker_hosts: vec![],
            workers: vec!["a".into(), "b".into()],
            days: 30,
        };
        let written = generate(&plan).unwrap();
        assert_eq!(written.len(), 2 + 2 * 5 + 1 + 2 + 2);
        for (file, role, name) in [
            ("dispatcher.pem", Role::Peer, "dispatcher"),
            ("worker-a.pem", Role::Worker, "a"),
            ("client.pem", Role::Client, "client"),
            ("admin.pem", Role::Admin, "admin"),
        ] {
            let der = CertificateDer::from_pem_file(dir.path().join(file)).unwrap();
            let identity = cert_identity(&der).unwrap();
            assert_eq!(
                (identity.role, identity.name.as_str()),
                (role, name),
                "{file}"
            );
        }
        let tokens = TokenFile::load(&dir.path().join("tokens")).unwrap();
        let worker_b = TokenFile::load(&dir.path().join("worker-b.tokens")).unwrap();
        let b = worker_b
            .token_for(Role::Worker)
            .unwrap()
            .expose()
            .to_string();
        assert_eq!(tokens.identify(b.as_bytes()).unwrap().name, "b");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("ca.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "keys are owner-only");
        }
        let again = generate(&plan).unwrap_err().to_string();
        assert!(again.contains("ca.pem"), "{again}");
    }

    /// A certificate's DNS and IP names, and whether it may serve and call.
    fn names_and_usages(path: &Path) -> (Vec<String>, bool, bool) {
        use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
        let der = CertificateDer::from_pem_file(path).unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let names = cert
            .subject_alternative_name()
            .unwrap()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .map(|name| match name {
                        GeneralName::DNSName(dns) => dns.to_string(),
                        GeneralName::IPAddress(ip) if ip.len() == 4 => {
                            std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]).to_string()
                        }
                        other => format!("{other:?}"),
                    })
                    .filter(|n| n != "localhost" && n != "127.0.0.1" && !n.contains("IPAddress"))
                    .collect()
            })
            .unwrap_or_default();
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        (names, eku.server_auth, eku.client_auth)
    }

    #[test]
    fn each_certificate_names_only_its_roles_hosts_and_usages() {
        let dir = tempfile::tempdir().unwrap();
        generate(&CertsPlan {
            out: dir.path().to_path_buf(),
            hosts: vec!["10.0.0.7".into(), "dispatcher-0.sluice".into()],
            worker_hosts: vec!["*.workers.sluice".into()],
            workers: vec!["a=10.0.0.21,a.sluice".into(), "b".into()],
            days: 30,
        })
        .unwrap();
        let strings = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let cases: [(&str, Vec<String>, bool, bool); 5] = [
            (
                "dispatcher.pem",
                strings(&["10.0.0.7", "dispatcher-0.sluice"]),
                true,
                true,
            ),
            (
                "worker-a.pem",
                strings(&["*.workers.sluice", "10.0.0.21", "a.sluice"]),
                true,
                true,
            ),
            ("worker-b.pem", strings(&["*.workers.sluice"]), true, true),
            ("client.pem", vec![], false, true),
            ("admin.pem", vec![], false, true),
        ];
        for (file, names, serves, calls) in cases {
            assert_eq!(
                names_and_usages(&dir.path().join(file)),
                (names, serves, calls),
                "{file}"
            );
        }
    }

    #[test]
    fn a_malformed_worker_spec_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        for spec in ["", "=10.0.0.1", "a b", "w/1=h"] {
            let error = generate(&CertsPlan {
                out: dir.path().join(format!("out{}", spec.len())),
                hosts: vec![],
                worker_hosts: vec![],
                workers: vec![spec.into()],
                days: 1,
            })
            .unwrap_err()
            .to_string();
            assert!(error.contains(&format!("--worker '{spec}'")), "{error}");
            assert!(!dir.path().join(format!("out{}", spec.len())).exists());
        }
    }
}
