//! The options of `distribute` / `from_dataset_id` / `register_dataset`, with tf.data's names,
//! defaults and validation messages.

use crate::error::ClientError;
use sluice_proto::dispatcher as pb;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How a job's data is divided between workers (`ShardingPolicy` in tf.data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessingMode {
    /// "parallel_epochs": each worker produces the whole dataset.
    Off,
    /// "distributed_epoch": each split is produced by at most one worker.
    Dynamic,
    File,
    Data,
    FileOrData,
    Hint,
}

impl ProcessingMode {
    pub fn to_proto(self) -> pb::ShardingPolicy {
        match self {
            ProcessingMode::Off => pb::ShardingPolicy::Off,
            ProcessingMode::Dynamic => pb::ShardingPolicy::Dynamic,
            ProcessingMode::File => pb::ShardingPolicy::File,
            ProcessingMode::Data => pb::ShardingPolicy::Data,
            ProcessingMode::FileOrData => pb::ShardingPolicy::FileOrData,
            ProcessingMode::Hint => pb::ShardingPolicy::Hint,
        }
    }
}

impl FromStr for ProcessingMode {
    type Err = ClientError;

    /// Accepts `parallel_epochs`, `distributed_epoch` and the policy names, case-insensitive.
    fn from_str(s: &str) -> Result<Self, ClientError> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "parallel_epochs" | "off" => ProcessingMode::Off,
            "distributed_epoch" | "dynamic" => ProcessingMode::Dynamic,
            "file" => ProcessingMode::File,
            "data" => ProcessingMode::Data,
            "file_or_data" => ProcessingMode::FileOrData,
            "hint" => ProcessingMode::Hint,
            _ => {
                return Err(ClientError::InvalidArgument(format!(
                    "tf.data service processing mode should be a `ShardingPolicy`, \
                     `\"parallel_epochs\"`, or `\"distributed_epoch\"`. Got '{s}'."
                )))
            }
        })
    }
}

impl fmt::Display for ProcessingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProcessingMode::Off => "parallel_epochs",
            ProcessingMode::Dynamic => "distributed_epoch",
            ProcessingMode::File => "file",
            ProcessingMode::Data => "data",
            ProcessingMode::FileOrData => "file_or_data",
            ProcessingMode::Hint => "hint",
        })
    }
}

/// Element compression, chosen at registration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Snappy per element, skipped for elements that do not compress.
    #[default]
    Auto,
    None,
}

impl FromStr for Compression {
    type Err = ClientError;

    fn from_str(s: &str) -> Result<Self, ClientError> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Compression::Auto),
            "none" => Ok(Compression::None),
            _ => Err(ClientError::InvalidArgument(format!(
                "Invalid `compression` argument: {s}. Must be one of ['auto', 'none']."
            ))),
        }
    }
}

impl Compression {
    pub fn to_proto(self) -> pb::Compression {
        match self {
            Compression::Auto => pb::Compression::Auto,
            Compression::None => pb::Compression::None,
        }
    }

    pub(crate) fn from_proto(value: i32) -> Compression {
        match pb::Compression::try_from(value) {
            Ok(pb::Compression::None) => Compression::None,
            _ => Compression::Auto,
        }
    }
}

/// Options of `register_dataset`.
#[derive(Clone, Debug, Default)]
pub struct RegisterOptions {
    pub compression: Compression,
    /// An explicit id; re-registering the same id with the same dataset returns it.
    pub dataset_id: Option<String>,
}

/// Options of `distribute` and `from_dataset_id`.
#[derive(Clone, Debug)]
pub struct DistributeOptions {
    /// Consumers with the same job name share one job and split its data.
    pub job_name: Option<String>,
    /// Elements requested or buffered at most (memory ≤ element size × this); `None` autotunes.
    pub max_outstanding_requests: Option<u32>,
    /// Compression, when `distribute` registers the dataset.
    pub compression: Compression,
    /// How long a client heartbeat may wait for news (long poll).
    pub heartbeat_poll: Duration,
}

impl Default for DistributeOptions {
    fn default() -> Self {
        DistributeOptions {
            job_name: None,
            max_outstanding_requests: None,
            compression: Compression::Auto,
            heartbeat_poll: Duration::from_secs(1),
        }
    }
}

/// Elements in flight or buffered when `max_outstanding_requests` is not set.
pub const AUTOTUNE_OUTSTANDING: u32 = 256;

impl DistributeOptions {
    pub fn validate(&self) -> Result<(), ClientError> {
        if let Some(name) = &self.job_name {
            if name.is_empty() {
                return Err(ClientError::InvalidArgument(
                    "`job_name` must not be empty".into(),
                ));
            }
        }
        if self.max_outstanding_requests == Some(0) {
            return Err(ClientError::InvalidArgument(
                "max_outstanding_requests must be positive or -1".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn outstanding(&self) -> u32 {
        self.max_outstanding_requests
            .unwrap_or(AUTOTUNE_OUTSTANDING)
    }
}
