//! Tests of the proposer against a fake log: group commit, the bounds of an entry, failures
//! fanned out to every caller, the entry's time stamp, and the typed replies.
//!
//! Requests are queued deterministically: a caller's request enters the proposer's queue on
//! the first poll of `propose`, so each test polls its callers once (`queue`) while the log
//! holds the only in-flight slot, then releases the slot.

use super::*;
use crate::raft_types::NodeInfo;
use crate::state::Rejection;
use futures::future::BoxFuture;
use futures::poll;
use sluice_types::{JobId, LeaseRequest};
use std::task::Poll;

type Answer = oneshot::Sender<Result<Outcomes, RaftFailure>>;

/// A log whose entries the test receives and answers by hand.
struct FakeLog {
    entries: mpsc::UnboundedSender<(Proposal, Answer)>,
}

impl LogWriter for FakeLog {
    type Committed = BoxFuture<'static, Result<Outcomes, RaftFailure>>;

    async fn submit(&self, proposal: Proposal) -> Result<Self::Committed, RaftFailure> {
        let (answer, answered) = oneshot::channel();
        self.entries
            .send((proposal, answer))
            .map_err(|_| RaftFailure::Stopped("the test ended".into()))?;
        Ok(Box::pin(async move {
            answered
                .await
                .unwrap_or_else(|_| Err(RaftFailure::Stopped("unanswered".into())))
        }))
    }
}

struct Log {
    entries: mpsc::UnboundedReceiver<(Proposal, Answer)>,
}

impl Log {
    async fn next(&mut self) -> (Proposal, Answer) {
        tokio::time::timeout(Duration::from_secs(10), self.entries.recv())
            .await
            .expect("an entry is proposed within 10 s")
            .expect("the proposer is running")
    }

    /// Receives the next entry and answers each request with its own outcome.
    async fn commit_next(&mut self) -> Vec<u64> {
        let (proposal, answer) = self.next().await;
        let _ = answer.send(Ok(outcomes(&proposal)));
        jobs(&proposal)
    }
}

fn start(limits: BatchLimits) -> (ProposerHandle, Log) {
    let (tx, rx) = mpsc::unbounded_channel();
    let handle = ProposerHandle::spawn_with(FakeLog { entries: tx }, limits);
    (handle, Log { entries: rx })
}

fn one_slot(max_requests: usize, max_bytes: usize) -> BatchLimits {
    BatchLimits {
        max_requests,
        max_bytes,
        max_in_flight: 1,
    }
}

/// A request told apart by its job id.
fn ask(job: u64) -> Request {
    Request {
        id: None,
        update: Update::GetOrCreateIteration {
            job_id: JobId(job),
            repetition: 0,
        },
    }
}

/// A request of about `bytes` estimated bytes (64 fixed plus the address).
fn sized(job: u64, bytes: usize) -> Request {
    Request {
        id: Some(RequestId {
            requester: 1,
            seq: job,
            watermark: 0,
        }),
        update: Update::RemoveWorker {
            // Zero-padded by hand: a format width stops at 65,535.
            address: {
                let digits = job.to_string();
                "0".repeat(bytes - 64 - digits.len()) + &digits
            },
        },
    }
}

fn job_of(request: &Request) -> u64 {
    match &request.update {
        Update::GetOrCreateIteration { job_id, .. } => job_id.0,
        Update::RemoveWorker { address } => address.parse().expect("a numbered address"),
        other => panic!("the tests propose no {other:?}"),
    }
}

fn jobs(proposal: &Proposal) -> Vec<u64> {
    proposal.requests.iter().map(job_of).collect()
}

/// Each request's outcome names its own job, so a caller can tell it got its own.
fn outcomes(proposal: &Proposal) -> Outcomes {
    Outcomes(
        proposal
            .requests
            .iter()
            .map(|r| Outcome::Job {
                job_id: JobId(job_of(r)),
            })
            .collect(),
    )
}

type Caller = BoxFuture<'static, Result<Outcome, DispatcherError>>;

/// Starts a caller and polls it once, which puts its request into the proposer's queue.
async fn queue(handle: &ProposerHandle, request: Request) -> Caller {
    let handle = handle.clone();
    let mut caller: Caller = Box::pin(async move { handle.propose(request).await });
    assert!(matches!(poll!(&mut caller), Poll::Pending));
    caller
}

async fn job_outcome(caller: Caller) -> u64 {
    match caller.await {
        Ok(Outcome::Job { job_id }) => job_id.0,
        other => panic!("expected a job outcome, got {other:?}"),
    }
}

#[tokio::test]
async fn requests_queued_behind_an_entry_in_flight_share_the_next_entry() {
    let (handle, mut log) = start(one_slot(1024, 1 << 20));
    let first = queue(&handle, ask(1)).await;
    let (entry, answer) = log.next().await;
    assert_eq!(jobs(&entry), [1]);
    let mut waiting = Vec::new();
    for job in 2..=5 {
        waiting.push(queue(&handle, ask(job)).await);
    }
    let _ = answer.send(Ok(outcomes(&entry)));
    assert_eq!(job_outcome(first).await, 1);
    assert_eq!(log.commit_next().await, [2, 3, 4, 5]);
    for (caller, job) in waiting.into_iter().zip(2..) {
        assert_eq!(
            job_outcome(caller).await,
            job,
            "each caller gets its own outcome"
        );
    }
}

#[tokio::test]
async fn an_entry_holds_at_most_max_requests() {
    let (handle, mut log) = start(one_slot(2, 1 << 20));
    let first = queue(&handle, ask(1)).await;
    let (entry, answer) = log.next().await;
    let mut waiting = Vec::new();
    for job in 2..=6 {
        waiting.push(queue(&handle, ask(job)).await);
    }
    let _ = answer.send(Ok(outcomes(&entry)));
    assert_eq!(log.commit_next().await, [2, 3]);
    assert_eq!(log.commit_next().await, [4, 5]);
    assert_eq!(log.commit_next().await, [6]);
    assert_eq!(job_outcome(first).await, 1);
    for (caller, job) in waiting.into_iter().zip(2..) {
        assert_eq!(job_outcome(caller).await, job);
    }
}

#[tokio::test]
async fn an_entry_stops_growing_at_max_bytes_and_a_large_request_goes_alone() {
    let (handle, mut log) = start(one_slot(1024, 400));
    let first = queue(&handle, sized(1, 100)).await;
    let (entry, answer) = log.next().await;
    let mut waiting = Vec::new();
    for (job, bytes) in [(2, 150), (3, 150), (4, 150), (5, 1000), (6, 150)] {
        waiting.push(queue(&handle, sized(job, bytes)).await);
    }
    let _ = answer.send(Ok(outcomes(&entry)));
    // 150 + 150 fit in 400; a third would not, and opens the next entry.
    assert_eq!(log.commit_next().await, [2, 3]);
    assert_eq!(log.commit_next().await, [4]);
    assert_eq!(log.commit_next().await, [5]);
    assert_eq!(log.commit_next().await, [6]);
    assert_eq!(job_outcome(first).await, 1);
    for (caller, job) in waiting.into_iter().zip(2..) {
        assert_eq!(job_outcome(caller).await, job);
    }
}

// On tokio's paused clock: a caller gives up after the proposer's commit timeout (3 s), and
// moving a 48 MiB request through a debug build on a loaded machine took longer than that of
// wall time. Paused, time moves only when every task waits, which here only a hang does.
#[tokio::test(start_paused = true)]
async fn by_default_an_entry_gathers_about_one_mebibyte_and_a_large_request_goes_alone() {
    const MIB: usize = 1024 * 1024;
    let limits = BatchLimits {
        max_in_flight: 1,
        ..BatchLimits::default()
    };
    assert_eq!(limits.max_bytes, MIB);
    let (handle, mut log) = start(limits);
    let first = queue(&handle, ask(1)).await;
    let (entry, answer) = log.next().await;
    let mut waiting = Vec::new();
    // Four of these (a definition part's size, less a little) fit in one entry.
    let part = DEFINITION_PART_BYTES - 1024;
    for job in 2..=7 {
        waiting.push(queue(&handle, sized(job, part)).await);
    }
    // A request over the bound behind them, then small ones again.
    waiting.push(queue(&handle, sized(8, 48 * MIB)).await);
    waiting.push(queue(&handle, sized(9, part)).await);
    let _ = answer.send(Ok(outcomes(&entry)));
    assert_eq!(log.commit_next().await, [2, 3, 4, 5]);
    assert_eq!(log.commit_next().await, [6, 7]);
    assert_eq!(log.commit_next().await, [8]);
    assert_eq!(log.commit_next().await, [9]);
    assert_eq!(job_outcome(first).await, 1);
    for (caller, job) in waiting.into_iter().zip(2..) {
        assert_eq!(job_outcome(caller).await, job);
    }
}

#[tokio::test]
async fn a_failed_entry_fails_every_caller_in_it() {
    let (handle, mut log) = start(one_slot(1024, 1 << 20));
    let first = queue(&handle, ask(1)).await;
    let (entry, answer) = log.next().await;
    let mut waiting = Vec::new();
    for job in 2..=4 {
        waiting.push(queue(&handle, ask(job)).await);
    }
    let _ = answer.send(Ok(outcomes(&entry)));
    assert_eq!(job_outcome(first).await, 1);
    let (entry, answer) = log.next().await;
    assert_eq!(jobs(&entry), [2, 3, 4]);
    let leader = NodeInfo {
        addr: "127.0.0.1:7003".into(),
        peer_addr: "127.0.0.1:8003".into(),
    };
    let _ = answer.send(Err(RaftFailure::ForwardToLeader(Some(leader))));
    for caller in waiting {
        match caller.await {
            Err(DispatcherError::NotLeader { leader }) => {
                assert_eq!(leader.as_deref(), Some("127.0.0.1:7003"))
            }
            other => panic!("expected NotLeader, got {other:?}"),
        }
    }
    // The proposer goes on: the next request gets an entry of its own.
    let next = queue(&handle, ask(9)).await;
    assert_eq!(log.commit_next().await, [9]);
    assert_eq!(job_outcome(next).await, 9);
}

#[tokio::test]
async fn each_entry_is_stamped_once_with_the_leader_clock() {
    let (handle, mut log) = start(BatchLimits::default());
    let before = now_micros();
    let caller = queue(&handle, ask(1)).await;
    let (entry, answer) = log.next().await;
    let after = now_micros();
    assert!(
        (before..=after).contains(&entry.time_micros),
        "{before} <= {} <= {after}",
        entry.time_micros
    );
    let _ = answer.send(Ok(outcomes(&entry)));
    assert_eq!(job_outcome(caller).await, 1);
}

/// Runs one typed `lease_splits` whose entry the log answers with `outcome`.
async fn lease_answered_with(outcome: Outcome) -> Result<SplitLease, DispatcherError> {
    let (handle, mut log) = start(BatchLimits::default());
    let lease = tokio::spawn(async move {
        handle
            .lease_splits(
                None,
                LeaseRequest {
                    iteration_id: IterationId(1),
                    provider: 0,
                    repetition: 0,
                    max_splits: 4,
                    task_id: TaskId(1),
                },
            )
            .await
    });
    let (entry, answer) = log.next().await;
    assert!(matches!(
        entry.requests[0].update,
        Update::LeaseSplits(LeaseRequest { max_splits: 4, .. })
    ));
    let _ = answer.send(Ok(Outcomes(vec![outcome])));
    lease.await.expect("the caller does not panic")
}

#[tokio::test]
async fn a_typed_method_returns_its_reply_a_rejection_or_an_unexpected_outcome_error() {
    let lease = SplitLease {
        repetition: 0,
        start: 0,
        end: 4,
        end_of_splits: false,
    };
    assert_eq!(
        lease_answered_with(Outcome::Splits(lease)).await.unwrap(),
        lease
    );
    let rejection = Rejection::NotFound("Iteration id 1 not found".into());
    match lease_answered_with(Outcome::Rejected(rejection.clone())).await {
        Err(DispatcherError::Rejected(r)) => assert_eq!(r, rejection),
        other => panic!("expected the rejection, got {other:?}"),
    }
    match lease_answered_with(Outcome::TaskRemoved).await {
        Err(DispatcherError::UnexpectedOutcome { update, outcome }) => {
            assert_eq!(update, "lease_splits");
            assert_eq!(outcome, "TaskRemoved");
        }
        other => panic!("expected UnexpectedOutcome, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stopped_proposer_fails_callers_as_raft_stopped() {
    let (handle, log) = start(BatchLimits::default());
    drop(log);
    // The fake log refuses the entry: the caller hears that Raft stopped.
    match handle.propose(ask(1)).await {
        Err(DispatcherError::RaftStopped(_)) => {}
        other => panic!("expected RaftStopped, got {other:?}"),
    }
}
