//! The protobuf forms of the shared types (`sluice_types`): one conversion per message family,
//! used by both ends of the wire (the worker and the client here, the dispatcher's service).
//!
//! The shared types and the protobuf messages both belong to other crates, so the conversions
//! are this crate's traits, [`FromProto`] (a `TryFrom`) and [`ToProto`]. A protobuf enum value
//! the type does not have is an [`InvalidValue`] naming the field and the value, never a
//! default.

use crate::error::RpcError;
use sluice_proto::dispatcher as pb;
use sluice_types::{
    Delivery, InvalidValue, IterationId, LeaseRequest, ShardingPolicy, SplitLease, TargetWorkers,
    TaskId,
};

/// A shared type read from its protobuf form `P`: `TryFrom<P>`.
pub trait FromProto<P>: Sized {
    fn from_proto(proto: P) -> Result<Self, InvalidValue>;
}

/// A shared type's protobuf form.
pub trait ToProto {
    type Proto;
    fn to_proto(&self) -> Self::Proto;
}

impl From<InvalidValue> for RpcError {
    fn from(e: InvalidValue) -> Self {
        RpcError::InvalidArgument(e.0)
    }
}

impl ToProto for ShardingPolicy {
    type Proto = pb::ShardingPolicy;

    fn to_proto(&self) -> pb::ShardingPolicy {
        match self {
            ShardingPolicy::Off => pb::ShardingPolicy::Off,
            ShardingPolicy::Dynamic => pb::ShardingPolicy::Dynamic,
            ShardingPolicy::File => pb::ShardingPolicy::File,
            ShardingPolicy::Data => pb::ShardingPolicy::Data,
            ShardingPolicy::FileOrData => pb::ShardingPolicy::FileOrData,
            ShardingPolicy::Hint => pb::ShardingPolicy::Hint,
        }
    }
}

impl FromProto<i32> for ShardingPolicy {
    /// A message's `sharding_policy` field.
    fn from_proto(value: i32) -> Result<Self, InvalidValue> {
        Ok(match pb::ShardingPolicy::try_from(value) {
            Ok(pb::ShardingPolicy::Off) => ShardingPolicy::Off,
            Ok(pb::ShardingPolicy::Dynamic) => ShardingPolicy::Dynamic,
            Ok(pb::ShardingPolicy::File) => ShardingPolicy::File,
            Ok(pb::ShardingPolicy::Data) => ShardingPolicy::Data,
            Ok(pb::ShardingPolicy::FileOrData) => ShardingPolicy::FileOrData,
            Ok(pb::ShardingPolicy::Hint) => ShardingPolicy::Hint,
            Err(_) => {
                return Err(InvalidValue(format!(
                    "sharding_policy {value} is not a valid sharding policy"
                )))
            }
        })
    }
}

impl ToProto for TargetWorkers {
    type Proto = pb::TargetWorkers;

    fn to_proto(&self) -> pb::TargetWorkers {
        match self {
            TargetWorkers::Auto => pb::TargetWorkers::Auto,
            TargetWorkers::Any => pb::TargetWorkers::Any,
            TargetWorkers::Local => pb::TargetWorkers::Local,
        }
    }
}

impl FromProto<i32> for TargetWorkers {
    /// A message's `target_workers` field.
    fn from_proto(value: i32) -> Result<Self, InvalidValue> {
        match pb::TargetWorkers::try_from(value) {
            Ok(pb::TargetWorkers::Auto) => Ok(TargetWorkers::Auto),
            Ok(pb::TargetWorkers::Any) => Ok(TargetWorkers::Any),
            Ok(pb::TargetWorkers::Local) => Ok(TargetWorkers::Local),
            Err(_) => Err(InvalidValue(format!(
                "Unrecognized target workers: {value}"
            ))),
        }
    }
}

impl ToProto for Delivery {
    type Proto = pb::Delivery;

    fn to_proto(&self) -> pb::Delivery {
        match self {
            Delivery::ExactlyOnce => pb::Delivery::ExactlyOnce,
            Delivery::AtMostOnce => pb::Delivery::AtMostOnce,
        }
    }
}

impl FromProto<i32> for Delivery {
    /// A message's `delivery` field (unspecified is exactly once).
    fn from_proto(value: i32) -> Result<Self, InvalidValue> {
        match pb::Delivery::try_from(value) {
            Ok(pb::Delivery::Unspecified | pb::Delivery::ExactlyOnce) => Ok(Delivery::ExactlyOnce),
            Ok(pb::Delivery::AtMostOnce) => Ok(Delivery::AtMostOnce),
            Err(_) => Err(InvalidValue(format!("Unrecognized delivery: {value}"))),
        }
    }
}

/// The request without its request id (the caller's, one per call and kept across retries).
impl ToProto for LeaseRequest {
    type Proto = pb::LeaseSplitsRequest;

    fn to_proto(&self) -> pb::LeaseSplitsRequest {
        pb::LeaseSplitsRequest {
            iteration_id: self.iteration_id.0,
            provider_index: self.provider,
            repetition: self.repetition,
            max_splits: self.max_splits,
            task_id: self.task_id.0,
            request_id: None,
        }
    }
}

/// The lease a request asks for (its request id is read on its own).
impl FromProto<&pb::LeaseSplitsRequest> for LeaseRequest {
    fn from_proto(request: &pb::LeaseSplitsRequest) -> Result<Self, InvalidValue> {
        Ok(LeaseRequest {
            iteration_id: IterationId(request.iteration_id),
            provider: request.provider_index,
            repetition: request.repetition,
            max_splits: request.max_splits,
            task_id: TaskId(request.task_id),
        })
    }
}

impl ToProto for SplitLease {
    type Proto = pb::LeaseSplitsResponse;

    fn to_proto(&self) -> pb::LeaseSplitsResponse {
        pb::LeaseSplitsResponse {
            start: self.start,
            end: self.end,
            end_of_splits: self.end_of_splits,
            repetition: self.repetition,
        }
    }
}

impl FromProto<pb::LeaseSplitsResponse> for SplitLease {
    fn from_proto(response: pb::LeaseSplitsResponse) -> Result<Self, InvalidValue> {
        Ok(SplitLease {
            repetition: response.repetition,
            start: response.start,
            end: response.end,
            end_of_splits: response.end_of_splits,
        })
    }
}

/// One lease's answer as a batch reply carries it: the lease, or the status its own
/// `LeaseSplits` call would have failed with. (`lease_result` reads it back.)
pub fn lease_splits_result(
    outcome: Result<pb::LeaseSplitsResponse, tonic::Status>,
) -> pb::LeaseSplitsResult {
    let result = match outcome {
        Ok(lease) => pb::lease_splits_result::Result::Lease(lease),
        Err(refused) => pb::lease_splits_result::Result::Refusal(pb::LeaseRefusal {
            code: refused.code() as i32,
            message: refused.message().to_string(),
        }),
    };
    pb::LeaseSplitsResult {
        result: Some(result),
    }
}

/// One lease's answer in a batch reply.
pub(crate) fn lease_result(
    result: pb::LeaseSplitsResult,
) -> Result<pb::LeaseSplitsResponse, RpcError> {
    match result.result {
        Some(pb::lease_splits_result::Result::Lease(lease)) => Ok(lease),
        Some(pb::lease_splits_result::Result::Refusal(refusal)) => Err(RpcError::from_status(
            &tonic::Status::new(tonic::Code::from(refusal.code), refusal.message),
        )),
        None => Err(RpcError::Status {
            code: tonic::Code::Internal,
            message: "the dispatcher answered a lease with neither a lease nor a refusal".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_round_trips_through_proto() {
        use ShardingPolicy::*;
        for policy in [Off, Dynamic, File, Data, FileOrData, Hint] {
            assert_eq!(
                ShardingPolicy::from_proto(policy.to_proto() as i32),
                Ok(policy)
            );
        }
        assert_eq!(
            ShardingPolicy::from_proto(99).unwrap_err().to_string(),
            "sharding_policy 99 is not a valid sharding policy"
        );
    }

    #[test]
    fn every_target_workers_round_trips_through_proto() {
        for target in [
            TargetWorkers::Auto,
            TargetWorkers::Any,
            TargetWorkers::Local,
        ] {
            assert_eq!(
                TargetWorkers::from_proto(target.to_proto() as i32),
                Ok(target)
            );
        }
        assert_eq!(
            TargetWorkers::from_proto(7).unwrap_err().to_string(),
            "Unrecognized target workers: 7"
        );
    }

    #[test]
    fn a_lease_round_trips_through_proto() {
        let lease = LeaseRequest {
            iteration_id: IterationId(2000),
            provider: 1,
            repetition: 3,
            max_splits: 4,
            task_id: TaskId(4000),
        };
        assert_eq!(LeaseRequest::from_proto(&lease.to_proto()), Ok(lease));
        let granted = SplitLease {
            repetition: 3,
            start: 5,
            end: 9,
            end_of_splits: false,
        };
        assert_eq!(SplitLease::from_proto(granted.to_proto()), Ok(granted));
    }
}
