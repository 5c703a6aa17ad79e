//! Split providers for the distributed_epoch sharding policy, counted from the definition alone.
//!
//! A definition has at most one split provider (index 0): its *split source*. Splits are
//! identified by index only: the dispatcher hands out cursors, never payloads, and the executor's
//! sources turn an index back into content (the worker supplies indices through its
//! `SplitSupplier`).
//!
//! With nested datasets (zip, concatenate, sample_from_datasets, choose_from_datasets) the split
//! source is the one splittable source of the whole tree: a range, from_slices or files source.
//! `from_tensors` (and `random`) sources are not splittable: every worker reads them whole, as tf.data reads
//! its non-splittable inputs (`zip(range(10), from_tensors(x).repeat())` hands out the range's
//! splits and pairs each with `x`). A lone `from_tensors` definition is its own split source,
//! with one split. A tree with two or more splittable sources, or none, has no split provider:
//! distributed_epoch refuses it (`distributed_epoch_source`), every other mode runs it.

use sluice_element::pb::op::Kind as OpKind;
use sluice_element::pb::source::Kind as SourceKind;
use sluice_element::{pb, DatasetError};

use crate::nested::{source_kind, walk};
use crate::slices::Slices;
use crate::source_rules::{not_expanded, range_len, Reading};

/// How many split providers the definition has: one for its split source, none without one.
pub fn num_split_providers(def: &pb::DatasetDef) -> u32 {
    u32::from(split_source_index(def).is_ok())
}

/// The split source of `def`, as its position in `nested::walk`'s order (0: `def` itself), or
/// why distributed_epoch cannot split `def` (`InvalidArgument`, naming the op that holds the
/// datasets).
pub fn split_source_index(def: &pb::DatasetDef) -> Result<usize, DatasetError> {
    let mut splittable = Vec::new();
    let mut combiner = None;
    let mut position = 0;
    walk(def, |d, _| {
        match source_kind(d) {
            Some(SourceKind::Range(_) | SourceKind::Slices(_) | SourceKind::Files(_)) => {
                splittable.push(position)
            }
            Some(SourceKind::Zip(_)) => {
                combiner.get_or_insert("zip");
            }
            Some(SourceKind::Sample(_)) => {
                combiner.get_or_insert("sample_from_datasets");
            }
            Some(SourceKind::Choose(_)) => {
                combiner.get_or_insert("choose_from_datasets");
            }
            Some(SourceKind::Tensors(_) | SourceKind::Random(_) | SourceKind::Element(_))
            | None => {}
        }
        if d.ops
            .iter()
            .any(|o| matches!(o.kind, Some(OpKind::Concatenate(_))))
        {
            combiner.get_or_insert("concatenate");
        }
        position += 1;
    });
    match (splittable.as_slice(), combiner) {
        ([only], _) => Ok(*only),
        ([], None) if matches!(source_kind(def), Some(SourceKind::Tensors(_))) => Ok(0),
        ([], None) if matches!(source_kind(def), Some(SourceKind::Random(_))) => {
            Err(no_random_splits())
        }
        ([], None) => Err(DatasetError::invalid("dataset definition has no source")),
        ([], Some(op)) => Err(DatasetError::invalid(format!(
            "distributed_epoch cannot split this dataset: the datasets of its {op} hold no \
             splittable source (range, from_slices or files), only from_tensors; use \
             parallel_epochs or a static sharding policy"
        ))),
        (many, op) => Err(DatasetError::invalid(format!(
            "distributed_epoch cannot split this dataset: the datasets of its {} hold {} \
             splittable sources (range, from_slices or files), and Sluice hands out the splits \
             of one source only; keep one splittable source (other inputs such as \
             from_tensors(x).repeat() are read whole by every worker), or use parallel_epochs \
             or a static sharding policy",
            op.unwrap_or("definition"),
            many.len()
        ))),
    }
}

/// The split source's definition (see `split_source_index`).
pub fn split_source(def: &pb::DatasetDef) -> Result<&pb::DatasetDef, DatasetError> {
    let index = split_source_index(def)?;
    let (mut found, mut position) = (None, 0);
    walk(def, |d, _| {
        if position == index {
            found = Some(d);
        }
        position += 1;
    });
    Ok(found.expect("the split source's position lies in the walk"))
}

/// How many splits provider `provider` has: a range's length, a slices tensor's first dimension,
/// the number of files of an expanded files source (an unexpanded one is an error), 1 for a
/// lone from_tensors.
pub fn num_splits(def: &pb::DatasetDef, provider: u32) -> Result<u64, DatasetError> {
    if provider != 0 {
        return Err(DatasetError::invalid(format!(
            "split provider {provider} does not exist; there is only provider 0"
        )));
    }
    match source_kind(split_source(def)?) {
        Some(pb::source::Kind::Range(r)) => {
            if r.step == 0 {
                return Err(DatasetError::invalid("range step must not be zero"));
            }
            Ok(range_len(r.start, r.stop, r.step))
        }
        Some(pb::source::Kind::Slices(s)) => Ok(Slices::from_proto(s)?.len() as u64),
        Some(pb::source::Kind::Files(fs)) => {
            if fs.files.is_empty() {
                return Err(not_expanded(fs));
            }
            Reading::from_proto(fs)?;
            Ok(fs.files.len() as u64)
        }
        Some(pb::source::Kind::Element(_)) => Err(DatasetError::invalid(
            "an element source is only valid as the source of a template (interleave, group_by_window)",
        )),
        Some(pb::source::Kind::Tensors(_)) => Ok(1),
        Some(pb::source::Kind::Random(_)) => Err(no_random_splits()),
        _ => Err(DatasetError::invalid("dataset definition has no source")),
    }
}

/// What distributed_epoch cannot run, refused by the dispatcher when the job is created and by
/// the worker's executor: a `random` source (no splits, as in tf.data), and a `cache` anywhere
/// in the definition (a worker would replay its own splits of one repetition, or a file of
/// another run, instead of reading the splits the dispatcher hands it).
pub fn check_distributed_epoch(def: &pb::DatasetDef) -> Result<(), DatasetError> {
    if let Some(SourceKind::Random(_)) = source_kind(def) {
        return Err(no_random_splits());
    }
    let mut cached = false;
    walk(def, |d, _| {
        cached |= d
            .ops
            .iter()
            .any(|op| matches!(op.kind, Some(OpKind::Cache(_))));
    });
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
    fn nested_definitions_have_a_provider_only_with_one_splittable_source() {
        let x = sluice_element::Element::Tensor(Tensor::scalar_i64(7));
        let tensors = || Dataset::from_tensors(&x);
        // (definition, splits of provider 0, or a piece of the refusal)
        let cases: Vec<(Dataset, Result<u64, &str>)> = vec![
            (tensors(), Ok(1)),
            (
                Dataset::zip(vec![Dataset::range(10), tensors().repeat_forever()]),
                Ok(10),
            ),
            (tensors().concatenate(Dataset::range(4).into_def()), Ok(4)),
            (
                Dataset::zip(vec![Dataset::range(10), Dataset::range(3)]),
                Err("its zip hold 2 splittable sources"),
            ),
            (
                Dataset::range(2).concatenate(Dataset::range(3).into_def()),
                Err("its concatenate hold 2 splittable sources"),
            ),
            (
                Dataset::choose_from_datasets(
                    vec![tensors().repeat_forever()],
                    Dataset::range(3),
                    true,
                ),
                Ok(3),
            ),
            (
                Dataset::sample_from_datasets(vec![tensors(), tensors()], None, None, false),
                Err("its sample_from_datasets hold no splittable source"),
            ),
        ];
        for (ds, want) in cases {
            let got = num_splits(ds.def(), 0).map_err(|e| e.to_string());
            match (got, want) {
                (Ok(n), Ok(w)) => assert_eq!(n, w, "{ds}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{ds}: {e}"),
                (got, want) => panic!("{ds}: got {got:?}, want {want:?}"),
            }
            assert_eq!(
                num_split_providers(ds.def()),
                u32::from(want.is_ok()),
                "{ds}"
            );
        }
    }
}
