//! Tests of glob expansion with and without data roots, and its limit.

use sluice_pipeline::Dataset;

use super::*;
use crate::rooted::Rooted;
use crate::DataRoots;

#[test]
fn expansion_is_sorted_and_skips_directories() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["b.txt", "a.txt", "c.csv"] {
        std::fs::write(dir.path().join(name), "x\n").unwrap();
    }
    std::fs::create_dir(dir.path().join("d.txt")).unwrap();
    let pattern = format!("{}/*.txt", dir.path().display());
    let mut def = Dataset::files(&pattern).lines().into_def();
    expand_files(&mut def, &FileAccess::Unrestricted).unwrap();
    let Some(pb::source::Kind::Files(fs)) = def.source.unwrap().kind else {
        panic!("files source")
    };
    let names: Vec<_> = fs
        .files
        .iter()
        .map(|f| f.rsplit('/').next().unwrap().to_string())
        .collect();
    assert_eq!(names, ["a.txt", "b.txt"]);
    assert!(fs
        .files
        .iter()
        .all(|f| std::path::Path::new(f).is_absolute()));
}

#[test]
fn expansion_errors() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = format!("{}/*.none", dir.path().display());
    let mut def = Dataset::files(&pattern).lines().into_def();
    assert_eq!(
        expand_files(&mut def, &FileAccess::Unrestricted)
            .unwrap_err()
            .to_string(),
        format!("no files match pattern '{pattern}'")
    );
    let mut def = Dataset::files("a/***/b").lines().into_def();
    assert!(expand_files(&mut def, &FileAccess::Unrestricted)
        .unwrap_err()
        .to_string()
        .starts_with("invalid file pattern 'a/***/b'"));
}

fn with_files(files: Vec<String>) -> pb::DatasetDef {
    let mut def = Dataset::files("ignored").lines().into_def();
    let Some(pb::source::Kind::Files(fs)) = def.source.as_mut().unwrap().kind.as_mut() else {
        panic!("files source")
    };
    fs.files = files;
    def
}

fn listed(def: &pb::DatasetDef) -> Vec<String> {
    let Some(pb::source::Kind::Files(fs)) = def.source.clone().unwrap().kind else {
        panic!("files source")
    };
    fs.files
}

#[test]
fn with_roots_a_pattern_stores_canonical_paths_and_refuses_the_first_match_outside() {
    let rooted = Rooted::new();
    let pattern = format!("{}/data/../data/*.txt", rooted.base.display());
    let mut def = Dataset::files(&pattern).lines().into_def();
    expand_files(&mut def, &rooted.access).unwrap();
    assert_eq!(
        listed(&def),
        [rooted.path("data/a.txt"), rooted.path("data/b.txt")]
    );

    std::os::unix::fs::symlink(
        rooted.base.join("outside/secret.txt"),
        rooted.base.join("data/c.txt"),
    )
    .unwrap();
    let mut def = Dataset::files(&pattern).lines().into_def();
    let err = expand_files(&mut def, &rooted.access).unwrap_err();
    assert!(
        matches!(&err, DatasetError::FileRefused { path, .. } if path.ends_with("/data/c.txt")),
        "{err}"
    );
    assert!(
        err.to_string().ends_with(": outside the data roots")
            || err.to_string().contains(": outside the data roots ("),
        "{err}"
    );
    assert!(!err.to_string().contains("secret"), "{err}");

    // A match outside the roots is named by the pattern, not by the file.
    std::fs::remove_file(rooted.base.join("data/c.txt")).unwrap();
    let outside = format!("{}/*/*.txt", rooted.base.display());
    let mut def = Dataset::files(&outside).lines().into_def();
    let err = expand_files(&mut def, &rooted.access).unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "refused to read '{outside}': it matches files outside the data roots"
        )),
        "{err}"
    );
    // A pattern that can reach no root is refused before anything is listed.
    let mut def = Dataset::files("/etc/pass*").lines().into_def();
    let err = expand_files(&mut def, &rooted.access).unwrap_err();
    assert!(
        matches!(&err, DatasetError::FileRefused { path, .. } if path == "/etc/pass*"),
        "{err}"
    );
    // A malformed pattern is still reported as malformed.
    let mut def = Dataset::files("a/***/b").lines().into_def();
    assert!(expand_files(&mut def, &rooted.access)
        .unwrap_err()
        .to_string()
        .starts_with("invalid file pattern 'a/***/b'"));
}

#[test]
fn with_roots_an_explicit_list_is_checked_and_canonicalized() {
    let rooted = Rooted::new();
    let mut def = with_files(vec![
        rooted.path("data/../data/b.txt"),
        rooted.path("data/a.txt"),
    ]);
    expand_files(&mut def, &rooted.access).unwrap();
    // The order given is kept: split i is file i.
    assert_eq!(
        listed(&def),
        [rooted.path("data/b.txt"), rooted.path("data/a.txt")]
    );
    for bad in [
        rooted.path("outside/secret.txt"),
        "/etc/passwd".to_string(),
        "/dev/zero".to_string(),
    ] {
        let mut def = with_files(vec![rooted.path("data/a.txt"), bad.clone()]);
        let before = def.clone();
        let err = expand_files(&mut def, &rooted.access).unwrap_err();
        assert!(
            matches!(&err, DatasetError::FileRefused { path, .. } if *path == bad),
            "{bad}: {err}"
        );
        assert_eq!(def, before, "a refused list changes nothing");
    }
    // Unrestricted (the user's own process): the list is kept as given.
    let mut def = with_files(vec!["/etc/passwd".into()]);
    expand_files(&mut def, &FileAccess::Unrestricted).unwrap();
    assert_eq!(listed(&def), ["/etc/passwd"]);
}

#[test]
fn too_many_listed_files_are_refused_naming_the_limit() {
    let mut def = with_files(vec!["a".into(); MAX_MATCHED_FILES + 1]);
    assert_eq!(
        expand_files(&mut def, &FileAccess::Unrestricted)
            .unwrap_err()
            .to_string(),
        format!(
            "the files source lists {} files; the limit is {MAX_MATCHED_FILES}",
            MAX_MATCHED_FILES + 1
        )
    );
}

#[test]
fn files_sources_of_nested_datasets_are_expanded_and_checked_against_the_roots() {
    use sluice_pipeline::Transform;
    let rooted = Rooted::new();
    let inside = format!("{}/data/*.txt", rooted.base.display());
    let a = Dataset::files(&rooted.path("data/a.txt")).lines();
    let mut def = Dataset::zip(vec![Dataset::range(3), Dataset::files(&inside).lines()])
        .concatenate(a.into_def())
        .into_def();
    expand_files(&mut def, &rooted.access).unwrap();
    let mut lists = Vec::new();
    sluice_pipeline::nested::walk(&def, |d, _| {
        if let Some(pb::source::Kind::Files(fs)) = d.source.as_ref().and_then(|s| s.kind.as_ref()) {
            lists.push(fs.files.clone());
        }
    });
    assert_eq!(
        lists,
        [
            vec![rooted.path("data/a.txt"), rooted.path("data/b.txt")],
            vec![rooted.path("data/a.txt")],
        ]
    );
    // A nested source outside the roots is refused like a top-level one.
    let secret = Dataset::files(&rooted.path("outside/secret.txt")).lines();
    let mut def = Dataset::choose_from_datasets(vec![secret], Dataset::range(1), true).into_def();
    let err = expand_files(&mut def, &rooted.access).unwrap_err();
    assert!(err.to_string().contains("outside the data roots"), "{err}");
}

#[test]
fn an_object_url_pattern_outside_the_roots_is_refused_before_listing() {
    // No store is configured or reachable here: a refusal must come before any request.
    let roots = DataRoots::new(["s3://bucket/train"]).unwrap();
    let access = FileAccess::Roots(roots);
    let mut def = Dataset::files("s3://bucket/other/*.tfrecord")
        .tfrecord()
        .into_def();
    assert_eq!(
        expand_files(&mut def, &access).unwrap_err().to_string(),
        "refused to read 's3://bucket/other/*.tfrecord': outside the data roots \
         (s3://bucket/train)"
    );
}

#[test]
fn listed_object_urls_are_checked_and_normalized_without_a_store() {
    let access = FileAccess::Roots(DataRoots::new(["s3://bucket/train"]).unwrap());
    let mut def = with_files(vec![
        "S3://bucket/train/a.tfrecord".into(),
        "s3://bucket/train/b.tfrecord/".into(),
    ]);
    expand_files(&mut def, &access).unwrap();
    assert_eq!(
        listed(&def),
        [
            "s3://bucket/train/a.tfrecord",
            "s3://bucket/train/b.tfrecord"
        ]
    );
    let mut outside = with_files(vec!["s3://bucket/secret".into()]);
    assert!(matches!(
        expand_files(&mut outside, &access),
        Err(DatasetError::FileRefused { .. })
    ));
    // Unrestricted, a URL is still parsed: a malformed one is an error naming it.
    let mut bad = with_files(vec!["s3://bucket/a/../b".into()]);
    let err = expand_files(&mut bad, &FileAccess::Unrestricted).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid object URL 's3://bucket/a/../b'"),
        "{err}"
    );
}

#[test]
fn an_invalid_key_pattern_is_reported_as_such() {
    let mut def = Dataset::files("s3://bucket/a/[x.tfrecord")
        .tfrecord()
        .into_def();
    let err = expand_files(&mut def, &FileAccess::Unrestricted).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid file pattern 's3://bucket/a/[x.tfrecord'"),
        "{err}"
    );
}
