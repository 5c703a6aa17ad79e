//! Data roots through the real binary: `files()` reads only below `--data-root`, on the
//! dispatcher at registration and again on each worker before it opens a file; no root refuses
//! every file; a root that is missing or not a directory stops the server at startup.

use crate::*;
use std::path::{Path, PathBuf};

/// A temp dir with `root/a.txt`, `other/` (an empty second root) and `outside/secret.txt`,
/// linked from `root/link.txt`. Paths canonical, so messages can be compared.
struct Files {
    dir: tempfile::TempDir,
    base: PathBuf,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = std::fs::canonicalize(dir.path()).expect("canonical temp dir");
        for sub in ["root", "other", "outside"] {
            std::fs::create_dir(base.join(sub)).expect("create dir");
        }
        std::fs::write(base.join("root/a.txt"), "one\ntwo\n").expect("write");
        std::fs::write(base.join("outside/secret.txt"), "secret\n").expect("write");
        std::os::unix::fs::symlink(base.join("outside/secret.txt"), base.join("root/link.txt"))
            .expect("symlink");
        Files { dir, base }
    }

    fn path(&self, rel: &str) -> String {
        self.base.join(rel).to_str().expect("utf-8").to_string()
    }

    /// A dispatcher with the given roots and one worker with `worker_roots`.
    fn cluster(&self, roots: &[&str], worker_roots: &[&str]) -> (SluiceProcess, SluiceProcess) {
        let flags = |roots: &[&str]| -> Vec<String> {
            roots
                .iter()
                .flat_map(|r| ["--data-root".to_string(), self.path(r)])
                .collect()
        };
        let dispatcher_flags = flags(roots);
        let dispatcher_args: Vec<&str> = dispatcher_flags.iter().map(String::as_str).collect();
        let dispatcher = dispatcher(self.dir.path(), &dispatcher_args);
        let worker_flags = flags(worker_roots);
        let worker_args: Vec<&str> = worker_flags.iter().map(String::as_str).collect();
        let worker = workers_with(&dispatcher.addr, 1, &worker_args)
            .pop()
            .expect("one worker");
        (dispatcher, worker)
    }
}

/// `sluice read` of `dataset` from the dispatcher at `addr`: (success, stdout, stderr).
fn read(addr: &str, dataset: &str) -> (bool, String, String) {
    sluice(&["read", "--dispatcher", addr, "--dataset", dataset])
}

fn refused(addr: &str, dataset: &str) -> String {
    let (ok, out, err) = read(addr, dataset);
    assert!(!ok, "{dataset} was read: {out}");
    assert!(out.is_empty(), "printed {out:?}");
    let err = err.trim_end();
    assert!(!err.contains('\n'), "more than one line: {err:?}");
    err.to_string()
}

#[test]
fn files_below_the_roots_read_and_files_outside_them_are_refused_naming_path_and_root() {
    let files = Files::new();
    let (dispatcher, _worker) = files.cluster(&["root"], &["root"]);
    let addr = dispatcher.addr.as_str();
    let root = files.path("root");

    let (ok, out, err) = read(addr, &format!("files(\"{root}/*.txt\").lines()"));
    // `*.txt` matches the link too: refused, naming it but not where it leads.
    assert!(!ok, "{out}");
    assert!(
        err.contains(&format!(
            "refused to read '{root}/link.txt': outside the data roots ({root})"
        )),
        "{err}"
    );

    let (ok, out, err) = read(addr, &format!("files(\"{root}/a.txt\").lines()"));
    assert!(ok, "{err}");
    assert_eq!(json_lines(&out), ["one", "two"]);

    let err = refused(addr, "files(\"/etc/pass*\").lines()");
    assert!(
        err.contains(&format!(
            "refused to read '/etc/passwd': outside the data roots ({root})"
        )),
        "{err}"
    );
    let err = refused(addr, "files(\"/dev/zero\").lines()");
    assert!(
        err.contains("refused to read '/dev/zero': outside the data roots"),
        "{err}"
    );
    let err = refused(
        addr,
        &format!("files(\"{root}/../outside/secret.txt\").lines()"),
    );
    assert!(
        err.contains(&format!(
            "'{root}/../outside/secret.txt': outside the data roots ({root})"
        )),
        "{err}"
    );
}

/// A client probing for files outside a dispatcher's roots learns nothing from the refusals: a
/// raw registration listing a file that exists and one listing a file that does not get the
/// same answer (but for the path sent), naming neither where a path resolves to nor the
/// server's PID. Raw, as an attacker sends it: `sluice read` expands a pattern in its own
/// process, against its own files.
#[test]
fn probes_of_existing_and_missing_files_outside_the_roots_get_the_same_answer() {
    let files = Files::new();
    let (dispatcher, _worker) = files.cluster(&["root"], &["root"]);
    let root = files.path("root");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let client = sluice_client::DispatcherClient::new(&dispatcher.addr).expect("a client");
    let listed = |path: &str| {
        let mut def = sluice_pipeline::Dataset::files("listed").lines().into_def();
        let Some(sluice_element::pb::source::Kind::Files(fs)) =
            def.source.as_mut().and_then(|s| s.kind.as_mut())
        else {
            panic!("a files source");
        };
        fs.files = vec![path.to_string()];
        def
    };
    let answer = |path: &str| -> String {
        let metadata = sluice_proto::dispatcher::DatasetMetadata::default();
        let refused = runtime
            .block_on(client.register_dataset_def(&listed(path), None, &metadata))
            .expect_err("registered a file outside the roots");
        refused.to_string().replace(path, "PATH")
    };
    let pairs = [
        (
            files.path("outside/secret.txt"),
            files.path("outside/missing.txt"),
        ),
        (
            format!("{root}/../outside/secret.txt"),
            format!("{root}/../outside/missing.txt"),
        ),
        (
            files.path("root/link.txt"),
            files.path("root/link-to-nothing.txt"),
        ),
        (
            format!("{root}/../../../../../../../etc/passwd"),
            format!("{root}/../../../../../../../etc/no-such-file"),
        ),
        (
            "/proc/self/environ".to_string(),
            "/proc/self/no-such-file".to_string(),
        ),
    ];
    std::os::unix::fs::symlink(
        files.path("outside/missing.txt"),
        files.path("root/link-to-nothing.txt"),
    )
    .expect("symlink");
    for (exists, missing) in pairs {
        let (a, b) = (answer(&exists), answer(&missing));
        assert_eq!(a, b, "{exists} and {missing}");
        assert!(
            a.contains(&format!(
                "refused to read 'PATH': outside the data roots ({root})"
            )),
            "{a}"
        );
        assert!(!a.contains("resolves") && !a.contains("/proc/"), "{a}");
    }
}

#[test]
fn a_dispatcher_without_roots_refuses_every_file_and_says_how_to_allow_them() {
    let files = Files::new();
    let (dispatcher, _worker) = files.cluster(&[], &["root"]);
    let a = files.path("root/a.txt");
    let err = refused(&dispatcher.addr, &format!("files(\"{a}\").lines()"));
    assert!(
        err.contains(&format!(
            "refused to read '{a}': this server has no data roots, so it reads no files; start \
             it with --data-root DIR"
        )),
        "{err}"
    );
}

#[test]
fn a_worker_checks_its_own_roots_before_opening_a_file() {
    let files = Files::new();
    // The dispatcher allows `root`; the worker only `other`.
    let (dispatcher, _worker) = files.cluster(&["root"], &["other"]);
    let a = files.path("root/a.txt");
    let err = refused(&dispatcher.addr, &format!("files(\"{a}\").lines()"));
    assert!(
        err.contains(&format!(
            "refused to read '{a}': outside the data roots ({})",
            files.path("other")
        )),
        "{err}"
    );
}

#[test]
fn a_missing_root_or_a_file_as_root_stops_the_server_at_startup() {
    let files = Files::new();
    let data_dir = files.path("journal");
    let missing = files.path("missing");
    let file = files.path("root/a.txt");
    for (root, why) in [(&missing, "cannot be used"), (&file, "is not a directory")] {
        let (ok, _, err) = run(
            bin(),
            &["dispatcher", "--data-dir", &data_dir, "--data-root", root],
            STARTUP,
        )
        .expect("sluice ran");
        assert!(!ok, "started with data root {root}");
        assert!(err.contains(&format!("data root '{root}' {why}")), "{err}");
        let (ok, _, err) = run(
            bin(),
            &["worker", "--dispatcher", "127.0.0.1:1", "--data-root", root],
            STARTUP,
        )
        .expect("sluice ran");
        assert!(!ok, "started with data root {root}");
        assert!(err.contains(&format!("data root '{root}' {why}")), "{err}");
    }
    assert!(
        !Path::new(&data_dir).exists(),
        "a refused start made a journal"
    );
}
