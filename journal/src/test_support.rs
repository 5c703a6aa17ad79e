//! A toy type config and replicated state for the journal's tests: a map of key → value
//! written by `Set` commands.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;

use openraft::LogId;
use serde::Deserialize;
use serde::Serialize;

use crate::IfMissing;
use crate::Journal;
use crate::JournalError;
use crate::JournalIdentity;
use crate::ReplicatedState;

/// The identity the tests' journals are created with.
pub fn test_identity() -> JournalIdentity {
    JournalIdentity::new("test", 1).expect("a valid identity")
}

/// Opens the test journal in `dir`, creating it if `dir` is missing or empty.
pub fn open_or_create(dir: &Path) -> Result<Journal, JournalError> {
    Journal::open(dir, &test_identity(), IfMissing::Create)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cmd {
    Set { key: String, value: String },
}

/// The previous value of the key, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resp(pub Option<String>);

openraft::declare_raft_types!(
    pub ToyConfig:
        D = Cmd,
        R = Resp,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<ToyConfig>,
        SnapshotData = Cursor<Vec<u8>>,
);

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvState {
    pub map: BTreeMap<String, String>,
}

impl ReplicatedState<ToyConfig> for KvState {
    fn apply(&mut self, _log_id: &LogId<u64>, data: &Cmd) -> Resp {
        match data {
            Cmd::Set { key, value } => Resp(self.map.insert(key.clone(), value.clone())),
        }
    }
}
