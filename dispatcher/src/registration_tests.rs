//! Tests of `Registration::prepare`: what the leader computes before proposing a dataset, and
//! which files it lets a dataset name.

use super::*;
use sluice_element::Compression;
use sluice_element::{DType, ElementSpec};
use sluice_pipeline::Dataset;

fn request(def: Option<dpb::DatasetDef>) -> pb::RegisterDatasetRequest {
    pb::RegisterDatasetRequest {
        dataset: def,
        ..Default::default()
    }
}

/// The default: a dispatcher started without `--data-root`.
fn no_roots() -> DataRoots {
    DataRoots::none()
}

fn invalid_argument(result: Result<Registration, DispatcherError>) -> String {
    match result {
        Err(DispatcherError::InvalidArgument(message)) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn a_range_gets_its_split_count_cardinality_and_computed_spec() {
    let prepared =
        Registration::prepare(request(Some(Dataset::range(10).into_def())), &no_roots()).unwrap();
    assert_eq!(prepared.dataset_id, None);
    assert_eq!(prepared.num_splits, vec![10]);
    assert_eq!(prepared.metadata.cardinality, 10);
    assert_eq!(prepared.metadata.compression, Compression::Auto);
    let spec = ElementSpec::scalar(DType::Int64).to_proto().encode_to_vec();
    assert_eq!(prepared.metadata.element_spec, spec);
}

#[test]
fn every_splittable_source_of_a_nested_definition_has_a_split_provider() {
    use sluice_element::{Element, Tensor};
    use sluice_pipeline::Transform;
    let x = Element::Tensor(Tensor::scalar_i64(7));
    // (definition, splits per provider, cardinality)
    let cases: Vec<(Dataset, Vec<u64>, i64)> = vec![
        (
            Dataset::zip(vec![
                Dataset::range(10),
                Dataset::from_tensors(&x).repeat_forever(),
            ]),
            // The endless constant is read whole by every worker: the range's provider only.
            vec![10],
            10,
        ),
        (
            Dataset::zip(vec![
                Dataset::range(10),
                Dataset::from_tensors(&x).repeat(3),
            ]),
            vec![10, 1],
            3,
        ),
        (Dataset::from_tensors(&x), vec![1], 1),
        (
            Dataset::range(3).concatenate(Dataset::range(4).into_def()),
            vec![3, 4],
            7,
        ),
        // A random source: registered (parallel_epochs and the static modes run it), with no
        // provider for distributed_epoch.
        (
            Dataset::zip(vec![Dataset::range(3), Dataset::random(Some(1))]),
            Vec::new(),
            3,
        ),
    ];
    for (dataset, splits, cardinality) in cases {
        let prepared =
            Registration::prepare(request(Some(dataset.clone().into_def())), &no_roots()).unwrap();
        assert_eq!(prepared.num_splits, splits, "{dataset}");
        assert_eq!(prepared.metadata.cardinality, cardinality, "{dataset}");
    }
}

#[test]
fn a_file_pattern_is_expanded_sorted_and_counted_as_one_split_per_file() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["b.txt", "a.txt", "c.csv"] {
        std::fs::write(dir.path().join(name), "x\n").unwrap();
    }
    let pattern = format!("{}/*.txt", dir.path().display());
    let def = Dataset::files(&pattern).lines().into_def();
    let roots = DataRoots::new([dir.path()]).unwrap();
    let prepared = Registration::prepare(request(Some(def)), &roots).unwrap();
    assert_eq!(prepared.num_splits, vec![2]);
    let Some(dpb::Source {
        kind: Some(dpb::source::Kind::Files(files)),
    }) = &prepared.def.source
    else {
        panic!("the source stays a files source: {:?}", prepared.def);
    };
    let names: Vec<_> = files
        .files
        .iter()
        .map(|f| std::path::Path::new(f).file_name().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["a.txt", "b.txt"]);
    // The stored definition is the expanded one.
    let Update::RegisterDataset { def, .. } = prepared.clone().into_update() else {
        panic!("a registration becomes RegisterDataset");
    };
    assert_eq!(def, prepared.def.encode_to_vec());
}

#[test]
fn a_given_spec_compression_and_id_are_kept() {
    let given = ElementSpec::scalar(DType::String).to_proto();
    let prepared = Registration::prepare(
        pb::RegisterDatasetRequest {
            dataset: Some(Dataset::range(3).into_def()),
            dataset_id: Some("mine".into()),
            metadata: Some(pb::DatasetMetadata {
                element_spec: Some(given.clone()),
                cardinality: 0,
                compression: pb::Compression::None as i32,
            }),
            ..Default::default()
        },
        &no_roots(),
    )
    .unwrap();
    assert_eq!(prepared.dataset_id, Some(DatasetId("mine".into())));
    assert_eq!(prepared.metadata.element_spec, given.encode_to_vec());
    assert_eq!(prepared.metadata.compression, Compression::None);
}

#[test]
fn an_empty_dataset_id_means_none() {
    let prepared = Registration::prepare(
        pb::RegisterDatasetRequest {
            dataset: Some(Dataset::range(3).into_def()),
            dataset_id: Some(String::new()),
            ..Default::default()
        },
        &no_roots(),
    )
    .unwrap();
    assert_eq!(prepared.dataset_id, None);
}

#[test]
fn bad_requests_are_invalid_arguments_naming_the_problem() {
    assert_eq!(
        invalid_argument(Registration::prepare(request(None), &no_roots())),
        "`dataset` is required"
    );
    let no_source = invalid_argument(Registration::prepare(
        request(Some(dpb::DatasetDef::default())),
        &no_roots(),
    ));
    assert!(!no_source.is_empty());
    let bad_compression = invalid_argument(Registration::prepare(
        pb::RegisterDatasetRequest {
            dataset: Some(Dataset::range(3).into_def()),
            metadata: Some(pb::DatasetMetadata {
                compression: 99,
                ..Default::default()
            }),
            ..Default::default()
        },
        &no_roots(),
    ));
    assert!(bad_compression.contains("99"), "{bad_compression}");
}

fn file_refused(result: Result<Registration, DispatcherError>) -> String {
    match result {
        Err(DispatcherError::FileRefused(message)) => message,
        other => panic!("expected FileRefused, got {other:?}"),
    }
}

fn files_def(files: &[String]) -> dpb::DatasetDef {
    let mut def = Dataset::files("listed").lines().into_def();
    let Some(dpb::source::Kind::Files(fs)) = def.source.as_mut().and_then(|s| s.kind.as_mut())
    else {
        panic!("a files source");
    };
    fs.files = files.to_vec();
    def
}

#[test]
fn files_outside_the_roots_are_refused_naming_the_path_and_the_roots() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir(base.join("data")).unwrap();
    std::fs::write(base.join("data/a.txt"), "x\n").unwrap();
    std::fs::write(base.join("secret.txt"), "x\n").unwrap();
    std::os::unix::fs::symlink(base.join("secret.txt"), base.join("data/link.txt")).unwrap();
    let roots = DataRoots::new([base.join("data")]).unwrap();
    let none = DataRoots::none();
    let data = base.join("data").display().to_string();
    let secret = base.join("secret.txt").display().to_string();
    let link = base.join("data/link.txt").display().to_string();
    let rows: Vec<(dpb::DatasetDef, &DataRoots, String)> = vec![
        (
            Dataset::files(&format!("{}/*.txt", base.display()))
                .lines()
                .into_def(),
            &roots,
            format!(
                "refused to read '{}/*.txt': it matches files outside the data roots ({data})",
                base.display()
            ),
        ),
        (
            Dataset::files("/etc/pass*").lines().into_def(),
            &roots,
            format!("refused to read '/etc/pass*': outside the data roots ({data})"),
        ),
        (
            Dataset::files(&format!("{data}/l*.txt")).lines().into_def(),
            &roots,
            // Not where the link leads: that would answer a probe.
            format!("refused to read '{link}': outside the data roots ({data})"),
        ),
        (
            files_def(&[format!("{data}/a.txt"), secret.clone()]),
            &roots,
            format!("refused to read '{secret}': outside the data roots ({data})"),
        ),
        (
            files_def(&["/dev/zero".into()]),
            &roots,
            format!("refused to read '/dev/zero': outside the data roots ({data})"),
        ),
        (
            files_def(&[format!("{data}/a.txt")]),
            &none,
            format!("refused to read '{data}/a.txt': this server has no data roots"),
        ),
    ];
    for (def, roots, want) in rows {
        let got = file_refused(Registration::prepare(request(Some(def.clone())), roots));
        assert!(got.starts_with(&want), "{def:?}: want {want}, got {got}");
    }
}

#[test]
fn a_listed_file_inside_the_roots_is_stored_canonical() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::write(base.join("a.txt"), "x\n").unwrap();
    let roots = DataRoots::new([&base]).unwrap();
    let listed = format!("{}/./a.txt", base.display());
    let prepared = Registration::prepare(request(Some(files_def(&[listed]))), &roots).unwrap();
    assert_eq!(
        prepared.def,
        files_def(&[base.join("a.txt").display().to_string()])
    );
    assert_eq!(prepared.num_splits, vec![1]);
}

#[test]
fn a_definition_over_the_part_size_is_proposed_in_parts_that_rebuild_it() {
    let prepared =
        Registration::prepare(request(Some(Dataset::range(10).into_def())), &no_roots()).unwrap();
    let whole = prepared.def.encode_to_vec();

    let (parts, register) = prepared.clone().into_updates(whole.len());
    assert!(parts.is_empty(), "fits in one entry");
    assert_eq!(
        register,
        Update::RegisterDataset {
            dataset_id: None,
            def: whole.clone(),
            metadata: prepared.metadata.clone(),
            num_splits: prepared.num_splits.clone(),
        }
    );

    let part_bytes = 3;
    let (parts, register) = prepared.clone().into_updates(part_bytes);
    assert_eq!(parts.len(), whole.len().div_ceil(part_bytes));
    let mut rebuilt = Vec::new();
    for part in &parts {
        let Update::StageDefinition { key, offset, bytes } = part else {
            panic!("a part: {part:?}");
        };
        assert_eq!(*key, crate::state::definition_key(&whole));
        assert_eq!(*offset, rebuilt.len() as u64);
        assert!(bytes.len() <= part_bytes);
        rebuilt.extend_from_slice(bytes);
    }
    assert_eq!(rebuilt, whole);
    assert_eq!(
        register,
        Update::RegisterStagedDataset {
            dataset_id: None,
            key: crate::state::definition_key(&whole),
            len: whole.len() as u64,
            metadata: prepared.metadata,
            num_splits: prepared.num_splits,
        }
    );
}
