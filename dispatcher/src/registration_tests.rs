//! Tests of `Registration::prepare`: what the leader computes before proposing a dataset.

use super::*;
use crate::state::Compression;
use sluice_dataset::{DType, Dataset, ElementSpec};

fn request(def: Option<dpb::DatasetDef>) -> pb::RegisterDatasetRequest {
    pb::RegisterDatasetRequest {
        dataset: def,
        ..Default::default()
    }
}

fn invalid_argument(result: Result<Registration, DispatcherError>) -> String {
    match result {
        Err(DispatcherError::InvalidArgument(message)) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn a_range_gets_its_split_count_cardinality_and_computed_spec() {
    let prepared = Registration::prepare(request(Some(Dataset::range(10).into_def()))).unwrap();
    assert_eq!(prepared.dataset_id, None);
    assert_eq!(prepared.num_splits, vec![10]);
    assert_eq!(prepared.metadata.cardinality, 10);
    assert_eq!(prepared.metadata.compression, Compression::Auto);
    let spec = ElementSpec::scalar(DType::Int64).to_proto().encode_to_vec();
    assert_eq!(prepared.metadata.element_spec, spec);
}

#[test]
fn a_file_pattern_is_expanded_sorted_and_counted_as_one_split_per_file() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["b.txt", "a.txt", "c.csv"] {
        std::fs::write(dir.path().join(name), "x\n").unwrap();
    }
    let pattern = format!("{}/*.txt", dir.path().display());
    let def = Dataset::files(&pattern).lines().into_def();
    let prepared = Registration::prepare(request(Some(def))).unwrap();
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
    let prepared = Registration::prepare(pb::RegisterDatasetRequest {
        dataset: Some(Dataset::range(3).into_def()),
        dataset_id: Some("mine".into()),
        metadata: Some(pb::DatasetMetadata {
            element_spec: Some(given.clone()),
            cardinality: 0,
            compression: pb::Compression::None as i32,
        }),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(prepared.dataset_id, Some(DatasetId("mine".into())));
    assert_eq!(prepared.metadata.element_spec, given.encode_to_vec());
    assert_eq!(prepared.metadata.compression, Compression::None);
}

#[test]
fn an_empty_dataset_id_means_none() {
    let prepared = Registration::prepare(pb::RegisterDatasetRequest {
        dataset: Some(Dataset::range(3).into_def()),
        dataset_id: Some(String::new()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(prepared.dataset_id, None);
}

#[test]
fn bad_requests_are_invalid_arguments_naming_the_problem() {
    assert_eq!(
        invalid_argument(Registration::prepare(request(None))),
        "`dataset` is required"
    );
    let no_source = invalid_argument(Registration::prepare(request(Some(
        dpb::DatasetDef::default(),
    ))));
    assert!(!no_source.is_empty());
    let bad_compression = invalid_argument(Registration::prepare(pb::RegisterDatasetRequest {
        dataset: Some(Dataset::range(3).into_def()),
        metadata: Some(pb::DatasetMetadata {
            compression: 99,
            ..Default::default()
        }),
        ..Default::default()
    }));
    assert!(bad_compression.contains("99"), "{bad_compression}");
}
