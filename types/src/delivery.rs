//! `Delivery`: what a job promises about each element of an epoch when workers fail.
//!
//! The serde encoding is persisted by the dispatcher (the variant order is part of its on-disk
//! format); `FromStr` and `Display` are the client's spellings (`exactly_once`,
//! `at_most_once`).

use crate::invalid_value::InvalidValue;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How a job's elements reach its readers when workers die, restart or are removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Delivery {
    /// Every element of a finite epoch reaches the job's readers once: what a failed worker
    /// held and the readers had not received is produced again by another worker. Applies to
    /// `distributed_epoch` and the static sharding policies; other jobs deliver as
    /// `AtMostOnce`.
    #[default]
    ExactlyOnce,
    /// tf.data service's guarantee: what a failed worker held is lost, nothing is repeated.
    AtMostOnce,
}

impl Delivery {
    pub fn name(self) -> &'static str {
        match self {
            Delivery::ExactlyOnce => "exactly_once",
            Delivery::AtMostOnce => "at_most_once",
        }
    }
}

impl FromStr for Delivery {
    type Err = InvalidValue;

    /// `exactly_once` or `at_most_once` (a dash works as the underscore, any case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "exactly_once" => Ok(Delivery::ExactlyOnce),
            "at_most_once" => Ok(Delivery::AtMostOnce),
            _ => Err(InvalidValue(format!(
                "invalid delivery '{s}': expected exactly_once or at_most_once"
            ))),
        }
    }
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip_and_garbage_is_named() {
        for d in [Delivery::ExactlyOnce, Delivery::AtMostOnce] {
            assert_eq!(d.name().parse::<Delivery>(), Ok(d));
        }
        assert_eq!("At-Most-Once".parse(), Ok(Delivery::AtMostOnce));
        let err = "twice".parse::<Delivery>().unwrap_err();
        assert!(err.0.contains("'twice'"), "{err:?}");
    }
}
