//! `SetFetchKey`: the cluster's secret for readers' admissions, set once.

use super::DispatcherState;
use crate::state::update::Outcome;
use sluice_security::FetchKey;

impl DispatcherState {
    /// Sets the fetch key unless one is set: the first key applied stays the cluster's.
    pub(super) fn set_fetch_key(&mut self, key: &FetchKey) -> Outcome {
        let set = self.fetch_key.is_none();
        if set {
            self.fetch_key = Some(key.clone());
        }
        Outcome::FetchKeySet { set }
    }

    /// The cluster's fetch key, once a leader set one.
    pub fn fetch_key(&self) -> Option<&FetchKey> {
        self.fetch_key.as_ref()
    }
}
