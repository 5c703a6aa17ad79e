//! TLS end to end over real sockets: certificates made by `certs::generate`, a listener from
//! `incoming`, and callers from `ClientSecurity`: the right certificate is identified, a
//! certificate from another CA and a plain-TCP caller are refused.

use futures::StreamExt;
use sluice_security::certs::{generate, CertsPlan};
use sluice_security::{
    incoming, ClientCerts, ClientSecurity, ClientSecurityFiles, Identity, Role, ServerSecurity,
    ServerSecurityFiles,
};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn make(dir: &Path) {
    generate(&CertsPlan {
        out: dir.to_path_buf(),
        hosts: vec![],
        worker_hosts: vec![],
        workers: vec![],
        days: 1,
    })
    .unwrap();
}

/// A server presenting `cert` (`dispatcher` or `worker`).
fn server(dir: &Path, cert: &str) -> ServerSecurity {
    ServerSecurity::load(&ServerSecurityFiles {
        tls_cert: Some(dir.join(format!("{cert}.pem"))),
        tls_key: Some(dir.join(format!("{cert}.key"))),
        tls_ca: Some(dir.join("ca.pem")),
        token_file: Some(dir.join("tokens")),
        insecure: false,
    })
    .unwrap()
}

fn caller(dir: &Path, cert: Option<&str>) -> ClientSecurity {
    ClientSecurity::load(
        &ClientSecurityFiles {
            tls_ca: Some(dir.join("ca.pem")),
            tls_cert: cert.map(|c| dir.join(format!("{c}.pem"))),
            tls_key: cert.map(|c| dir.join(format!("{c}.key"))),
            token_file: None,
        },
        Role::Client,
    )
    .unwrap()
}

/// Connects as `security`, sends a byte and waits for one back: fails once the server refuses
/// the handshake (in TLS 1.3 the client learns it at its first read).
async fn exchange(security: &ClientSecurity, addr: &str) -> std::io::Result<()> {
    let mut stream = security.connect_raw(addr).await?;
    stream.write_all(b"x").await?;
    let mut byte = [0u8; 1];
    stream.read_exact(&mut byte).await.map(|_| ())
}

#[tokio::test]
async fn certificates_identify_callers_and_strangers_are_refused() {
    let ours = tempfile::tempdir().unwrap();
    let theirs = tempfile::tempdir().unwrap();
    make(ours.path());
    make(theirs.path());
    // A worker's port: raw fetch streams are served by workers alone.
    let security = server(ours.path(), "worker");
    assert!(security.is_tls() && security.is_authenticated());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let tls = security.tls_config(ClientCerts::Required).unwrap();
    // The listener accepts as its stream is polled, as a server's accept loop does, whatever
    // the test is waiting on.
    let (accepted_tx, mut connections) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut incoming = Box::pin(incoming(listener, tls));
        while let Some(connection) = incoming.next().await {
            if accepted_tx.send(connection).is_err() {
                return;
            }
        }
    });

    // A worker's certificate under our CA: accepted, and named.
    let mut stream = caller(ours.path(), Some("worker"))
        .connect_raw(&addr)
        .await
        .unwrap();
    stream.write_all(b"ping").await.unwrap();
    let mut accepted = tokio::time::timeout(Duration::from_secs(10), connections.recv())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        accepted.info().cert_identity,
        Some(Identity::new(Role::Worker, "worker"))
    );
    let mut got = [0u8; 4];
    accepted.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");

    // Another CA's certificate: the caller's handshake fails (the server does not trust it).
    let stranger = caller(theirs.path(), Some("worker"));
    assert!(
        exchange(&stranger, &addr).await.is_err(),
        "a certificate from another CA was accepted"
    );

    // Without a client certificate on a listener that requires one: refused as well.
    let anonymous = caller(ours.path(), None);
    assert!(
        exchange(&anonymous, &addr).await.is_err(),
        "a caller without a certificate was accepted"
    );
}

#[test]
fn callers_present_the_token_of_their_role() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path());
    let security = server(dir.path(), "dispatcher");
    let authenticator = security.authenticator();
    let peer = security.caller(Role::Peer).unwrap();
    let token = peer.token().unwrap().expose().as_bytes().to_vec();
    assert_eq!(
        authenticator.authenticate(Some(&token), None),
        Ok(Identity::new(Role::Peer, "dispatcher"))
    );
}

#[tokio::test]
async fn a_raw_stream_is_refused_by_its_caller_when_the_server_is_not_a_worker() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let tls = server(dir.path(), "dispatcher")
        .tls_config(ClientCerts::Optional)
        .unwrap();
    tokio::spawn(async move {
        let mut incoming = Box::pin(incoming(listener, tls));
        // Held, so that the connections stay open while the caller decides.
        let mut accepted = Vec::new();
        while let Some(connection) = incoming.next().await {
            accepted.push(connection);
        }
    });
    let error = match caller(dir.path(), None).connect_raw(&addr).await {
        Ok(_) => panic!("a raw stream to the dispatcher's certificate was opened"),
        Err(e) => e,
    };
    let why = sluice_security::permanent_failure(&error).expect("a permanent failure");
    assert!(
        why.contains("presents the certificate of peer 'dispatcher'")
            && why.contains("not a worker's"),
        "{why}"
    );
}
