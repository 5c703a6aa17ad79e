//! Registering datasets: an explicit id registered again must carry the same definition.
//! Definitions are stored once per content (every `distribute` of the same pipeline registers
//! the same bytes under a new dataset id).
//!
//! A large definition arrives in parts (`StageDefinition`) before the registration that uses it
//! (`RegisterStagedDataset`), so that no log entry is too large to reach the followers within
//! one heartbeat. Its parts build up the definition under its final key, with no dataset using
//! it yet. At most one definition is being staged at a time: the first part of another one
//! drops it (the leader stages one upload at a time, so what it drops was left by a leader that
//! lost office mid-way). The key names the content, so parts of two uploads of the same content
//! are the same bytes at the same offsets, and a part that is already in place is accepted
//! again without change.

use super::DispatcherState;
use crate::state::entities::{Dataset, Definition, DefinitionKey};
use crate::state::update::{DatasetMetadata, Outcome, Rejection};
use prost::Message;
use sha2::{Digest, Sha256};
use sluice_element::blob_tensors::{self, BlobDigest};
use sluice_element::pb::DatasetDef;
use sluice_types::DatasetId;
use std::collections::{BTreeMap, BTreeSet};

/// No definition is larger than this (the largest `--max-definition-size` a dispatcher takes):
/// a part reaching past it is refused.
pub const MAX_DEFINITION_BYTES: u64 = 1 << 30;

/// The key a definition is stored under.
pub fn definition_key(def: &[u8]) -> DefinitionKey {
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
        self.register_under(key, requested, metadata, num_splits, now_micros, |stored| {
            // New, or staged parts of the same content: store it whole.
            if stored.datasets == 0 {
                stored.bytes = def.to_vec();
            }
        })
    }

    /// Stores one part of the definition under `key`; see the module's description.
    pub(super) fn stage_definition(
        &mut self,
        key: DefinitionKey,
        offset: u64,
        bytes: &[u8],
    ) -> Result<Outcome, Rejection> {
        let end = offset
            .checked_add(bytes.len() as u64)
            .filter(|end| *end <= MAX_DEFINITION_BYTES)
            .ok_or_else(|| {
                Rejection::InvalidArgument(format!(
                    "a definition part of {} bytes at offset {offset} reaches past the largest \
                     definition, {MAX_DEFINITION_BYTES} bytes",
                    bytes.len()
                ))
            })?;
        if !self.definitions.contains_key(&key) {
            if offset != 0 {
                return Err(Rejection::FailedPrecondition(format!(
                    "no part of the definition before offset {offset} is staged (another \
                     upload replaced it): register the dataset again"
                )));
            }
            self.definitions.retain(|_, d| d.datasets > 0);
        }
        let stored = self.definitions.entry(key).or_insert_with(|| Definition {
            bytes: Vec::new(),
            datasets: 0,
        });
        let staged = stored.bytes.len() as u64;
        if stored.datasets == 0 && end > staged {
            if offset > staged {
                return Err(Rejection::FailedPrecondition(format!(
                    "a definition part at offset {offset}, but only {staged} bytes of it are \
                     staged: register the dataset again"
                )));
            }
            // `offset <= staged < end`, so the skip is within the part.
            stored
                .bytes
                .extend_from_slice(&bytes[(staged - offset) as usize..]);
        }
        Ok(Outcome::DefinitionStaged {
            staged: stored.bytes.len() as u64,
        })
    }

    /// Registers a dataset whose definition was staged in parts: all `len` bytes must be there.
    pub(super) fn register_staged_dataset(
        &mut self,
        requested: Option<DatasetId>,
        key: DefinitionKey,
        len: u64,
        metadata: &DatasetMetadata,
        num_splits: &[u64],
        now_micros: u64,
    ) -> Result<Outcome, Rejection> {
        match self.definitions.get(&key) {
            // In use already, or every byte staged.
            Some(d) if d.datasets > 0 || d.bytes.len() as u64 == len => {}
            Some(d) => {
                return Err(Rejection::FailedPrecondition(format!(
                    "{} of the definition's {len} bytes are staged: register the dataset again",
                    d.bytes.len()
                )))
            }
            None => {
                return Err(Rejection::FailedPrecondition(
                    "the definition is not staged (another upload replaced it): register the \
                     dataset again"
                        .into(),
                ))
            }
        }
        self.register_under(key, requested, metadata, num_splits, now_micros, |_| {})
    }

    /// Registers a dataset of the definition under `key`; `store` puts the definition in place
    /// once a new dataset uses it (it gets the stored entry, new or not).
    fn register_under(
        &mut self,
        key: DefinitionKey,
        requested: Option<DatasetId>,
        metadata: &DatasetMetadata,
        num_splits: &[u64],
        now_micros: u64,
        store: impl FnOnce(&mut Definition),
    ) -> Result<Outcome, Rejection> {
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
        let stored = self.definitions.entry(key).or_insert_with(|| Definition {
            bytes: Vec::new(),
            datasets: 0,
        });
        store(stored);
        stored.datasets += 1;
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

    /// The blobs the registered definitions name (see `sluice_element::blob_tensors`): what
    /// every replica keeps in its blob store. Read from the definitions themselves, so the set
    /// follows registration and collection with no bookkeeping of its own; a staged definition
    /// no dataset uses yet names none, and an undecodable definition (none is registered
    /// undecodable) names none.
    pub fn live_blobs(&self) -> BTreeSet<BlobDigest> {
        self.live_blobs_cached(&mut BTreeMap::new())
    }

    /// `live_blobs`, decoding only the definitions `known` has not seen yet: `known` keeps each
    /// live definition's blobs between calls (a definition never changes under its key) and
    /// forgets the definitions gone. A replica's blob maintenance calls this every few seconds
    /// under the state's read lock, which Raft's apply waits behind: decoding every definition
    /// each time would hold it for as long as thousands of definitions take to decode.
    pub fn live_blobs_cached(
        &self,
        known: &mut BTreeMap<DefinitionKey, Vec<BlobDigest>>,
    ) -> BTreeSet<BlobDigest> {
        known.retain(|key, _| self.definitions.get(key).is_some_and(|d| d.datasets > 0));
        let mut live = BTreeSet::new();
        for (key, definition) in self.definitions.iter().filter(|(_, d)| d.datasets > 0) {
            let named = known.entry(*key).or_insert_with(|| {
                DatasetDef::decode(definition.bytes.as_slice())
                    .ok()
                    .and_then(|def| blob_tensors::digests(&def).ok())
                    .map(|named| named.into_keys().collect())
                    .unwrap_or_default()
            });
            live.extend(named.iter().copied());
        }
        live
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
