//! Registering datasets: an explicit id registered again must carry the same definition.

use super::DispatcherState;
use crate::ids::DatasetId;
use crate::state::entities::Dataset;
use crate::state::update::{DatasetMetadata, Outcome, Rejection};

impl DispatcherState {
    pub(super) fn register_dataset(
        &mut self,
        requested: Option<DatasetId>,
        def: &[u8],
        metadata: &DatasetMetadata,
        num_splits: &[u64],
    ) -> Result<Outcome, Rejection> {
        if let Some(id) = &requested {
            if let Some(existing) = self.datasets.get(id) {
                return if existing.def == def && existing.metadata == *metadata {
                    Ok(Outcome::DatasetRegistered {
                        dataset_id: id.clone(),
                    })
                } else {
                    Err(Rejection::InvalidArgument(format!(
                        "Datasets with the same ID should have the same structure, got diff for \
                         dataset ID {id}. To fix this error, make sure you're registering the same \
                         dataset with the same ID."
                    )))
                };
            }
        }
        let id = requested.unwrap_or_else(|| DatasetId(self.next_dataset_id.to_string()));
        self.datasets.insert(
            id.clone(),
            Dataset {
                id: id.clone(),
                def: def.to_vec(),
                metadata: metadata.clone(),
                num_splits: num_splits.to_vec(),
            },
        );
        // Skip generated ids that a user took explicitly.
        while self
            .datasets
            .contains_key(&DatasetId(self.next_dataset_id.to_string()))
        {
            self.next_dataset_id += 1;
        }
        Ok(Outcome::DatasetRegistered { dataset_id: id })
    }
}
