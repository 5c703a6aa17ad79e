//! The identity a verified client certificate carries, read as Kubernetes reads its client
//! certificates: the subject's organization (O) is the role, its common name (CN) the name.
//!
//! Only certificates that TLS has already verified against the server's CA reach here; one
//! without a known role in O authenticates no one (its holder may still present a token).

use crate::role::{Identity, Role};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

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

/// The host names (DNS names, wildcards included) and IP addresses a verified leaf certificate
/// names in its subject alternative names; empty when it names none or cannot be read.
pub fn cert_hosts(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let Ok(Some(names)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_ascii_lowercase()),
            GeneralName::IPAddress(ip) => match ip.len() {
                4 => <[u8; 4]>::try_from(*ip)
                    .ok()
                    .map(|b| std::net::IpAddr::from(b).to_string()),
                16 => <[u8; 16]>::try_from(*ip)
                    .ok()
                    .map(|b| std::net::IpAddr::from(b).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Whether `host` (a DNS name or an IP address, as in `host:port`) is one of `names` (as
/// [`cert_hosts`] lists them): equal ignoring case, an equal IP address, or matched by a
/// wildcard `*.zone` in its first label only, as TLS matches names.
pub fn names_host(names: &[String], host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return names
            .iter()
            .any(|n| n.parse::<std::net::IpAddr>().is_ok_and(|n| n == ip));
    }
    let host = host.to_ascii_lowercase();
    names.iter().any(|name| match name.strip_prefix("*.") {
        None => *name == host,
        Some(zone) => host
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == zone),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_host_table() {
        let names: Vec<String> = ["localhost", "127.0.0.1", "::1", "w1.example", "*.workers.x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for (host, named) in [
            ("localhost", true),
            ("LOCALHOST", true),
            ("127.0.0.1", true),
            ("[::1]", true),
            ("0:0:0:0:0:0:0:1", true),
            ("w1.example", true),
            ("w2.example", false),
            ("pod-1.workers.x", true),
            ("a.pod-1.workers.x", false),
            ("workers.x", false),
            ("10.0.0.1", false),
        ] {
            assert_eq!(names_host(&names, host), named, "{host}");
        }
    }
}
