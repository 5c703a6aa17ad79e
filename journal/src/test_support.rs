//! A toy type config and replicated state for the journal's tests: a map of key → value
//! written by `Set` commands.

use std::collections::BTreeMap;
use std::io::Cursor;

use openraft::LogId;
use serde::Deserialize;
use serde::Serialize;

use crate::ReplicatedState;

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
