//! Preparing a dataset registration on the leader, before it is proposed.
//!
//! `apply` must not read files or run the dataset analysis (every replica would have to reach
//! the same files and the same registry), so the leader does that work once and the results
//! travel in the update: the file pattern expanded into a sorted file list, the number of splits
//! of each split provider, the element spec (computed unless the caller sent one) and the
//! cardinality. The definition is stored with its file list expanded, so a worker on any
//! replica's watch reads exactly the files counted here.
//!
//! Every file, matched by the pattern or listed by the caller (a raw request may send the list
//! filled), must pass this dispatcher's data roots, and the stored list holds canonical paths.
//! Preparing reads the file system, so the service runs it off the async runtime.
//!
//! A definition is bounded in size (`--max-definition-size`), checked twice before anything is
//! proposed: as the caller sent it, before any work, and once its file patterns are expanded.

use crate::convert;
use crate::error::DispatcherError;
use crate::state::{definition_key, DatasetMetadata, Update};
use prost::Message;
use sluice_element::DatasetError;
use sluice_formats::{DataRoots, FileAccess};
use sluice_pipeline::FunctionRegistry;
use sluice_proto::dataset as dpb;
use sluice_proto::dispatcher as pb;
use sluice_types::DatasetId;

/// A registration ready to propose: what `Update::RegisterDataset` carries.
#[derive(Clone, Debug, PartialEq)]
pub struct Registration {
    /// The caller's explicit id, if any (an empty id is none).
    pub dataset_id: Option<DatasetId>,
    /// The definition with its file list expanded.
    pub def: dpb::DatasetDef,
    pub metadata: DatasetMetadata,
    /// Splits of each split provider.
    pub num_splits: Vec<u64>,
}

impl Registration {
    /// Prepares a `RegisterDataset` request: a missing or unanalysable definition, a bad
    /// pattern and an unknown compression are `InvalidArgument`; a file outside `roots` is
    /// `FileRefused`.
    pub fn prepare(
        request: pb::RegisterDatasetRequest,
        roots: &DataRoots,
    ) -> Result<Registration, DispatcherError> {
        Self::prepare_with(request, &FunctionRegistry::global(), roots)
    }

    /// Like [`Registration::prepare`], resolving functions in `registry`.
    pub fn prepare_with(
        request: pb::RegisterDatasetRequest,
        registry: &FunctionRegistry,
        roots: &DataRoots,
    ) -> Result<Registration, DispatcherError> {
        let mut def = request
            .dataset
            .ok_or_else(|| DispatcherError::InvalidArgument("`dataset` is required".into()))?;
        sluice_formats::expand_files(&mut def, &FileAccess::Roots(roots.clone()))
            .map_err(invalid)?;
        // No providers (a random source): registered, refused by distributed_epoch jobs.
        let num_splits = match sluice_pipeline::split_providers(&def) {
            Ok(_) => sluice_pipeline::split_counts(&def).map_err(invalid)?,
            Err(_) => Vec::new(),
        };
        let given = request.metadata.unwrap_or_default();
        let element_spec = match given.element_spec {
            Some(spec) => spec,
            None => sluice_pipeline::element_spec(&def, registry)
                .map_err(invalid)?
                .to_proto(),
        };
        let metadata = DatasetMetadata {
            element_spec: element_spec.encode_to_vec(),
            cardinality: sluice_pipeline::cardinality(&def),
            compression: convert::compression_from_proto(given.compression)?,
        };
        Ok(Registration {
            dataset_id: request
                .dataset_id
                .filter(|id| !id.is_empty())
                .map(DatasetId),
            def,
            metadata,
            num_splits,
        })
    }

    /// The update that registers the dataset, in one entry whatever the definition's size.
    #[cfg(test)]
    pub fn into_update(self) -> Update {
        let (_, register) = self.into_updates(usize::MAX);
        register
    }

    /// The updates that register the dataset with no entry much over `part_bytes`: one
    /// `RegisterDataset` if the definition fits, otherwise `StageDefinition` parts of
    /// `part_bytes` (to be applied in order) and the `RegisterStagedDataset` that follows them.
    pub fn into_updates(self, part_bytes: usize) -> (Vec<Update>, Update) {
        let def = self.def.encode_to_vec();
        if def.len() <= part_bytes {
            let register = Update::RegisterDataset {
                dataset_id: self.dataset_id,
                def,
                metadata: self.metadata,
                num_splits: self.num_splits,
            };
            return (Vec::new(), register);
        }
        let key = definition_key(&def);
        let mut offset = 0;
        let parts = def
            .chunks(part_bytes.max(1))
            .map(|part| {
                let update = Update::StageDefinition {
                    key,
                    offset,
                    bytes: part.to_vec(),
                };
                offset += part.len() as u64;
                update
            })
            .collect();
        let register = Update::RegisterStagedDataset {
            dataset_id: self.dataset_id,
            key,
            len: def.len() as u64,
            metadata: self.metadata,
            num_splits: self.num_splits,
        };
        (parts, register)
    }
}

/// Refuses a definition of `size` encoded bytes over `limit`; `stage` says which form of it
/// was measured (as sent, or with its file patterns expanded).
pub fn check_definition_size(
    size: usize,
    limit: usize,
    stage: &str,
) -> Result<(), DispatcherError> {
    if size <= limit {
        return Ok(());
    }
    Err(DispatcherError::InvalidArgument(format!(
        "the dataset definition is {size} bytes {stage}, over this dispatcher's limit of {limit} \
         bytes (--max-definition-size); definitions are replicated to every dispatcher, so keep \
         large constant data in files (a client moves numeric tensors over 256 KiB out of the \
         definition, as blobs; strings and many small tensors stay in it)"
    )))
}

fn invalid(e: DatasetError) -> DispatcherError {
    match e {
        DatasetError::FileRefused { .. } => DispatcherError::FileRefused(e.to_string()),
        other => DispatcherError::InvalidArgument(other.to_string()),
    }
}

#[cfg(test)]
#[path = "registration_tests.rs"]
mod tests;
