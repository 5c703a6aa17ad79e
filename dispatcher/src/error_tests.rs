//! The gRPC code of every `DispatcherError`, and the leader hint a not-leader status carries.

use super::*;
use tonic::Code;

fn code(err: DispatcherError) -> Code {
    tonic::Status::from(err).code()
}

#[test]
fn every_error_maps_to_its_grpc_code() {
    let journal = sluice_journal::JournalError::Codec {
        reason: "truncated".into(),
    };
    let cases = [
        (
            DispatcherError::NotLeader { leader: None },
            Code::Unavailable,
        ),
        (
            DispatcherError::QuorumUnavailable("q".into()),
            Code::Unavailable,
        ),
        (DispatcherError::RaftStopped("s".into()), Code::Unavailable),
        (
            DispatcherError::Rejected(Rejection::NotFound("n".into())),
            Code::NotFound,
        ),
        (
            DispatcherError::Rejected(Rejection::InvalidArgument("i".into())),
            Code::InvalidArgument,
        ),
        (
            DispatcherError::Rejected(Rejection::FailedPrecondition("f".into())),
            Code::FailedPrecondition,
        ),
        (
            DispatcherError::InvalidArgument("a".into()),
            Code::InvalidArgument,
        ),
        (
            DispatcherError::FileRefused("f".into()),
            Code::PermissionDenied,
        ),
        (DispatcherError::Journal(journal), Code::Internal),
        (DispatcherError::Startup("b".into()), Code::Internal),
        (
            DispatcherError::UnexpectedOutcome {
                update: "lease_splits",
                outcome: "TaskRemoved".into(),
            },
            Code::Internal,
        ),
    ];
    for (err, expected) in cases {
        let name = format!("{err:?}");
        assert_eq!(code(err), expected, "{name}");
    }
}

#[test]
fn the_codes_a_client_retries_are_the_retryable_errors() {
    let retryable = [
        DispatcherError::NotLeader { leader: None },
        DispatcherError::QuorumUnavailable("q".into()),
        DispatcherError::RaftStopped("s".into()),
    ];
    for err in retryable {
        assert!(err.is_retryable(), "{err:?}");
        assert_eq!(code(err), Code::Unavailable);
    }
}

#[test]
fn a_not_leader_status_carries_the_leader_address_in_metadata() {
    let status = tonic::Status::from(DispatcherError::NotLeader {
        leader: Some("127.0.0.1:7002".into()),
    });
    assert_eq!(status.code(), Code::Unavailable);
    let hint = status
        .metadata()
        .get(LEADER_METADATA_KEY)
        .expect("leader hint");
    assert_eq!(hint.to_str().unwrap(), "127.0.0.1:7002");
    assert!(
        status.message().contains("127.0.0.1:7002"),
        "{}",
        status.message()
    );
}

#[test]
fn a_not_leader_status_without_a_known_leader_has_no_hint() {
    let status = tonic::Status::from(DispatcherError::NotLeader { leader: None });
    assert_eq!(status.code(), Code::Unavailable);
    assert!(status.metadata().get(LEADER_METADATA_KEY).is_none());
    assert!(status.message().contains("no leader is known"));
}

#[test]
fn the_message_is_the_error_text() {
    let status = tonic::Status::from(DispatcherError::Rejected(Rejection::NotFound(
        "Task 4 not found".into(),
    )));
    assert_eq!(status.message(), "Task 4 not found");
}
