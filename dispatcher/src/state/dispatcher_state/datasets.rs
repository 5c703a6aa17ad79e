//! Registering datasets: an explicit id registered again must carry the same definition.
//! Definitions are stored once per content (every `distribute` of the same pipeline registers
//! the same bytes under a new dataset id).

use super::DispatcherState;
use crate::ids::DatasetId;
use crate::state::entities::{Dataset, Definition, DefinitionKey};
use crate::state::update::{DatasetMetadata, Outcome, Rejection};
use sha2::{Digest, Sha256};

/// The key a definition is stored under.
pub(super) fn definition_key(def: &[u8]) -> DefinitionKey {
    Sha256::digest(def).into()
}

impl DispatcherState {
    pub(super) fn register_dataset(
        &mut self,
        requested: Option<DatasetId>,
        def: &[u8],
        metadata: &DatasetMetadata,
        num_splits: &[u64],
        now_micros: u64,
    ) -> Result<Outcome, Rejection> {
        let key = definition_key(def);
        if let Some(id) = &requested {
            if let Some(existing) = self.datasets.get_mut(id) {
                return if existing.definition == key && existing.metadata == *metadata {
                    existing.last_used_micros = existing.last_used_micros.max(now_micros);
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
        self.definitions
            .entry(key)
            .or_insert_with(|| Definition {
                bytes: def.to_vec(),
                datasets: 0,
            })
            .datasets += 1;
        self.datasets.insert(
            id.clone(),
            Dataset {
                id: id.clone(),
                definition: key,
                metadata: metadata.clone(),
                num_splits: num_splits.to_vec(),
                jobs: 0,
                last_used_micros: now_micros,
            },
        );
        // Skip generated ids that a user took explicitly.
        while self
            .datasets
            .contains_key(&DatasetId(self.next_dataset_id.to_string()))
        {
            self.next_dataset_id = self.next_dataset_id.wrapping_add(1);
        }
        Ok(Outcome::DatasetRegistered { dataset_id: id })
    }

    /// Removes a dataset, and its definition if no other dataset uses it.
    pub(super) fn forget_dataset(&mut self, id: &DatasetId) {
        let Some(dataset) = self.datasets.remove(id) else {
            return;
        };
        if let Some(definition) = self.definitions.get_mut(&dataset.definition) {
            definition.datasets = definition.datasets.saturating_sub(1);
            if definition.datasets == 0 {
                self.definitions.remove(&dataset.definition);
            }
        }
    }
}
