use super::*;
use crate::dataset::{Dataset, Transform};
use crate::parser::parse;

/// A lines source whose expansion is already recorded, as in a registered definition.
fn files_def(num_files: usize, ops: &str) -> pb::DatasetDef {
    let mut def = parse(&format!("files(\"data/*.txt\").lines(){ops}"))
        .expect("valid expression")
        .into_def();
    if let Some(SourceKind::Files(fs)) = def.source.as_mut().and_then(|s| s.kind.as_mut()) {
        fs.files = (0..num_files).map(|i| format!("/data/f{i}.txt")).collect();
    }
    def
}

fn files_of(def: &pb::DatasetDef) -> Vec<String> {
    match def.source.as_ref().and_then(|s| s.kind.as_ref()) {
        Some(SourceKind::Files(fs)) => fs.files.clone(),
        _ => panic!("not a files source: {}", render_def(def)),
    }
}

fn names(idx: &[usize]) -> Vec<String> {
    idx.iter().map(|i| format!("/data/f{i}.txt")).collect()
}

fn expr(s: &str) -> pb::DatasetDef {
    parse(s).expect("valid expression").into_def()
}

fn not_enough(k: u64, n: u64) -> String {
    format!(
        "Could not apply FILE based sharding: the dataset only has {k} file(s), which is not \
         enough for the required {n} shards/workers. Consider setting the sharding policy to \
         either DATA or OFF, or split your input files into a larger number of small files such \
         that number of files is greater than number of shards/workers."
    )
}

#[test]
fn file_policy_keeps_every_nth_file() {
    use AutoShardPolicy::{Auto, File};
    #[rustfmt::skip]
    let cases: Vec<(AutoShardPolicy, usize, u64, u64, Vec<usize>)> = vec![
        // policy, files, shards, index, files kept
        (File, 10, 5, 3, vec![3, 8]),
        (File, 10, 5, 0, vec![0, 5]),
        (File, 5, 5, 4, vec![4]),          // as many files as shards
        (File, 7, 3, 0, vec![0, 3, 6]),    // more files than shards, uneven
        (File, 7, 3, 2, vec![2, 5]),
        (File, 3, 1, 0, vec![0, 1, 2]),
        (Auto, 10, 5, 3, vec![3, 8]),      // AUTO on files is FILE
        (Auto, 3, 3, 1, vec![1]),
    ];
    for (policy, num_files, n, i, kept) in cases {
        let def = files_def(num_files, ".map(identity).batch(2)");
        let out = auto_shard(&def, policy, n, i).expect("shardable");
        assert_eq!(
            files_of(&out),
            names(&kept),
            "{policy:?} {num_files} files, {i}/{n}"
        );
        // Only the file list changes: the ops are untouched, no shard op is added.
        assert_eq!(out.ops, def.ops, "{policy:?} {num_files} files, {i}/{n}");
    }
}

#[test]
fn file_shards_cover_every_file_exactly_once() {
    for (num_files, n) in [(10usize, 5u64), (7, 3), (4, 4), (9, 2)] {
        let def = files_def(num_files, "");
        let mut all: Vec<String> = (0..n)
            .flat_map(|i| files_of(&auto_shard(&def, AutoShardPolicy::File, n, i).unwrap()))
            .collect();
        all.sort();
        let mut expected = names(&(0..num_files).collect::<Vec<_>>());
        expected.sort();
        assert_eq!(all, expected, "{num_files} files over {n} shards");
    }
}

#[test]
fn fewer_files_than_shards_is_tf_datas_error_under_file_and_auto() {
    for policy in [AutoShardPolicy::File, AutoShardPolicy::Auto] {
        for i in 0..5 {
            let err = auto_shard(&files_def(4, ""), policy, 5, i).unwrap_err();
            assert_eq!(
                err,
                DatasetError::InvalidArgument(not_enough(4, 5)),
                "{policy:?}"
            );
            assert!(err
                .to_string()
                .contains("not enough for the required 5 shards/workers."));
        }
    }
    let err = auto_shard(&files_def(1, ""), AutoShardPolicy::File, 2, 0).unwrap_err();
    assert_eq!(err.to_string(), not_enough(1, 2));
}

#[test]
fn file_policy_on_a_non_file_source_is_unshardable() {
    #[rustfmt::skip]
    let cases = [
        ("range(20)", "Found an unshardable source dataset: range(20)"),
        ("range(0, 20, 3).map(square)", "Found an unshardable source dataset: range(0, 20, 3)"),
        ("from_slices([1, 2, 3]).batch(2)", "Found an unshardable source dataset: from_slices([1, 2, 3])"),
    ];
    for (e, message) in cases {
        let err = auto_shard(&expr(e), AutoShardPolicy::File, 3, 1).unwrap_err();
        assert!(matches!(err, DatasetError::UnshardableSource(_)), "{e}");
        assert_eq!(err.to_string(), message);
    }
    // As in tf.data, one shard needs no rewrite, so FILE is then no error.
    let def = expr("range(20)");
    assert_eq!(auto_shard(&def, AutoShardPolicy::File, 1, 0), Ok(def));
}

#[test]
fn data_auto_hint_and_off_rewrite_the_ops() {
    use AutoShardPolicy::{Auto, Data, File, Hint, Off};
    #[rustfmt::skip]
    let cases: Vec<(&str, AutoShardPolicy, u64, u64, &str)> = vec![
        // DATA: shard at the end, before trailing prefetches.
        ("range(20)", Data, 5, 1, "range(20).shard(5, 1)"),
        ("range(20).map(square).batch(3)", Data, 2, 0, "range(20).map(square).batch(3).shard(2, 0)"),
        ("range(20).prefetch(2).batch(3).prefetch(1).prefetch(4)", Data, 3, 2,
         "range(20).prefetch(2).batch(3).shard(3, 2).prefetch(1).prefetch(4)"),
        ("range(20)", Data, 1, 0, "range(20).shard(1, 0)"),
        // AUTO falls back to DATA when the source is not files.
        ("range(20)", Auto, 5, 1, "range(20).shard(5, 1)"),
        ("from_slices([1, 2]).filter(is_even)", Auto, 2, 1, "from_slices([1, 2]).filter(is_even).shard(2, 1)"),
        // HINT: every placeholder, nothing else.
        ("range(20).shard(SHARD_HINT, SHARD_HINT)", Hint, 5, 1, "range(20).shard(5, 1)"),
        ("range(20).shard(SHARD_HINT, SHARD_HINT).batch(2).shard(SHARD_HINT, SHARD_HINT)", Hint, 3, 2,
         "range(20).shard(3, 2).batch(2).shard(3, 2)"),
        ("range(20).shard(SHARD_HINT, 4)", Hint, 5, 1, "range(20).shard(5, 1)"),
        ("range(20).shard(1, 0)", Hint, 5, 1, "range(20).shard(1, 0)"),
        ("range(20)", Hint, 5, 1, "range(20)"),
        // A placeholder under another policy stays (execution refuses it).
        ("range(20).shard(SHARD_HINT, SHARD_HINT)", Data, 2, 1,
         "range(20).shard(SHARD_HINT, SHARD_HINT).shard(2, 1)"),
        ("range(20).shard(SHARD_HINT, SHARD_HINT)", Off, 2, 1, "range(20).shard(SHARD_HINT, SHARD_HINT)"),
        // OFF: unchanged, whatever the source.
        ("range(20).batch(2)", Off, 4, 3, "range(20).batch(2)"),
        ("files(\"data/*.txt\").lines()", Off, 4, 3, "files(\"data/*.txt\").lines()"),
        // FILE with one shard: unchanged.
        ("range(20).shard(SHARD_HINT, SHARD_HINT)", File, 1, 0, "range(20).shard(SHARD_HINT, SHARD_HINT)"),
    ];
    for (input, policy, n, i, expected) in cases {
        let out = auto_shard(&expr(input), policy, n, i)
            .unwrap_or_else(|e| panic!("{input} {policy:?}: {e}"));
        assert_eq!(render_def(&out), expected, "{input} {policy:?} {i}/{n}");
    }
}

#[test]
fn data_sharding_is_applied_to_files_too() {
    let def = files_def(2, ".batch(2)");
    let out = auto_shard(&def, AutoShardPolicy::Data, 5, 3).unwrap();
    assert_eq!(files_of(&out), names(&[0, 1]));
    assert_eq!(
        render_def(&out),
        "files(\"data/*.txt\").lines().batch(2).shard(5, 3)"
    );
    let out = auto_shard(&def, AutoShardPolicy::Hint, 5, 3).unwrap();
    assert_eq!(out, def);
}

#[test]
fn invalid_shard_numbers_are_refused() {
    let def = expr("range(10)");
    for policy in [
        AutoShardPolicy::Off,
        AutoShardPolicy::Auto,
        AutoShardPolicy::File,
        AutoShardPolicy::Data,
        AutoShardPolicy::Hint,
    ] {
        assert_eq!(
            auto_shard(&def, policy, 0, 0).unwrap_err().to_string(),
            "num_workers should be >= 1, currently 0"
        );
        assert_eq!(
            auto_shard(&def, policy, 3, 3).unwrap_err().to_string(),
            "index should be >= 0 and < 3, currently 3"
        );
    }
}

#[test]
fn a_generator_is_refused_by_every_sharding_policy_but_off() {
    let mut ds = Dataset::range(1);
    ds = ds.py_function(pb::PyFunctionOp {
        kind: pb::PyFunctionKind::Generator as i32,
        pickled: b"g".to_vec(),
        name: "gen".into(),
        python_version: "3.11".into(),
        cloudpickle_version: "3".into(),
        num_parallel_calls: 0,
        output_spec: None,
    });
    let def = ds.into_def();
    assert!(auto_shard(&def, AutoShardPolicy::Off, 2, 0).is_ok());
    for policy in [
        AutoShardPolicy::File,
        AutoShardPolicy::Data,
        AutoShardPolicy::Auto,
        AutoShardPolicy::Hint,
    ] {
        let err = auto_shard(&def, policy, 2, 0).unwrap_err().to_string();
        assert!(
            err.contains("from_generator ('gen') cannot be split"),
            "{err}"
        );
    }
}

#[test]
fn the_hint_policy_resolves_placeholders_inside_templates_too() {
    let def = expr(
        "range(4).shard(SHARD_HINT, SHARD_HINT).interleave(range(6).shard(SHARD_HINT, \
         SHARD_HINT), cycle_length=2)",
    );
    let out = auto_shard(&def, AutoShardPolicy::Hint, 3, 1).unwrap();
    assert_eq!(
        render_def(&out),
        "range(4).shard(3, 1).interleave(range(6).shard(3, 1), cycle_length=2, block_length=1)"
    );
}
