//! `TargetWorkers`: which workers a job's clients read from (tf.data's `target_workers`), the one
//! definition the client and the dispatcher's replicated state share (its protobuf form is read
//! and written in `sluice_rpc::convert`). The serde encoding is persisted by the dispatcher: the
//! variant order is part of its on-disk format.

use crate::invalid_value::InvalidValue;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Which workers a client reads from (tf.data's `TargetWorkers`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetWorkers {
    /// Every worker except remote workers tagged `COLOCATED` (avoids cross-host reads).
    #[default]
    Auto,
    /// Every worker.
    Any,
    /// Only workers running in the client's process.
    Local,
}

impl FromStr for TargetWorkers {
    type Err = InvalidValue;

    /// `auto` (also the empty string), `any` or `local`, case-insensitive.
    fn from_str(s: &str) -> Result<Self, InvalidValue> {
        match s.to_ascii_uppercase().as_str() {
            "" | "AUTO" => Ok(TargetWorkers::Auto),
            "ANY" => Ok(TargetWorkers::Any),
            "LOCAL" => Ok(TargetWorkers::Local),
            _ => Err(InvalidValue(format!("Unrecognized target workers: {s}"))),
        }
    }
}

impl fmt::Display for TargetWorkers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TargetWorkers::Auto => "AUTO",
            TargetWorkers::Any => "ANY",
            TargetWorkers::Local => "LOCAL",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_workers_parse_case_insensitively() {
        assert_eq!("".parse::<TargetWorkers>().ok(), Some(TargetWorkers::Auto));
        assert_eq!(
            "any".parse::<TargetWorkers>().ok(),
            Some(TargetWorkers::Any)
        );
        assert_eq!(
            "Local".parse::<TargetWorkers>().ok(),
            Some(TargetWorkers::Local)
        );
        let error = "remote".parse::<TargetWorkers>().unwrap_err();
        assert_eq!(error.to_string(), "Unrecognized target workers: remote");
    }
}
