//! `RequestLog`: the outcomes of retryable requests, kept so a retry is answered, never applied
//! twice, and forgotten once the requester can no longer retry.
//!
//! Each request carries its requester's *watermark*: the lowest sequence number the requester
//! still awaits an answer for. Outcomes below it are dropped, and a request below it is refused:
//! the requester said it was answered, so this can only be a stale duplicate. A requester
//! never sends a watermark above its oldest unanswered request, so one slow request keeps its
//! outcome however many others the requester makes meanwhile (a window of the last N outcomes
//! would evict it).
//!
//! Bounds:
//! - per requester, at most [`MAX_OUTCOMES_PER_REQUESTER`] outcomes at or above its watermark; a
//!   request past that is refused (not applied, not recorded), so a requester that never raises
//!   its watermark cannot grow the state;
//! - a requester silent for [`REQUESTER_TTL_MICROS`] of log time is forgotten whole. Requesters
//!   are processes: every client and worker draws one at start, so the set of requesters would
//!   otherwise grow with every process ever started. A retry arrives within seconds, and callers
//!   give up on a call after an hour; a retry after two hours of silence would be the one case
//!   not deduplicated.
//!
//! Everything here is a function of the log (times are the entries' leader times), so every
//! replica keeps and forgets the same outcomes.

use crate::state::update::{Outcome, Rejection, RequestId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Outcomes one requester may have recorded at or above its watermark.
pub const MAX_OUTCOMES_PER_REQUESTER: usize = 4096;

/// A requester whose last request is older than this (log time) is forgotten: two hours, twice
/// the longest a client or worker keeps retrying one call.
pub const REQUESTER_TTL_MICROS: u64 = 2 * 3600 * 1_000_000;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Requester {
    /// Requests below this were answered; their outcomes are gone.
    watermark: u64,
    outcomes: BTreeMap<u64, Outcome>,
    /// Log time of the requester's latest request (its key in `by_last_seen`).
    last_seen_micros: u64,
}

/// What `RequestLog::admit` decided about a request.
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// Seen before: this is its recorded outcome.
    Recorded(Outcome),
    /// Refused without applying it.
    Refused(Rejection),
    /// New: apply it, then `record` the outcome.
    Apply,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestLog {
    requesters: BTreeMap<u64, Requester>,
    /// `(last_seen_micros, requester)`: the oldest requesters first, for expiry.
    by_last_seen: BTreeSet<(u64, u64)>,
}

impl RequestLog {
    /// Looks `id` up at log time `now_micros`: raises the requester's watermark, forgets what
    /// fell below it and requesters silent for too long, and says what to do with the request.
    pub fn admit(&mut self, id: RequestId, now_micros: u64) -> Admission {
        let requester = self.requesters.entry(id.requester).or_default();
        self.by_last_seen
            .remove(&(requester.last_seen_micros, id.requester));
        requester.last_seen_micros = requester.last_seen_micros.max(now_micros);
        self.by_last_seen
            .insert((requester.last_seen_micros, id.requester));

        // The request itself awaits an answer, so the watermark cannot pass it.
        let watermark = id.watermark.min(id.seq);
        if watermark > requester.watermark {
            requester.watermark = watermark;
            requester.outcomes = requester.outcomes.split_off(&watermark);
        }
        if let Some(outcome) = requester.outcomes.get(&id.seq) {
            return Admission::Recorded(outcome.clone());
        }
        if id.seq < requester.watermark {
            return Admission::Refused(Rejection::FailedPrecondition(format!(
                "request {} of requester {} is below the requester's watermark {}: it was \
                 answered before, and is not applied again",
                id.seq, id.requester, requester.watermark
            )));
        }
        if requester.outcomes.len() >= MAX_OUTCOMES_PER_REQUESTER {
            return Admission::Refused(Rejection::Busy(format!(
                "requester {} has {MAX_OUTCOMES_PER_REQUESTER} answered requests above its \
                 watermark {}; request {} was not applied (retry once earlier requests are \
                 acknowledged)",
                id.requester, requester.watermark, id.seq
            )));
        }
        Admission::Apply
    }

    /// Records the outcome of a request `admit` let through.
    pub fn record(&mut self, id: RequestId, outcome: Outcome) {
        if let Some(requester) = self.requesters.get_mut(&id.requester) {
            requester.outcomes.insert(id.seq, outcome);
        }
    }

    /// Whether `id`'s outcome is recorded (a retry of it would get that outcome).
    pub fn has_outcome(&self, id: RequestId) -> bool {
        self.requesters
            .get(&id.requester)
            .is_some_and(|r| r.outcomes.contains_key(&id.seq))
    }

    /// Outcomes recorded, over all requesters.
    pub fn len(&self) -> usize {
        self.requesters.values().map(|r| r.outcomes.len()).sum()
    }

    /// Requesters remembered.
    pub fn requesters(&self) -> usize {
        self.requesters.len()
    }

    /// Forgets the requesters silent since before `now_micros - REQUESTER_TTL_MICROS`.
    pub fn expire(&mut self, now_micros: u64) {
        let cutoff = now_micros.saturating_sub(REQUESTER_TTL_MICROS);
        while let Some(&(seen, requester)) = self.by_last_seen.first() {
            if seen >= cutoff {
                break;
            }
            self.by_last_seen.pop_first();
            self.requesters.remove(&requester);
        }
    }
}
