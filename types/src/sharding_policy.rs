//! `ShardingPolicy`: how a job's data is divided between its workers, the one definition the
//! client, the worker and the dispatcher's replicated state share (its protobuf form is read
//! and written in `sluice_rpc::convert`).
//!
//! It has two renderings, both user-visible: `Display` is tf.data's enum name (`OFF`,
//! `DYNAMIC`, ...), used in the dispatcher's error texts as tf.data words them (`Existing
//! processing mode: <OFF>; got <DYNAMIC>.`); [`ShardingPolicy::processing_mode_name`] is the
//! client's spelling (`parallel_epochs`, `distributed_epoch`, `file`, ...). `FromStr` accepts
//! the client's spellings. The serde encoding is persisted by the dispatcher: the variant order
//! is part of its on-disk format.

use crate::invalid_value::InvalidValue;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How a job's data is divided between workers (tf.data's `ShardingPolicy`; tf.data's
/// `processing_mode` argument takes it, or `"parallel_epochs"` / `"distributed_epoch"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardingPolicy {
    /// "parallel_epochs": every task produces the whole dataset.
    Off,
    /// "distributed_epoch": splits are leased from the dispatcher, each at most once.
    Dynamic,
    File,
    Data,
    FileOrData,
    Hint,
}

impl ShardingPolicy {
    /// FILE, DATA, FILE_OR_DATA and HINT: each worker's share is fixed by its index in the
    /// dispatcher's worker list (tf.data's `IsStaticShard`).
    pub fn is_static(self) -> bool {
        match self {
            ShardingPolicy::Off | ShardingPolicy::Dynamic => false,
            ShardingPolicy::File
            | ShardingPolicy::Data
            | ShardingPolicy::FileOrData
            | ShardingPolicy::Hint => true,
        }
    }

    /// The client's name of the mode: `parallel_epochs`, `distributed_epoch`, `file`, `data`,
    /// `file_or_data`, `hint`.
    pub fn processing_mode_name(self) -> &'static str {
        match self {
            ShardingPolicy::Off => "parallel_epochs",
            ShardingPolicy::Dynamic => "distributed_epoch",
            ShardingPolicy::File => "file",
            ShardingPolicy::Data => "data",
            ShardingPolicy::FileOrData => "file_or_data",
            ShardingPolicy::Hint => "hint",
        }
    }
}

impl FromStr for ShardingPolicy {
    type Err = InvalidValue;

    /// Accepts `parallel_epochs`, `distributed_epoch` and the policy names, case-insensitive.
    fn from_str(s: &str) -> Result<Self, InvalidValue> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "parallel_epochs" | "off" => ShardingPolicy::Off,
            "distributed_epoch" | "dynamic" => ShardingPolicy::Dynamic,
            "file" => ShardingPolicy::File,
            "data" => ShardingPolicy::Data,
            "file_or_data" => ShardingPolicy::FileOrData,
            "hint" => ShardingPolicy::Hint,
            _ => {
                return Err(InvalidValue(format!(
                    "tf.data service processing mode should be a \
                     `tf.data.experimental.service.ShardingPolicy`, `\"parallel_epochs\"`, or \
                     `\"distributed_epoch\"`. Got '{s}'."
                )))
            }
        })
    }
}

impl fmt::Display for ShardingPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShardingPolicy::Off => "OFF",
            ShardingPolicy::Dynamic => "DYNAMIC",
            ShardingPolicy::File => "FILE",
            ShardingPolicy::Data => "DATA",
            ShardingPolicy::FileOrData => "FILE_OR_DATA",
            ShardingPolicy::Hint => "HINT",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_parses_from_both_of_its_names() {
        use ShardingPolicy::*;
        for policy in [Off, Dynamic, File, Data, FileOrData, Hint] {
            assert_eq!(policy.processing_mode_name().parse(), Ok(policy));
            assert_eq!(policy.to_string().parse(), Ok(policy));
        }
    }
}
