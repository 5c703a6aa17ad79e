//! Split providers for the distributed_epoch sharding policy, counted from the definition alone.
//!
//! As in tf.data, every splittable leaf source of a definition has a split provider of its own:
//! each range, from_slices, files and from_tensors source (a from_tensors source has one split),
//! numbered in `nested::walk`'s depth-first order, tf.data's order (a definition, then the
//! datasets its zip, sample_from_datasets or choose_from_datasets source holds, then each
//! concatenate's other dataset). `zip(range(10), range(10))` has two providers of ten splits
//! each, `sample_from_datasets` of three `from_tensors(i).repeat()` inputs three of one split
//! (a `repeat` asks its providers for their next repetition on every pass). The templates of
//! interleave and group_by_window are not sources of the job: they are built per element on the
//! worker and read no split. A `random` source anywhere has no splits, so distributed_epoch
//! refuses the definition, as tf.data does.
//!
//! Splits are identified by index only: the dispatcher hands out cursors, never payloads, and
//! the executor's sources turn an index back into content (the worker supplies indices through
//! its `SplitSupplier`, naming the provider).

use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::{pb, DatasetError};

use crate::nested::{source_kind, walk};
use crate::slices::Slices;
use crate::source_rules::{not_expanded, range_len, Reading};

/// How many split providers the definition has: one per splittable source, none when
/// distributed_epoch cannot split it (see `split_providers`).
pub fn num_split_providers(def: &pb::DatasetDef) -> u32 {
    split_providers(def).map_or(0, |p| u32::try_from(p.len()).unwrap_or(u32::MAX))
}

/// The definitions whose sources are `def`'s split providers, in provider order (`nested::walk`'s
/// order), or why distributed_epoch cannot split `def` (`InvalidArgument`): a `random` source
/// anywhere in it, an element source outside a template, or no source at all.
///
/// A `from_tensors` source repeated without end (`from_tensors(x).repeat()`, the usual
/// companion of a dataset in a `zip`) is read whole by every worker when the definition has
/// another source to split: tf.data hands out its one split per repetition, so each worker draws
/// the same endless stream of `x` one dispatcher round trip per element; read whole, each worker
/// gets that stream without the round trips. Alone (every source such a constant), they are
/// split as tf.data splits them.
pub fn split_providers(def: &pb::DatasetDef) -> Result<Vec<&pb::DatasetDef>, DatasetError> {
    let mut providers = Vec::new();
    let mut endless_constants = Vec::new();
    let (mut random, mut element) = (false, false);
    walk(def, |d, _| match source_kind(d) {
        Some(SourceKind::Tensors(_)) if repeats_without_end(d) => endless_constants.push(d),
        Some(
            SourceKind::Range(_)
            | SourceKind::Slices(_)
            | SourceKind::Files(_)
            | SourceKind::Tensors(_),
        ) => providers.push(d),
        Some(SourceKind::Random(_)) => random = true,
        Some(SourceKind::Element(_)) => element = true,
        Some(SourceKind::Zip(_) | SourceKind::Sample(_) | SourceKind::Choose(_)) | None => {}
    });
    if random {
        return Err(no_random_splits());
    }
    if element {
        return Err(element_outside_template());
    }
    if providers.is_empty() {
        providers = endless_constants;
    }
    if providers.is_empty() {
        return Err(DatasetError::invalid(
            "distributed_epoch cannot split this dataset: it has no source (range, \
             from_slices, from_tensors or files) to hand out splits of",
        ));
    }
    Ok(providers)
}

/// Whether `def`'s own ops repeat its source without end.
fn repeats_without_end(def: &pb::DatasetDef) -> bool {
    def.ops
        .iter()
        .any(|op| matches!(&op.kind, Some(OpKind::Repeat(r)) if r.count.is_none()))
}

/// The number of splits of each of `def`'s split providers, in provider order.
pub fn split_counts(def: &pb::DatasetDef) -> Result<Vec<u64>, DatasetError> {
    split_providers(def)?
        .into_iter()
        .map(source_splits)
        .collect()
}

/// How many splits provider `provider` has: a range's length, a slices tensor's first dimension,
/// the number of files of an expanded files source (an unexpanded one is an error), 1 for a
/// from_tensors source.
pub fn num_splits(def: &pb::DatasetDef, provider: u32) -> Result<u64, DatasetError> {
    let providers = split_providers(def)?;
    let source = usize::try_from(provider)
        .ok()
        .and_then(|p| providers.get(p))
        .ok_or_else(|| {
            DatasetError::invalid(format!(
                "split provider {provider} does not exist; the definition has {} (numbered \
                 from 0)",
                providers.len()
            ))
        })?;
    source_splits(source)
}

/// The splits of one leaf source.
fn source_splits(def: &pb::DatasetDef) -> Result<u64, DatasetError> {
    match source_kind(def) {
        Some(pb::source::Kind::Range(r)) => {
            if r.step == 0 {
                return Err(DatasetError::invalid("range step must not be zero"));
            }
            Ok(range_len(r.start, r.stop, r.step))
        }
        Some(pb::source::Kind::Slices(s)) if crate::slices::source_names_blobs(s) => {
            Ok(crate::slices::proto_rows(s)?.1 as u64)
        }
        Some(pb::source::Kind::Slices(s)) => Ok(Slices::from_proto(s)?.len() as u64),
        Some(pb::source::Kind::Files(fs)) => {
            if fs.files.is_empty() {
                return Err(not_expanded(fs));
            }
            Reading::from_proto(fs)?;
            Ok(fs.files.len() as u64)
        }
        Some(pb::source::Kind::Element(_)) => Err(element_outside_template()),
        Some(pb::source::Kind::Tensors(_)) => Ok(1),
        Some(pb::source::Kind::Random(_)) => Err(no_random_splits()),
        _ => Err(DatasetError::invalid("dataset definition has no source")),
    }
}

fn element_outside_template() -> DatasetError {
    DatasetError::invalid(
        "an element source is only valid as the source of a template (interleave, group_by_window)",
    )
}

/// What distributed_epoch cannot run, refused by the dispatcher when the job is created and by
/// the worker's executor: a `random` source anywhere in the definition (no splits, as in
/// tf.data), and a `cache` anywhere in it (a worker would replay its own splits of one
/// repetition, or a file of another run, instead of reading the splits the dispatcher hands
/// it).
pub fn check_distributed_epoch(def: &pb::DatasetDef) -> Result<(), DatasetError> {
    let (mut cached, mut random) = (false, false);
    walk(def, |d, _| {
        random |= matches!(source_kind(d), Some(SourceKind::Random(_)));
        cached |= d
            .ops
            .iter()
            .any(|op| matches!(op.kind, Some(OpKind::Cache(_))));
    });
    if random {
        return Err(no_random_splits());
    }
    if cached {
        return Err(DatasetError::invalid(
            "cache cannot run in distributed_epoch mode: a worker would replay the splits it \
             read in one pass (or a cache file of another run) instead of the splits the \
             dispatcher hands it, so elements would repeat or go missing; apply cache after \
             distribute, or use parallel_epochs",
        ));
    }
    Ok(())
}

/// Why distributed_epoch cannot read a `random` source: tf.data's reason, and what to do.
pub fn no_random_splits() -> DatasetError {
    DatasetError::invalid(
        "Cannot create split providers for dataset of type RandomDataset, because the dataset \
         is not unary (instead having arity 0), and no custom implementation of \
         `MakeSplitProvider` is defined: Dataset.random has no splits to hand out, so \
         distributed_epoch cannot read it; use parallel_epochs (each worker draws its own \
         stream) or off",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{Dataset, Transform};
    use sluice_element::Tensor;

    #[test]
    fn counts() {
        assert_eq!(num_split_providers(Dataset::range(3).def()), 1);
        assert_eq!(num_split_providers(Dataset::random(Some(1)).def()), 0);
        assert_eq!(
            num_splits(Dataset::range_with(0, 100, 3).def(), 0).unwrap(),
            34
        );
        let t = Tensor::from_i64s(vec![3, 2], &[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(num_splits(Dataset::from_slices(t).def(), 0).unwrap(), 3);
        assert!(num_splits(Dataset::range(3).def(), 1).is_err());
        let mut def = Dataset::files("x/*.txt").lines().into_def();
        assert!(num_splits(&def, 0)
            .unwrap_err()
            .to_string()
            .contains("not expanded"));
        if let Some(pb::source::Kind::Files(fs)) = def.source.as_mut().and_then(|s| s.kind.as_mut())
        {
            fs.files = vec!["a".into(), "b".into()];
        }
        assert_eq!(num_splits(&def, 0).unwrap(), 2);
    }

    #[test]
    fn every_splittable_source_is_a_provider_in_walk_order() {
        let x = sluice_element::Element::Tensor(Tensor::scalar_i64(7));
        let tensors = || Dataset::from_tensors(&x);
        let inner = Dataset::zip(vec![Dataset::range(2), Dataset::range(3)]);
        // (definition, splits of each provider in order, or a piece of the refusal)
        let cases: Vec<(Dataset, Result<Vec<u64>, &str>)> = vec![
            (tensors(), Ok(vec![1])),
            // An endless constant beside a source to split is read whole by every worker.
            (
                Dataset::zip(vec![Dataset::range(10), tensors().repeat_forever()]),
                Ok(vec![10]),
            ),
            (
                Dataset::zip(vec![Dataset::range(10), tensors().repeat(3)]),
                Ok(vec![10, 1]),
            ),
            (
                Dataset::zip(vec![tensors().repeat_forever(), tensors().repeat_forever()]),
                Ok(vec![1, 1]),
            ),
            (
                tensors().concatenate(Dataset::range(4).into_def()),
                Ok(vec![1, 4]),
            ),
            (
                Dataset::zip(vec![Dataset::range(10), Dataset::range(3)]),
                Ok(vec![10, 3]),
            ),
            // Depth first: the nested zip's inputs come before the input after it.
            (
                Dataset::zip(vec![Dataset::range(5), inner.clone(), Dataset::range(7)]),
                Ok(vec![5, 2, 3, 7]),
            ),
            // A concatenate's other dataset comes after the source's nested datasets.
            (
                inner.concatenate(Dataset::range(9).into_def()),
                Ok(vec![2, 3, 9]),
            ),
            (
                Dataset::choose_from_datasets(
                    vec![tensors().repeat_forever()],
                    Dataset::range(3),
                    true,
                ),
                Ok(vec![3]),
            ),
            (
                Dataset::sample_from_datasets(vec![tensors(), tensors()], None, None, false),
                Ok(vec![1, 1]),
            ),
            (
                Dataset::zip(vec![Dataset::range(3), Dataset::random(Some(1))]),
                Err("RandomDataset"),
            ),
            (Dataset::random(Some(1)), Err("RandomDataset")),
        ];
        for (ds, want) in cases {
            let got = split_counts(ds.def()).map_err(|e| e.to_string());
            match (&got, &want) {
                (Ok(n), Ok(w)) => assert_eq!(n, w, "{ds}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{ds}: {e}"),
                (got, want) => panic!("{ds}: got {got:?}, want {want:?}"),
            }
            let count = want.as_ref().map_or(0, |w| w.len());
            assert_eq!(num_split_providers(ds.def()) as usize, count, "{ds}");
            for p in 0..count {
                assert_eq!(
                    num_splits(ds.def(), p as u32).ok(),
                    want.as_ref().ok().map(|w| w[p]),
                    "{ds} provider {p}"
                );
            }
            let past = num_splits(ds.def(), count as u32).unwrap_err().to_string();
            assert!(
                past.contains("does not exist") || want.is_err(),
                "{ds}: {past}"
            );
        }
    }

    #[test]
    fn templates_are_not_providers() {
        let def = Dataset::range(3)
            .interleave(Dataset::element_slices(), 2, 1)
            .into_def();
        assert_eq!(split_counts(&def).unwrap(), vec![3]);
    }

    #[test]
    fn random_or_cache_anywhere_is_refused() {
        let nested = Dataset::zip(vec![Dataset::range(3), Dataset::random(Some(1))]);
        let err = check_distributed_epoch(nested.def())
            .unwrap_err()
            .to_string();
        assert!(err.contains("RandomDataset"), "{err}");
        let cached = Dataset::range(2).concatenate(Dataset::range(3).cache("").into_def());
        let err = check_distributed_epoch(cached.def())
            .unwrap_err()
            .to_string();
        assert!(err.contains("cache cannot run"), "{err}");
        let fine = Dataset::zip(vec![Dataset::range(3), Dataset::range(4)]);
        assert!(check_distributed_epoch(fine.def()).is_ok());
    }
}
