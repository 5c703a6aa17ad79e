//! `check_worker_address`: whether a worker's address is one clients and the dispatcher can
//! dial: `HOST:PORT` with a nonzero port and a specified host (a DNS name or an IP address, not
//! 0.0.0.0 or [::]). A worker checks the address it is about to register under; the dispatcher
//! checks every heartbeat's, so an address nobody can dial never enters the replicated state.

use sluice_types::InvalidValue;
use std::net::SocketAddr;

/// The longest host name DNS allows.
const MAX_HOST_LEN: usize = 253;

/// `Ok` if `address` can be dialed; otherwise why not, naming the address.
pub fn check_worker_address(address: &str) -> Result<(), InvalidValue> {
    let refuse = |why: &str| {
        Err(InvalidValue(format!(
            "worker address '{address}' is not HOST:PORT with a host clients can dial and a \
             nonzero port: {why}"
        )))
    };
    if let Ok(socket) = address.parse::<SocketAddr>() {
        if socket.ip().is_unspecified() {
            return refuse("the host is unspecified (a worker listening on every interface must advertise the address it is reached at)");
        }
        if socket.port() == 0 {
            return refuse("the port is 0");
        }
        return Ok(());
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return refuse("there is no port");
    };
    match port.parse::<u16>() {
        Ok(0) => return refuse("the port is 0"),
        Ok(_) => {}
        Err(_) => return refuse("the port is not a number from 1 to 65535"),
    }
    let is_name = !host.is_empty()
        && host.len() <= MAX_HOST_LEN
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !is_name {
        return refuse("the host is neither a DNS name nor an IP address");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_dialable_addresses_pass() {
        // (address, the reason it is refused, if it is)
        let cases: &[(&str, Option<&str>)] = &[
            ("127.0.0.1:5000", None),
            ("[::1]:5000", None),
            ("worker-3.example.com:7", None),
            ("w:1", None),
            ("0.0.0.0:5000", Some("the host is unspecified")),
            ("[::]:5000", Some("the host is unspecified")),
            ("127.0.0.1:0", Some("the port is 0")),
            ("host:0", Some("the port is 0")),
            ("host", Some("there is no port")),
            ("host:http", Some("the port is not a number")),
            ("host:70000", Some("the port is not a number")),
            (":5000", Some("the host is neither")),
            ("a b:5000", Some("the host is neither")),
            ("::1:5000", Some("the host is neither")),
            ("", Some("there is no port")),
        ];
        for (address, refused) in cases {
            let got = check_worker_address(address);
            match refused {
                None => assert_eq!(got, Ok(()), "{address}"),
                Some(why) => {
                    let message = got.expect_err(address).0;
                    assert!(
                        message
                            .starts_with(&format!("worker address '{address}' is not HOST:PORT")),
                        "{message}"
                    );
                    assert!(message.contains(why), "{address}: {message}");
                }
            }
        }
    }
}
