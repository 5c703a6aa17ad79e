//! Security as an operator meets it: `sluice certs`, servers that refuse to listen beyond
//! loopback unprotected, and a dispatcher with TLS and tokens that tells callers without the
//! right credential what is wrong.

use crate::*;

/// `sluice certs` into a new temp dir, with workers "a" and "b".
pub fn certs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("certs");
    let (ok, _, err) = sluice(&[
        "certs",
        "--out",
        out.to_str().expect("utf-8"),
        "--worker",
        "a",
        "--worker",
        "b",
    ]);
    assert!(ok, "{err}");
    dir
}

/// A path under the certs dir, as a string.
pub fn cred(dir: &tempfile::TempDir, file: &str) -> String {
    dir.path()
        .join("certs")
        .join(file)
        .to_str()
        .expect("utf-8")
        .to_string()
}

/// The server flags of a dispatcher with TLS and the cluster's token file.
pub fn secure_dispatcher_flags(creds: &tempfile::TempDir) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        cred(creds, "dispatcher.pem"),
        "--tls-key".into(),
        cred(creds, "dispatcher.key"),
        "--tls-ca".into(),
        cred(creds, "ca.pem"),
        "--auth-token-file".into(),
        cred(creds, "tokens"),
    ]
}

#[test]
fn servers_refuse_to_listen_beyond_loopback_unprotected() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("d");
    let (ok, _, err) = run(
        bin(),
        &[
            "dispatcher",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            "0.0.0.0:0",
        ],
        Duration::from_secs(30),
    )
    .expect("ran");
    assert!(!ok);
    assert!(
        err.contains("refusing to serve the dispatcher client API on 0.0.0.0:")
            && err.contains("without TLS and authentication")
            && err.contains("--insecure"),
        "{err}"
    );
    let insecure = dispatcher(dir.path(), &["--listen", "0.0.0.0:0", "--insecure"]);
    assert!(insecure.addr.starts_with("0.0.0.0:"), "{}", insecure.addr);
}

#[test]
fn a_secure_dispatcher_names_what_a_caller_lacks() {
    let creds = certs();
    let dir = tempfile::tempdir().expect("temp dir");
    let flags = secure_dispatcher_flags(&creds);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = dispatcher(dir.path(), &flags);
    let addr = server.addr.as_str();
    let ca = cred(&creds, "ca.pem");
    let client_token = cred(&creds, "client.token");
    let admin_token = cred(&creds, "admin.token");

    // TLS, no credential.
    let (ok, _, err) = sluice(&["status", "--dispatcher", addr, "--tls-ca", &ca]);
    assert!(!ok);
    assert!(err.contains("no credentials"), "{err}");
    // A token file that is not the cluster's.
    let wrong = dir.path().join("wrong.token");
    std::fs::write(&wrong, "0123456789abcdef0123456789abcdef\n").expect("write");
    let (ok, _, err) = sluice(&[
        "status",
        "--dispatcher",
        addr,
        "--tls-ca",
        &ca,
        "--auth-token-file",
        wrong.to_str().expect("utf-8"),
    ]);
    assert!(!ok);
    assert!(err.contains("not valid on this server"), "{err}");
    // The client token reads the status; it may not change the quorum.
    let (ok, out, err) = sluice(&[
        "status",
        "--dispatcher",
        addr,
        "--tls-ca",
        &ca,
        "--auth-token-file",
        &client_token,
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("\"leader\""), "{out}");
    let (ok, _, err) = sluice(&[
        "admin",
        "remove-node",
        "--dispatcher",
        addr,
        "--id",
        "7",
        "--tls-ca",
        &ca,
        "--auth-token-file",
        &client_token,
    ]);
    assert!(!ok);
    assert!(
        err.contains("client 'client' may not call RemoveNode: it needs the admin role"),
        "{err}"
    );
    // The admin token gets past authorization (node 7 is no member, which is the answer).
    let (ok, _, err) = sluice(&[
        "admin",
        "remove-node",
        "--dispatcher",
        addr,
        "--id",
        "7",
        "--tls-ca",
        &ca,
        "--auth-token-file",
        &admin_token,
    ]);
    assert!(!err.contains("may not call"), "{ok} {err}");
    // A client certificate instead of a token.
    let (ok, _, err) = sluice(&[
        "status",
        "--dispatcher",
        addr,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cred(&creds, "client.pem"),
        "--tls-key",
        &cred(&creds, "client.key"),
    ]);
    assert!(ok, "{err}");
    // Plain TCP to a TLS server fails instead of hanging.
    let (ok, _, err) = sluice(&["status", "--dispatcher", addr]);
    assert!(!ok, "{err}");
}
