//! The Kubernetes manifests in `deploy/kubernetes/` agree with the binary they run: every flag a
//! container passes to `sluice dispatcher` or `sluice worker` is one that `--help` of the built
//! binary lists, every `SLUICE_*` variable they set is one the binary reads, and every file a
//! kustomization names exists. (Their schema is checked by `scripts/test deploy`.)
//!
//! The manifests are read line by line, not parsed as YAML: a container's `args` list starts
//! with the subcommand on a line of its own (`- dispatcher`) and has one `- --flag=value` per
//! line, and the test fails if a manifest runs the binary and no flag of it was found.

use crate::*;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Flags the manifests pass before the binary has them: each is tolerated while `--help` does
/// not list it, and checked like any other once it does. Only this one.
const NOT_YET_IN_CLI: &[&str] = &["--metrics-listen"];

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

/// Every `.yaml` file under `deploy/kubernetes`, recursively, sorted.
fn manifests() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read deploy dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&deploy_dir(), &mut out);
    out.sort();
    assert!(
        !out.is_empty(),
        "no manifests in {}",
        deploy_dir().display()
    );
    out
}

/// The long flags `sluice <subcommand> --help` lists.
fn flags_of(subcommand: &str) -> BTreeSet<String> {
    let (ok, out, err) = sluice(&[subcommand, "--help"]);
    assert!(ok, "sluice {subcommand} --help failed: {err}");
    long_flags(&out)
}

/// The `--name` tokens of a text.
fn long_flags(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("--") {
        let tail = &rest[at + 2..];
        let name: String = tail
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name.starts_with(|c: char| c.is_ascii_lowercase()) {
            flags.insert(format!("--{name}"));
        }
        rest = &tail[name.len()..];
    }
    flags
}

/// The `SLUICE_*` names of a text.
fn env_names(text: &str) -> BTreeSet<String> {
    text.match_indices("SLUICE_")
        .map(|(at, _)| {
            text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect()
        })
        .collect()
}

/// `(subcommand, flag)` for each flag in a manifest's container args.
fn passed_flags(text: &str) -> Vec<(String, String)> {
    let mut subcommand: Option<String> = None;
    let mut passed = Vec::new();
    for line in text.lines() {
        let item = line.trim_start().strip_prefix("- ").map(str::trim);
        match item {
            Some(word @ ("dispatcher" | "worker")) => subcommand = Some(word.to_string()),
            Some(arg) if arg.starts_with("--") => {
                let sub = subcommand
                    .clone()
                    .unwrap_or_else(|| panic!("{arg:?} before any subcommand"));
                let flag = arg.split('=').next().expect("split yields one part");
                passed.push((sub, flag.to_string()));
            }
            Some(_) => {}
            // The args list ends at the first line that is not an item.
            None => subcommand = None,
        }
    }
    passed
}

#[test]
fn every_flag_the_manifests_pass_is_one_the_binary_takes() {
    let known = [
        ("dispatcher".to_string(), flags_of("dispatcher")),
        ("worker".to_string(), flags_of("worker")),
    ];
    let mut checked = BTreeSet::new();
    let mut unknown = Vec::new();
    for path in manifests() {
        let text = std::fs::read_to_string(&path).expect("read manifest");
        for (sub, flag) in passed_flags(&text) {
            let takes = known
                .iter()
                .find(|(name, _)| *name == sub)
                .is_some_and(|(_, flags)| flags.contains(&flag));
            let tolerated = NOT_YET_IN_CLI.contains(&flag.as_str());
            if !takes && !tolerated {
                unknown.push(format!("{}: sluice {sub} {flag}", path.display()));
            }
            checked.insert(sub);
        }
    }
    assert!(
        unknown.is_empty(),
        "flags the binary does not take: {unknown:#?}"
    );
    assert_eq!(
        checked.into_iter().collect::<Vec<_>>(),
        ["dispatcher", "worker"],
        "the manifests run both servers"
    );
}

#[test]
fn every_sluice_variable_the_manifests_set_is_one_the_binary_reads() {
    let help = format!(
        "{}{}",
        sluice(&["dispatcher", "--help"]).1,
        sluice(&["worker", "--help"]).1
    );
    let read = env_names(&help);
    for path in manifests() {
        let text = std::fs::read_to_string(&path).expect("read manifest");
        for name in env_names(&text) {
            assert!(
                read.contains(&name),
                "{}: {name} is not read by the binary (it reads {read:?})",
                path.display()
            );
        }
    }
    assert!(read.contains("SLUICE_INIT") && read.contains("SLUICE_JOIN"));
}

#[test]
fn every_file_a_kustomization_names_exists() {
    for path in manifests()
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "kustomization.yaml"))
    {
        let text = std::fs::read_to_string(&path).expect("read kustomization");
        let dir = path.parent().expect("a file has a parent");
        let mut in_resources = false;
        let mut named = 0;
        for line in text.lines() {
            if !line.starts_with(' ') && !line.starts_with('-') {
                in_resources = line.trim_end() == "resources:";
                continue;
            }
            if let Some(file) = line.trim().strip_prefix("- ").filter(|_| in_resources) {
                assert!(
                    dir.join(file).exists(),
                    "{} names {file}, which does not exist",
                    path.display()
                );
                named += 1;
            }
        }
        assert!(named > 0, "{} names no resources", path.display());
    }
}

#[test]
fn the_manifest_readers_find_flags_variables_and_items() {
    let text = "args:\n  - dispatcher\n  - --id=from-hostname\n  - --peers=1=a:1\nenv:\n  - name: X\n    value: --not-a-flag\n  - worker\n  - --listen=0.0.0.0:6000\n";
    assert_eq!(
        passed_flags(text),
        [
            ("dispatcher".to_string(), "--id".to_string()),
            ("dispatcher".to_string(), "--peers".to_string()),
            ("worker".to_string(), "--listen".to_string()),
        ]
    );
    assert_eq!(
        long_flags("  --id <N>\n  -h, --help  [env: SLUICE_INIT=]\n --x-y"),
        BTreeSet::from(["--id".into(), "--help".into(), "--x-y".into()])
    );
    assert_eq!(
        env_names("SLUICE_INIT: \"true\" and $SLUICE_AUTH_TOKEN_FILE."),
        BTreeSet::from(["SLUICE_INIT".into(), "SLUICE_AUTH_TOKEN_FILE".into()])
    );
}

#[test]
fn sluice_init_and_join_in_the_environment_act_as_the_flags() {
    let tmp = tempfile::tempdir().expect("temp dir");
    for (var, value, starts) in [
        ("SLUICE_INIT", "true", true),
        ("SLUICE_JOIN", "true", true),
        ("SLUICE_INIT", "false", false),
        ("SLUICE_JOIN", "", false),
    ] {
        let data_dir = tmp.path().join(format!("{var}-{value}"));
        let mut child = Command::new(bin())
            .args(["dispatcher", "--data-dir"])
            .arg(&data_dir)
            .env(var, value)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice dispatcher");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let first = BufReader::new(stdout).lines().next();
            let _ = tx.send(first.and_then(Result::ok));
        });
        let first_line = rx
            .recv_timeout(STARTUP)
            .expect("first line or exit in time");
        let _ = child.kill();
        let output = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&output.stderr);
        match starts {
            true => assert!(
                first_line
                    .as_deref()
                    .is_some_and(|l| l.starts_with("READY dispatcher ")),
                "{var}={value}: {first_line:?} {stderr}"
            ),
            false => {
                assert_eq!(first_line, None, "{var}={value} started");
                assert!(
                    stderr.contains("holds no journal"),
                    "{var}={value}: {stderr}"
                );
                assert!(!data_dir.exists(), "{var}={value} made the data dir");
            }
        }
    }
}
