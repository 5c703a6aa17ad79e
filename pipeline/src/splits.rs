//! Split providers for the distributed_epoch sharding policy, counted from the definition alone.
//!
//! A definition has one split provider (index 0) for its one source. Splits are identified by
//! index only: the dispatcher hands out cursors, never payloads, and the executor's sources turn
//! an index back into content (the worker supplies indices through its `SplitSupplier`).

use sluice_element::{pb, DatasetError};

use crate::slices::Slices;
use crate::source_rules::{not_expanded, range_len, Reading};

/// How many split providers the definition has: one, for its source.
pub fn num_split_providers(_def: &pb::DatasetDef) -> u32 {
    1
}

/// How many splits provider `provider` has: a range's length, a slices tensor's first dimension,
/// the number of files of an expanded files source (an unexpanded one is an error).
pub fn num_splits(def: &pb::DatasetDef, provider: u32) -> Result<u64, DatasetError> {
    if provider != 0 {
        return Err(DatasetError::invalid(format!(
            "split provider {provider} does not exist; there is only provider 0"
        )));
    }
    match def.source.as_ref().and_then(|s| s.kind.as_ref()) {
        None => Err(DatasetError::invalid("dataset definition has no source")),
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Dataset;
    use sluice_element::Tensor;

    #[test]
    fn counts() {
        assert_eq!(num_split_providers(Dataset::range(3).def()), 1);
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
}
