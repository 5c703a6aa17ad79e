//! Pipelines rewritten by `auto_shard` (`sluice-pipeline`), run.

use sluice_element::{pb, DatasetError};
use sluice_formats::{expand_files, FileAccess};
use sluice_pipeline::{auto_shard, parse, AutoShardPolicy, Dataset, Transform};

use crate::executor::{iterate, ExecOptions};

fn expr(s: &str) -> pb::DatasetDef {
    parse(s).expect("valid expression").into_def()
}

fn run(def: &pb::DatasetDef) -> Result<Vec<i64>, DatasetError> {
    iterate(def, &ExecOptions::default())?
        .map(|r| r.map(|e| e.as_tensor().unwrap().to_i64s().unwrap()[0]))
        .collect()
}

#[test]
fn sharded_pipelines_run_and_partition_the_elements() {
    for policy in [AutoShardPolicy::Data, AutoShardPolicy::Auto] {
        let def = expr("range(20)");
        let out: Vec<Vec<i64>> = (0..5)
            .map(|i| run(&auto_shard(&def, policy, 5, i).unwrap()).unwrap())
            .collect();
        assert_eq!(out[1], vec![1, 6, 11, 16], "{policy:?}");
        assert_eq!(out[3], vec![3, 8, 13, 18], "{policy:?}");
        let mut all: Vec<i64> = out.concat();
        all.sort();
        assert_eq!(all, (0..20).collect::<Vec<_>>());
    }
    let hinted = Dataset::range(20).shard_hint().into_def();
    let out = auto_shard(&hinted, AutoShardPolicy::Hint, 5, 1).unwrap();
    assert_eq!(run(&out).unwrap(), vec![1, 6, 11, 16]);
}

#[test]
fn an_unresolved_placeholder_fails_when_executed() {
    let hinted = Dataset::range(20).shard_hint().into_def();
    for policy in [
        AutoShardPolicy::Off,
        AutoShardPolicy::Data,
        AutoShardPolicy::Auto,
    ] {
        let out = auto_shard(&hinted, policy, 5, 1).unwrap();
        let err = run(&out).unwrap_err();
        assert_eq!(err, DatasetError::UnresolvedShardHint, "{policy:?}");
        assert!(err.to_string().ends_with(
            "tf.data service with `tf.data.experimental.service.ShardingPolicy.HINT` processing mode."
        ));
    }
}

#[test]
fn file_sharding_of_real_files_reads_each_file_once() {
    let dir = tempfile::tempdir().unwrap();
    for f in 0..5 {
        let text: String = (0..3).map(|r| format!("f{f}r{r}\n")).collect();
        std::fs::write(dir.path().join(format!("part-{f}.txt")), text).unwrap();
    }
    // The rewrite needs the file list: the caller expands the pattern first.
    let mut def = Dataset::files(&format!("{}/*.txt", dir.path().display()))
        .lines()
        .into_def();
    expand_files(&mut def, &FileAccess::Unrestricted).unwrap();
    let mut all = Vec::new();
    for i in 0..2 {
        let out = auto_shard(&def, AutoShardPolicy::File, 2, i).unwrap();
        let lines: Vec<String> = iterate(&out, &ExecOptions::default())
            .unwrap()
            .map(|r| {
                let e = r.unwrap();
                let t = e.as_tensor().unwrap();
                String::from_utf8(t.strings().unwrap()[0].to_vec()).unwrap()
            })
            .collect();
        let files: Vec<u64> = if i == 0 { vec![0, 2, 4] } else { vec![1, 3] };
        let expected: Vec<String> = files
            .iter()
            .flat_map(|f| (0..3).map(move |r| format!("f{f}r{r}")))
            .collect();
        assert_eq!(lines, expected, "shard {i}");
        all.extend(lines);
    }
    assert_eq!(all.len(), 15);
}
