//! Retried requests: recorded outcomes returned again, requesters' watermarks, the bound on what
//! a requester keeps, and forgetting silent requesters.

use super::request_log::MAX_OUTCOMES_PER_REQUESTER;
use super::*;

#[test]
fn a_repeated_request_id_returns_the_recorded_outcome() {
    let mut state = DispatcherState::default();
    let id = |seq| {
        Some(RequestId {
            requester: 42,
            seq,
            watermark: 0,
        })
    };
    let apply = |state: &mut DispatcherState, seq, update: Update| {
        state.apply(
            ApplyContext::default(),
            &Request {
                id: id(seq),
                update,
            },
        )
    };
    assert_eq!(
        apply(&mut state, 1, register(None, b"a")),
        registered("1000")
    );
    assert_eq!(
        apply(&mut state, 1, register(None, b"a")),
        registered("1000"),
        "retry is not applied again"
    );
    assert_eq!(
        apply(&mut state, 2, register(None, b"a")),
        registered("1001")
    );
    apply(&mut state, 3, worker("w"));
    apply(&mut state, 4, job("1000", ShardingPolicy::Dynamic, None));
    apply(&mut state, 5, iteration(5000, 0));
    // A lease whose reply was lost and is retried returns the same range, not a new one.
    assert_eq!(
        apply(&mut state, 6, lease(2000, 4000, 0, 2)),
        splits(0, 0, 2)
    );
    assert_eq!(
        apply(&mut state, 6, lease(2000, 4000, 0, 2)),
        splits(0, 0, 2)
    );
    assert_eq!(
        apply(&mut state, 7, lease(2000, 4000, 0, 2)),
        splits(0, 2, 3)
    );
    // However many requests follow, a request at or above the watermark keeps its outcome.
    for seq in 8..8 + 200 {
        apply(&mut state, seq, release(9999));
    }
    assert_eq!(
        apply(&mut state, 6, lease(2000, 4000, 0, 2)),
        splits(0, 0, 2)
    );
}

/// Watermarks: `(seq, watermark, update, expected)` applied in order by requester 42.
#[test]
fn request_watermarks_table() {
    let mut state = DispatcherState::default();
    let refused_below = |seq: u64, watermark: u64| {
        precondition(&format!(
            "request {seq} of requester 42 is below the requester's watermark {watermark}: it \
             was answered before, and is not applied again"
        ))
    };
    let steps: Vec<(u64, u64, Update, Outcome)> = vec![
        (1, 1, register(None, b"a"), registered("1000")),
        (2, 1, register(None, b"b"), registered("1001")),
        // Seq 1 is still awaited (watermark 1): its retry gets the recorded outcome.
        (1, 1, register(None, b"a"), registered("1000")),
        // The requester now says everything below 3 was answered.
        (3, 3, register(None, b"c"), registered("1002")),
        (1, 3, register(None, b"a"), refused_below(1, 3)),
        (2, 1, register(None, b"b"), refused_below(2, 3)),
        // A watermark above the request's own seq counts as its seq.
        (5, 9, register(None, b"d"), registered("1003")),
        (4, 4, register(None, b"e"), refused_below(4, 5)),
        (5, 5, register(None, b"d"), registered("1003")),
    ];
    for (step, (seq, watermark, update, expected)) in steps.into_iter().enumerate() {
        let request = Request {
            id: Some(RequestId {
                requester: 42,
                seq,
                watermark,
            }),
            update,
        };
        let outcome = state.apply(ApplyContext::default(), &request);
        assert_eq!(
            outcome, expected,
            "step {step}: seq {seq} watermark {watermark}"
        );
    }
    assert_eq!(
        state.sizes().datasets,
        4,
        "refused requests changed nothing"
    );
}

#[test]
fn a_requester_that_never_raises_its_watermark_is_refused_not_grown() {
    let mut state = DispatcherState::default();
    let request = |seq| Request {
        id: Some(RequestId {
            requester: 7,
            seq,
            watermark: 0,
        }),
        update: release(9999),
    };
    for seq in 0..MAX_OUTCOMES_PER_REQUESTER as u64 {
        state.apply(ApplyContext::default(), &request(seq));
    }
    let refused = state.apply(
        ApplyContext::default(),
        &request(MAX_OUTCOMES_PER_REQUESTER as u64),
    );
    assert!(
        matches!(refused, Outcome::Rejected(Rejection::Busy(_))),
        "{refused:?}"
    );
    assert_eq!(state.sizes().recorded_outcomes, MAX_OUTCOMES_PER_REQUESTER);
}

#[test]
fn a_silent_requester_is_forgotten_after_the_ttl() {
    use super::request_log::REQUESTER_TTL_MICROS;
    let mut state = DispatcherState::default();
    let at = |time_micros| ApplyContext {
        log_index: 0,
        time_micros,
    };
    for requester in 0..100 {
        let request = Request {
            id: Some(RequestId {
                requester,
                seq: 1,
                watermark: 1,
            }),
            update: release(9999),
        };
        state.apply(at(requester), &request);
    }
    assert_eq!(state.sizes().requesters, 100);
    let later = Request {
        id: None,
        update: release(9999),
    };
    state.apply(at(50 + REQUESTER_TTL_MICROS), &later);
    assert_eq!(
        state.sizes().requesters,
        50,
        "the 50 silent longest are gone"
    );
    state.apply(at(1000 + REQUESTER_TTL_MICROS), &later);
    assert_eq!(state.sizes().requesters, 0);
}
