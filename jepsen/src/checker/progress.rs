//! (c) Progress: within 15 s of the heal there is a leader, and a fresh epoch (the harness's
//! `final` client, no faults any more) completes with every split delivered exactly once; and,
//! when a bound is given (`--max-delivery-gap`), no delivery gap of the fault phase held to it
//! (see `gaps`) is longer.
//!
//! A run that never reached the heal is `unknown` (the harness failed); a cluster that healed
//! but did not make progress in time is `invalid` (a liveness bug).

use super::gaps::delivery_gaps;
use super::{heal_time, CheckResult, Verdict, PROGRESS_DEADLINE_MS};
use crate::history::{Event, Kind};
use std::collections::BTreeSet;
use std::time::Duration;

pub fn check(events: &[Event], max_gap: Option<Duration>) -> CheckResult {
    let mut result = CheckResult::new("progress");
    let gaps = delivery_gaps(events);
    result.count("longest_gap_ms", gaps.longest.map_or(0, |g| g.ms()));
    result.count(
        "longest_bounded_gap_ms",
        gaps.longest_bounded.map_or(0, |g| g.ms()),
    );
    if let (Some(bound), Some(gap)) = (max_gap, gaps.longest_bounded) {
        if u128::from(gap.ms()) > bound.as_millis() {
            let during: Vec<String> = gaps
                .faults
                .iter()
                .filter(|f| gap.start_ms >= f.start_ms && gap.start_ms < f.end_ms)
                .map(|f| format!("#{} {}", f.fault, f.kind))
                .collect();
            result.flag(
                Verdict::Invalid,
                format!(
                    "no element was delivered for {} ms from {} ms (during {}), over the bound of {} ms",
                    gap.ms(),
                    gap.start_ms,
                    if during.is_empty() { "no fault".to_string() } else { during.join(", ") },
                    bound.as_millis()
                ),
            );
        }
    }
    let Some(healed) = heal_time(events) else {
        result.flag(
            Verdict::Unknown,
            "the run never reached the heal phase".into(),
        );
        return result;
    };
    let deadline = healed + PROGRESS_DEADLINE_MS;
    let after_heal = || events.iter().filter(|e| e.t_ms >= healed);

    let leader = after_heal()
        .find(|e| e.process == "monitor" && e.f == "leader")
        .map(|e| e.t_ms)
        .or_else(|| {
            after_heal()
                .find(|e| e.f == "final-status" && e.value["status"]["state"] == "Leader")
                .map(|e| e.t_ms)
        });
    match leader {
        Some(t) => result.count("leader_ms_after_heal", t - healed),
        None => result.flag(Verdict::Invalid, "no leader seen after the heal".into()),
    }

    let done =
        after_heal().find(|e| e.process == "final" && e.f == "epoch" && e.kind != Kind::Invoke);
    let Some(done) = done else {
        result.flag(Verdict::Invalid, "the final epoch never ended".into());
        return result;
    };
    let job = done.value["job"].as_str().unwrap_or_default();
    if done.kind != Kind::Ok {
        result.flag(
            Verdict::Invalid,
            format!("the final epoch {job} failed: {}", done.value["error"]),
        );
    } else if done.t_ms > deadline {
        result.flag(
            Verdict::Invalid,
            format!(
                "the final epoch completed {} ms after the heal (limit {PROGRESS_DEADLINE_MS} ms)",
                done.t_ms - healed
            ),
        );
    }
    result.count(
        "final_epoch_ms_after_heal",
        done.t_ms.saturating_sub(healed),
    );
    let expected = events
        .iter()
        .find(|e| e.process == "final" && e.f == "epoch" && e.kind == Kind::Invoke)
        .and_then(|e| e.value["splits"].as_u64())
        .unwrap_or(0);
    let received: BTreeSet<i64> = events
        .iter()
        .filter(|e| e.process == "final" && e.f == "element" && e.value["job"] == job)
        .filter_map(|e| e.value["split"].as_i64())
        .collect();
    result.count("final_epoch_splits", received.len() as u64);
    if done.kind == Kind::Ok && (received.len() as u64) < expected {
        result.flag(
            Verdict::Invalid,
            format!(
                "the fault-free final epoch lost {} of {expected} splits",
                expected - received.len() as u64
            ),
        );
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::fixtures::*;
    use serde_json::json;

    fn run(final_done_at: u64, final_kind: Kind, splits: u64) -> Vec<Event> {
        let mut h = vec![
            ev(1000, "harness", Kind::Ok, "heal", json!({})),
            ev(
                1500,
                "monitor",
                Kind::Ok,
                "leader",
                json!({"node": 2, "term": 5}),
            ),
            ev(
                1600,
                "final",
                Kind::Invoke,
                "epoch",
                json!({"job": "f", "splits": 3}),
            ),
        ];
        for s in 0..splits {
            h.push(element(1700, "final", "f", s));
        }
        h.push(ev(
            final_done_at,
            "final",
            final_kind,
            "epoch",
            json!({"job": "f"}),
        ));
        h
    }

    #[test]
    fn a_complete_final_epoch_in_time_is_progress() {
        let r = check(&run(4000, Kind::Ok, 3), None);
        assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.problems);
    }

    #[test]
    fn a_late_or_failed_or_short_final_epoch_is_not() {
        assert_eq!(
            check(&run(17_000, Kind::Ok, 3), None).verdict,
            Verdict::Invalid
        );
        assert_eq!(
            check(&run(4000, Kind::Info, 1), None).verdict,
            Verdict::Invalid
        );
        assert_eq!(
            check(&run(4000, Kind::Ok, 2), None).verdict,
            Verdict::Invalid
        );
    }

    #[test]
    fn a_gap_over_the_bound_fails_the_run() {
        let mut h = vec![
            ev(0, "nemesis", Kind::Ok, "pause", json!({"fault": 1})),
            ev(0, "client-1", Kind::Invoke, "epoch", json!({"job": "a"})),
            element(100, "client-1", "a", 0),
            element(2100, "client-1", "a", 1),
            ev(2200, "client-1", Kind::Ok, "epoch", json!({"job": "a"})),
            ev(2500, "nemesis", Kind::Ok, "recover", json!({"fault": 1})),
        ];
        h.extend(run(4000, Kind::Ok, 3).into_iter().map(|mut e| {
            e.t_ms += 2600;
            e
        }));
        // (bound, verdict)
        let cases = [
            (None, Verdict::Valid),
            (Some(Duration::from_millis(2500)), Verdict::Valid),
            (Some(Duration::from_millis(1500)), Verdict::Invalid),
        ];
        for (bound, verdict) in cases {
            let r = check(&h, bound);
            assert_eq!(r.verdict, verdict, "{bound:?}: {:?}", r.problems);
            assert_eq!(r.counts["longest_bounded_gap_ms"], 2000);
        }
    }

    #[test]
    fn no_heal_is_unknown() {
        let h = vec![ev(
            1,
            "monitor",
            Kind::Ok,
            "leader",
            json!({"node": 1, "term": 1}),
        )];
        assert_eq!(check(&h, None).verdict, Verdict::Unknown);
    }
}
