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

/// The flags of a worker named `name` (`sluice certs --worker NAME`): its certificate, the CA
/// and its token file.
fn worker_flags(creds: &tempfile::TempDir, name: &str) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        cred(creds, &format!("worker-{name}.pem")),
        "--tls-key".into(),
        cred(creds, &format!("worker-{name}.key")),
        "--tls-ca".into(),
        cred(creds, "ca.pem"),
        "--auth-token-file".into(),
        cred(creds, &format!("worker-{name}.tokens")),
    ]
}

/// `sluice <args>`, which must fail within `within` (a hang would cross it); its stderr.
fn fails_within(args: &[&str], within: Duration) -> String {
    let started = std::time::Instant::now();
    let (ok, out, err) = run(bin(), args, within).expect("sluice ran");
    assert!(!ok, "sluice {args:?} succeeded: {out}");
    assert!(
        started.elapsed() < within,
        "sluice {args:?} took {:?}",
        started.elapsed()
    );
    err
}

#[test]
fn a_server_with_a_worker_certificate_gets_no_credential_from_callers_of_the_dispatcher() {
    let creds = certs();
    let dir = tempfile::tempdir().expect("temp dir");
    // A dispatcher process serving with worker a's certificate, which the CA signed, and the
    // cluster's token file: it would accept the callers' tokens, had they been sent.
    let mut flags = secure_dispatcher_flags(&creds);
    flags[1] = cred(&creds, "worker-a.pem");
    flags[3] = cred(&creds, "worker-a.key");
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let impostor = dispatcher(dir.path(), &flags);
    let addr = impostor.addr.as_str();
    let ca = cred(&creds, "ca.pem");
    let client_token = cred(&creds, "client.token");
    let admin_token = cred(&creds, "admin.token");
    let refused = "presents the certificate of worker 'a' (organization 'worker'), not a \
                   dispatcher's (organization 'peer'): refusing to send it any credential";

    let read = [
        "read",
        "--dispatcher",
        addr,
        "--dataset",
        "range(10)",
        "--tls-ca",
        &ca,
        "--auth-token-file",
        &client_token,
    ];
    let err = fails_within(&read, Duration::from_secs(10));
    assert!(err.contains(refused), "{err}");
    let admin = [
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
    ];
    let err = fails_within(&admin, Duration::from_secs(10));
    assert!(err.contains(refused), "{err}");
    // A worker does not send its worker token there either.
    let worker = worker_flags(&creds, "b");
    let mut args = vec!["worker", "--dispatcher", addr, "--listen", "127.0.0.1:0"];
    args.extend(worker.iter().map(String::as_str));
    let err = fails_within(&args, Duration::from_secs(10));
    assert!(err.contains(refused), "{err}");
}

#[test]
fn a_reader_without_tls_against_a_tls_dispatcher_fails_in_seconds_naming_tls() {
    let creds = certs();
    let dir = tempfile::tempdir().expect("temp dir");
    let flags = secure_dispatcher_flags(&creds);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = dispatcher(dir.path(), &flags);
    let addr = server.addr.as_str();
    let client_token = cred(&creds, "client.token");
    let err = fails_within(
        &[
            "read",
            "--dispatcher",
            addr,
            "--dataset",
            "range(10)",
            "--auth-token-file",
            &client_token,
        ],
        Duration::from_secs(10),
    );
    assert!(
        err.contains(&format!("the server at {addr} speaks TLS")) && err.contains("--tls-ca"),
        "{err}"
    );
    // A worker without TLS does not start either, and says why.
    let err = fails_within(
        &[
            "worker",
            "--dispatcher",
            addr,
            "--listen",
            "127.0.0.1:0",
            "--auth-token-file",
            &cred(&creds, "worker-a.tokens"),
        ],
        Duration::from_secs(10),
    );
    assert!(err.contains("speaks TLS"), "{err}");
}

#[test]
fn a_tls_reader_against_a_plain_dispatcher_fails_in_seconds_naming_tls() {
    let creds = certs();
    let dir = tempfile::tempdir().expect("temp dir");
    let server = dispatcher(dir.path(), &[]);
    let addr = server.addr.as_str();
    let err = fails_within(
        &[
            "read",
            "--dispatcher",
            addr,
            "--dataset",
            "range(10)",
            "--tls-ca",
            &cred(&creds, "ca.pem"),
        ],
        Duration::from_secs(10),
    );
    assert!(err.contains("does not speak TLS"), "{err}");
}

#[test]
fn a_refused_token_or_certificate_fails_a_reader_in_seconds_naming_it() {
    let creds = certs();
    let other = certs();
    let dir = tempfile::tempdir().expect("temp dir");
    let flags = secure_dispatcher_flags(&creds);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = dispatcher(dir.path(), &flags);
    let addr = server.addr.as_str();
    let ca = cred(&creds, "ca.pem");
    let read = |extra: &[&str]| {
        let mut args = vec![
            "read",
            "--dispatcher",
            addr,
            "--dataset",
            "range(10)",
            "--tls-ca",
            &ca,
        ];
        args.extend_from_slice(extra);
        fails_within(&args, Duration::from_secs(10))
    };
    // Another cluster's client token.
    let err = read(&["--auth-token-file", &cred(&other, "client.token")]);
    assert!(err.contains("token") && err.contains("not valid"), "{err}");
    // Another cluster's client certificate.
    let err = read(&[
        "--tls-cert",
        &cred(&other, "client.pem"),
        "--tls-key",
        &cred(&other, "client.key"),
    ]);
    assert!(err.contains("refused this caller's certificate"), "{err}");
    // A worker's token, alone in a file, where a reader's is needed: the role is refused.
    let tokens = std::fs::read_to_string(cred(&creds, "worker-a.tokens")).expect("read");
    let worker_token = tokens
        .lines()
        .find_map(|l| l.strip_prefix("worker a "))
        .expect("worker a's line");
    let bare = dir.path().join("worker.token");
    std::fs::write(&bare, format!("{worker_token}\n")).expect("write");
    let err = read(&["--auth-token-file", bare.to_str().expect("utf-8")]);
    assert!(
        err.contains("worker 'a' may not call") && err.contains("needs the client role"),
        "{err}"
    );
}

#[test]
fn a_worker_cannot_take_the_address_of_another_while_it_is_down() {
    let creds = certs();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut flags = secure_dispatcher_flags(&creds);
    flags.extend(["--worker-timeout".to_string(), "1s".to_string()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = dispatcher(dir.path(), &flags);
    let addr = server.addr.as_str();
    let ca = cred(&creds, "ca.pem");
    let client_token = cred(&creds, "client.token");
    let workers_listed = || -> Vec<String> {
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
        let status: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
        let mut listed: Vec<String> = status["workers"]
            .as_array()
            .expect("workers")
            .iter()
            .map(|w| w["address"].as_str().unwrap_or_default().to_string())
            .collect();
        listed.sort();
        listed
    };
    let start = |name: &str, listen: &str, advertise: Option<&str>| {
        let mut args = vec![
            "worker".to_string(),
            "--dispatcher".into(),
            addr.to_string(),
            "--listen".into(),
            listen.to_string(),
        ];
        if let Some(advertise) = advertise {
            args.extend(["--advertise-address".to_string(), advertise.to_string()]);
        }
        args.extend(worker_flags(&creds, name));
        args
    };
    let spawn = |args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        SluiceProcess::spawn(bin(), &args, STARTUP).expect("worker started")
    };
    let _w1 = spawn(&start("a", "127.0.0.1:0", None));
    let mut w2 = spawn(&start("b", "127.0.0.1:0", None));
    let w2_addr = w2.addr.clone();

    // w2 stops; the dispatcher removes it after the worker timeout.
    w2.kill();
    sluice_tests::wait_until_blocking("w2 removed", Duration::from_secs(60), || {
        !workers_listed().contains(&w2_addr)
    })
    .expect("w2 removed");
    // w1's credential, heartbeating as w2's address, is refused: the address is still w2's.
    let squatter = start("a", "127.0.0.1:0", Some(&w2_addr));
    let squatter: Vec<&str> = squatter.iter().map(String::as_str).collect();
    let err = fails_within(&squatter, Duration::from_secs(30));
    assert!(
        err.contains(&format!(
            "may not act for worker {w2_addr}, registered by 'b'"
        )),
        "{err}"
    );
    assert!(!workers_listed().contains(&w2_addr));
    // w2 restarts at its address, w1 still up.
    let _w2 = spawn(&start("b", &w2_addr, None));
    assert_eq!(workers_listed().len(), 2);
    assert!(workers_listed().contains(&w2_addr));
}

#[test]
fn a_worker_registers_only_at_a_host_its_certificate_names() {
    let creds = certs();
    let dir = tempfile::tempdir().expect("temp dir");
    let flags = secure_dispatcher_flags(&creds);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = dispatcher(dir.path(), &flags);
    // Worker a's certificate names the loopback hosts only: 127.0.0.2 is not one of them.
    let mut args = vec![
        "worker",
        "--dispatcher",
        server.addr.as_str(),
        "--listen",
        "127.0.0.1:0",
        "--advertise-address",
        "127.0.0.2:%port%",
    ];
    let flags = worker_flags(&creds, "a");
    args.extend(flags.iter().map(String::as_str));
    let err = fails_within(&args, Duration::from_secs(30));
    assert!(
        err.contains("worker 'a' may not act for worker 127.0.0.2:")
            && err.contains(
                "its certificate names the hosts localhost, 127.0.0.1, ::1, not 127.0.0.2"
            ),
        "{err}"
    );
}
