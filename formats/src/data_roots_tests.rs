//! `DataRoots::check` as a table over one directory tree of files, symlinks, a directory and a
//! socket, and the startup checks of `DataRoots::new`.

use std::os::unix::net::UnixListener;

use super::*;

/// `base/{data,data2,outside}` with files, links in and out of `data`, a directory and a
/// socket in it. `base` is canonical (the temp dir may sit behind a symlink).
struct Tree {
    _dir: tempfile::TempDir,
    base: PathBuf,
    _socket: UnixListener,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        for sub in ["data/sub", "data/dir", "data2", "outside"] {
            std::fs::create_dir_all(base.join(sub)).unwrap();
        }
        for file in [
            "data/a.txt",
            "data/sub/b.txt",
            "data2/c.txt",
            "outside/secret.txt",
        ] {
            std::fs::write(base.join(file), "x\n").unwrap();
        }
        std::os::unix::fs::symlink(base.join("outside/secret.txt"), base.join("data/link_out"))
            .unwrap();
        std::os::unix::fs::symlink(base.join("data/a.txt"), base.join("data/link_in")).unwrap();
        std::os::unix::fs::symlink(base.join("outside"), base.join("data/dir_out")).unwrap();
        let socket = UnixListener::bind(base.join("data/sock")).unwrap();
        Tree {
            _dir: dir,
            base,
            _socket: socket,
        }
    }

    fn path(&self, rel: &str) -> String {
        self.base.join(rel).to_string_lossy().into_owned()
    }

    fn roots(&self, rels: &[&str]) -> DataRoots {
        DataRoots::new(rels.iter().map(|r| self.base.join(r))).unwrap()
    }
}

#[derive(Debug)]
enum Want {
    /// Allowed, as this canonical path (relative to the tree's base).
    Allowed(&'static str),
    /// Refused; the message contains this text (with `{base}` replaced by the base).
    Refused(&'static str),
    /// Below a root but unreadable: an I/O error naming the path.
    Io,
}

#[test]
fn paths_are_checked_canonically_against_the_roots() {
    let tree = Tree::new();
    let data = ["data"];
    let rows: Vec<(&str, &[&str], Want)> = vec![
        ("data/a.txt", &data, Want::Allowed("data/a.txt")),
        ("data/sub/b.txt", &data, Want::Allowed("data/sub/b.txt")),
        ("data/sub/../a.txt", &data, Want::Allowed("data/a.txt")),
        (
            "outside/secret.txt",
            &data,
            Want::Refused("outside the data roots ({base}/data)"),
        ),
        (
            "data/../outside/secret.txt",
            &data,
            Want::Refused("outside the data roots ({base}/data)"),
        ),
        (
            "data/link_out",
            &data,
            Want::Refused("outside the data roots ({base}/data)"),
        ),
        (
            "data/dir_out/secret.txt",
            &data,
            Want::Refused("outside the data roots ({base}/data)"),
        ),
        ("data/link_in", &data, Want::Allowed("data/a.txt")),
        // A string prefix is not a parent directory.
        (
            "data2/c.txt",
            &data,
            Want::Refused("outside the data roots ({base}/data)"),
        ),
        (
            "data2/c.txt",
            &["data", "data2"],
            Want::Allowed("data2/c.txt"),
        ),
        ("data/dir", &data, Want::Refused("it is not a regular file")),
        (
            "data/sock",
            &data,
            Want::Refused("it is not a regular file"),
        ),
        ("data/missing.txt", &data, Want::Io),
        // Outside the roots, a missing file looks like any other: no probing for existence.
        (
            "outside/missing.txt",
            &data,
            Want::Refused("outside the data roots"),
        ),
        (
            "data/a.txt",
            &[],
            Want::Refused("this server has no data roots"),
        ),
        // The root itself is below itself, but it is a directory.
        ("data", &data, Want::Refused("it is not a regular file")),
    ];
    let base = tree.base.display().to_string();
    for (rel, roots, want) in rows {
        let path = tree.path(rel);
        let got = tree.roots(roots).check(&path);
        let row = format!("{rel} with roots {roots:?}: want {want:?}, got {got:?}");
        match want {
            Want::Allowed(canonical) => assert_eq!(got, Ok(tree.base.join(canonical)), "{row}"),
            Want::Refused(text) => {
                let Err(DatasetError::FileRefused {
                    path: named,
                    reason,
                }) = &got
                else {
                    panic!("{row}");
                };
                assert_eq!(named, &path, "{row}");
                assert!(reason.contains(&text.replace("{base}", &base)), "{row}");
            }
            Want::Io => {
                let Err(DatasetError::Io { path: named, .. }) = &got else {
                    panic!("{row}");
                };
                assert_eq!(named, &path, "{row}");
            }
        }
    }
}

/// A client probing for files outside the roots learns nothing: a file that exists and one that
/// does not (reached directly, through `..`, or through a link in a root) are refused in the
/// same words, which name only the path as given and the roots; `/proc/self` does not give the
/// server's PID away.
#[test]
fn refusals_outside_the_roots_say_the_same_whether_or_not_the_file_exists() {
    let tree = Tree::new();
    let roots = tree.roots(&["data"]);
    let outside = format!("outside the data roots ({}/data)", tree.base.display());
    std::os::unix::fs::symlink(
        tree.base.join("outside/missing.txt"),
        tree.base.join("data/link_nowhere"),
    )
    .unwrap();
    let probes = [
        tree.path("outside/secret.txt"),
        tree.path("outside/missing.txt"),
        tree.path("data/../outside/secret.txt"),
        tree.path("data/../outside/missing.txt"),
        tree.path("data/../../../../../../etc/shadow"),
        tree.path("data/../../../../../../etc/no-such-file"),
        tree.path("data/link_out"),
        tree.path("data/dir_out/secret.txt"),
        tree.path("data/dir_out/missing.txt"),
        tree.path("data/link_nowhere"),
        tree.path("data/dir_out/../outside/secret.txt"),
        tree.path("data/dir_out/../outside/missing.txt"),
        tree.path("data/no-dir/../../outside/secret.txt"),
        "/proc/self/environ".to_string(),
        "/proc/self/no-such-file".to_string(),
        "/etc/passwd".to_string(),
    ];
    for probe in probes {
        let got = roots.check(&probe);
        assert_eq!(
            got,
            Err(DatasetError::FileRefused {
                path: probe.clone(),
                reason: outside.clone(),
            }),
            "{probe}"
        );
    }
}

#[test]
fn special_files_are_refused_even_below_a_root() {
    let roots = DataRoots::new(["/dev"]).unwrap();
    let err = roots.check("/dev/zero").unwrap_err();
    assert_eq!(
        err.to_string(),
        "refused to read '/dev/zero': it is not a regular file"
    );
    let tree = Tree::new();
    let err = tree.roots(&["data"]).check("/dev/zero").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "refused to read '/dev/zero': outside the data roots ({}/data)",
            tree.base.display()
        )
    );
}

#[test]
fn no_roots_refuses_and_says_how_to_allow() {
    let err = DataRoots::none().check("/etc/passwd").unwrap_err();
    assert_eq!(
        err.to_string(),
        "refused to read '/etc/passwd': this server has no data roots, so it reads no files; \
         start it with --data-root DIR (data_roots=[...] in Python) to allow files below DIR, \
         or --data-root s3://BUCKET/PREFIX for objects below that prefix"
    );
}

#[test]
fn roots_are_canonical_and_must_be_existing_directories() {
    let tree = Tree::new();
    let roots = DataRoots::new([
        tree.base.join("data/sub/.."),
        tree.base.join("data"),
        tree.base.join("data2"),
    ])
    .unwrap();
    assert_eq!(
        roots.roots(),
        [tree.base.join("data"), tree.base.join("data2")]
    );
    assert_eq!(
        roots.to_string(),
        format!("{0}/data, {0}/data2", tree.base.display())
    );
    let missing = tree.base.join("nope");
    let err = DataRoots::new([&missing]).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "data root '{}' cannot be used: ",
            missing.display()
        )),
        "{err}"
    );
    let file = tree.base.join("data/a.txt");
    assert_eq!(
        DataRoots::new([&file]).unwrap_err().to_string(),
        format!("data root '{}' is not a directory", file.display())
    );
    assert!(DataRoots::new(Vec::<PathBuf>::new()).unwrap().is_empty());
}

#[test]
fn a_pattern_that_can_reach_no_root_is_refused_before_anything_is_listed() {
    let tree = Tree::new();
    let base = tree.base.display().to_string();
    let data = ["data"];
    // (pattern relative to the base unless absolute, roots, allowed)
    let rows: Vec<(&str, &[&str], bool)> = vec![
        ("data/*.txt", &data, true),
        ("data/sub/*.txt", &data, true),
        // Matches nothing, but below a root: expanding it says so.
        ("data/missing/*.txt", &data, true),
        // The literal directory contains the root: matches are checked one by one.
        ("*/*.txt", &data, true),
        ("/etc/pass*", &data, false),
        ("/etc/passwd", &data, false),
        ("data/../outside/*", &data, false),
        ("data2/*.txt", &data, false),
        ("data/dir_out/*", &data, false),
        ("missing/*.txt", &data, false),
        ("data/*.txt", &[], false),
    ];
    for (pattern, roots, allowed) in rows {
        let pattern = if pattern.starts_with('/') {
            pattern.to_string()
        } else {
            format!("{base}/{pattern}")
        };
        let got = tree.roots(roots).check_pattern(&pattern);
        let row = format!("{pattern} with roots {roots:?}: {got:?}");
        if allowed {
            assert_eq!(got, Ok(()), "{row}");
        } else {
            let Err(DatasetError::FileRefused { path, .. }) = &got else {
                panic!("{row}");
            };
            assert_eq!(path, &pattern, "{row}");
        }
    }
}

#[test]
fn a_match_outside_every_root_is_reported_as_the_patterns() {
    let tree = Tree::new();
    let roots = tree.roots(&["data"]);
    let pattern = format!("{}/*/*", tree.base.display());
    let err = roots
        .check_match(&pattern, &tree.path("outside/secret.txt"))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "refused to read '{pattern}': it matches files outside the data roots ({}/data)",
            tree.base.display()
        )
    );
    // A link inside a root is the operator's own: named, but not where it leads.
    let link = tree.path("data/link_out");
    let err = roots.check_match(&pattern, &link).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "refused to read '{link}': outside the data roots ({}/data)",
            tree.base.display()
        )
    );
    assert_eq!(
        roots.check_match(&pattern, &tree.path("data/a.txt")),
        Ok(tree.base.join("data/a.txt"))
    );
}

#[test]
fn a_file_to_write_must_be_below_a_root() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(base.join("data/cache")).unwrap();
    std::fs::create_dir_all(base.join("outside")).unwrap();
    std::os::unix::fs::symlink(base.join("outside"), base.join("data/escape")).unwrap();
    std::fs::write(base.join("outside/old.cache"), "x").unwrap();
    std::os::unix::fs::symlink(
        base.join("outside/old.cache"),
        base.join("data/cache/linked.cache"),
    )
    .unwrap();
    let roots = DataRoots::new(vec![base.join("data")]).unwrap();
    let s = |p: &str| base.join(p).to_str().unwrap().to_string();
    // A new file in a directory below the root: its canonical directory, its own name.
    assert_eq!(
        roots.check_writable(&s("data/cache/new.cache")).unwrap(),
        base.join("data/cache/new.cache")
    );
    for refused in [
        "outside/new.cache",
        "data/escape/new.cache",
        "data/cache/linked.cache",
        "data/../outside/new.cache",
    ] {
        let err = roots.check_writable(&s(refused)).unwrap_err();
        assert!(
            matches!(err, DatasetError::FileRefused { .. }),
            "{refused}: {err}"
        );
    }
    let none = DataRoots::new(Vec::<PathBuf>::new()).unwrap();
    assert!(none.check_writable(&s("data/cache/new.cache")).is_err());
}

#[test]
fn url_roots_allow_objects_at_or_below_them_by_whole_components() {
    let tree = Tree::new();
    let roots = DataRoots::new([
        tree.base.join("data"),
        PathBuf::from("s3://bucket/train"),
        PathBuf::from("gs://whole-bucket/"),
    ])
    .unwrap();
    assert_eq!(
        roots.url_roots(),
        [
            ObjectUrl::parse("s3://bucket/train").unwrap(),
            ObjectUrl::parse("gs://whole-bucket").unwrap()
        ]
    );
    let shown = format!(
        "{}, s3://bucket/train, gs://whole-bucket",
        tree.base.join("data").display()
    );
    assert_eq!(roots.to_string(), shown);
    for ok in [
        "s3://bucket/train/a.tfrecord",
        "s3://bucket/train/sub/b.tfrecord",
        "S3://bucket/train/c",
        "gs://whole-bucket/anything/at/all",
    ] {
        assert!(roots.check_url(ok).is_ok(), "{ok}");
    }
    for refused in [
        "s3://bucket/train2/a.tfrecord",
        "s3://bucket/a.tfrecord",
        "s3://other/train/a.tfrecord",
        "gs://bucket/train/a.tfrecord",
        "az://bucket/train/a.tfrecord",
    ] {
        assert_eq!(
            roots.check_url(refused).unwrap_err().to_string(),
            format!("refused to read '{refused}': outside the data roots ({shown})")
        );
    }
    // Not a way out, and not a prefix's other spelling either.
    let dotted = roots
        .check_url("s3://bucket/train/../secret")
        .unwrap_err()
        .to_string();
    assert!(dotted.starts_with("invalid object URL"), "{dotted}");
    // A URL is never a local path: a local check of it is refused, and a local root does not
    // allow it.
    let local_only = DataRoots::new([tree.base.join("data")]).unwrap();
    assert!(matches!(
        local_only.check_url("s3://bucket/train/a"),
        Err(DatasetError::FileRefused { .. })
    ));
}

#[test]
fn url_patterns_are_checked_by_their_literal_prefix_before_listing() {
    let roots = DataRoots::new(["s3://bucket/train"]).unwrap();
    for ok in [
        "s3://bucket/train/*.tfrecord",
        "s3://bucket/train/**/x-?.tfrecord",
        // Listing the bucket is allowed: each match is checked again.
        "s3://bucket/*/part-*",
    ] {
        assert!(roots.check_url_pattern(ok).is_ok(), "{ok}");
    }
    for refused in ["s3://bucket/train2/*", "s3://bucket/other/*", "s3://b2/*"] {
        assert!(
            matches!(
                roots.check_url_pattern(refused),
                Err(DatasetError::FileRefused { .. })
            ),
            "{refused}"
        );
    }
    // A match outside the roots is reported as the pattern's.
    assert_eq!(
        roots
            .check_url_match("s3://bucket/*/part-*", "s3://bucket/secret/part-0")
            .unwrap_err()
            .to_string(),
        "refused to read 's3://bucket/*/part-*': it matches objects outside the data roots \
         (s3://bucket/train)"
    );
}

#[test]
fn malformed_url_roots_are_refused_at_startup() {
    for (root, why) in [
        ("s3://", "names no bucket"),
        ("s3://bucket/a/*", "a root is a prefix, not a pattern"),
        ("s3://key:secret@bucket/a", "may not carry"),
    ] {
        let err = DataRoots::new([root]).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("data root '{root}' cannot be used")) && err.contains(why),
            "{root}: {err}"
        );
    }
}
