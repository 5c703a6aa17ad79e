//! (d) Coverage: a run whose planned faults did not happen proves nothing, so it is `unknown`,
//! never `valid`.
//!
//! Required: a non-empty schedule; every planned fault started (`ok`) and ended (`ok`); every
//! requested nemesis kind happened; at least one fault aimed at the leader actually hit the
//! leader of the moment; and the workload ran during the fault phase (elements received and
//! leases granted between the first fault and the heal; with the trainer nemesis, the trainer
//! restored from a state at least once and read elements after a restore).

use super::{heal_time, CheckResult, Verdict};
use crate::history::{Event, Kind};
use crate::schedule::Schedule;
use std::collections::BTreeSet;

pub fn check(events: &[Event], schedule: &Schedule) -> CheckResult {
    let mut result = CheckResult::new("coverage");
    if schedule.faults.is_empty() {
        result.flag(
            Verdict::Unknown,
            "the schedule holds no faults (run too short, or no nemesis)".into(),
        );
        return result;
    }
    let nemesis = || events.iter().filter(|e| e.process == "nemesis");
    let started: Vec<&Event> = nemesis()
        .filter(|e| e.kind == Kind::Ok && e.f != "recover")
        .collect();
    let ended: BTreeSet<u64> = nemesis()
        .filter(|e| e.kind == Kind::Ok && e.f == "recover")
        .filter_map(|e| e.value["fault"].as_u64())
        .collect();
    result.count("planned_faults", schedule.faults.len() as u64);
    for fault in &schedule.faults {
        let id = u64::from(fault.id);
        if !started
            .iter()
            .any(|e| e.value["fault"].as_u64() == Some(id))
        {
            result.flag(
                Verdict::Unknown,
                format!("fault #{id} ({}) did not start", fault.action.kind()),
            );
        } else if !ended.contains(&id) {
            result.flag(
                Verdict::Unknown,
                format!("fault #{id} ({}) was not undone", fault.action.kind()),
            );
        } else {
            result.count("faults_done", 1);
        }
    }
    for kind in &schedule.nemeses {
        if !started.iter().any(|e| e.f == kind.name()) {
            result.flag(Verdict::Unknown, format!("no {kind} fault happened"));
        }
    }
    if schedule.faults.iter().any(|f| f.action.aims_at_leader()) {
        let hit = started
            .iter()
            .filter(|e| e.value["hit_leader"].as_bool() == Some(true))
            .count() as u64;
        result.count("faults_on_leader", hit);
        if hit == 0 {
            result.flag(
                Verdict::Unknown,
                "no fault aimed at the leader hit the leader".into(),
            );
        }
    }
    let first = started.first().map(|e| e.t_ms).unwrap_or(u64::MAX);
    let healed = heal_time(events).unwrap_or(u64::MAX);
    let during = |f: &str| {
        events
            .iter()
            .filter(|e| e.f == f && e.kind == Kind::Ok && e.t_ms >= first && e.t_ms < healed)
            .count() as u64
    };
    let (elements, leases) = (during("element"), during("lease"));
    result.count("elements_during_faults", elements);
    result.count("leases_during_faults", leases);
    if elements == 0 || leases == 0 {
        result.flag(
            Verdict::Unknown,
            "the workload did not run during the fault phase".into(),
        );
    }
    if schedule
        .nemeses
        .contains(&crate::schedule::NemesisKind::Trainer)
    {
        let restored = events
            .iter()
            .filter(|e| e.f == "trainer-run" && e.kind == Kind::Invoke)
            .filter(|e| !e.value["resume"].is_null())
            .map(|e| (e.value["job"].clone(), e.value["run"].clone()))
            .collect::<Vec<_>>();
        let after_restore = events
            .iter()
            .filter(|e| e.f == "trainer-element" && e.kind == Kind::Ok)
            .filter(|e| restored.contains(&(e.value["job"].clone(), e.value["run"].clone())))
            .count() as u64;
        result.count("trainer_restores", restored.len() as u64);
        result.count("trainer_elements_after_restores", after_restore);
        if after_restore == 0 {
            result.flag(
                Verdict::Unknown,
                "the trainer never read after a restore from its state".into(),
            );
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::fixtures::*;
    use crate::schedule::NemesisKind;
    use serde_json::json;
    use std::time::Duration;

    fn schedule() -> Schedule {
        Schedule::generate(
            3,
            Duration::from_secs(12),
            3,
            2,
            &[NemesisKind::Kill, NemesisKind::Pause],
        )
    }

    fn history(s: &Schedule, skip: Option<u32>) -> Vec<Event> {
        let mut h = Vec::new();
        for f in &s.faults {
            if Some(f.id) == skip {
                continue;
            }
            let v = json!({"fault": f.id, "hit_leader": true});
            h.push(ev(
                f.at_ms,
                "nemesis",
                Kind::Invoke,
                f.action.kind().name(),
                v.clone(),
            ));
            h.push(ev(f.at_ms, "nemesis", Kind::Ok, f.action.kind().name(), v));
            h.push(lease(f.at_ms + 1, "worker-1", 1, f.at_ms, f.at_ms + 1));
            h.push(element(f.at_ms + 2, "client-1", "j", f.at_ms));
            let r = json!({"fault": f.id});
            h.push(ev(f.at_ms + f.hold_ms, "nemesis", Kind::Ok, "recover", r));
        }
        h.push(ev(s.time_ms, "harness", Kind::Ok, "heal", json!({})));
        h
    }

    #[test]
    fn every_planned_fault_done_is_covered() {
        let s = schedule();
        assert!(s.faults.len() >= 2);
        let r = check(&history(&s, None), &s);
        assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.problems);
    }

    #[test]
    fn a_missing_fault_is_unknown() {
        let s = schedule();
        let r = check(&history(&s, Some(2)), &s);
        assert_eq!(r.verdict, Verdict::Unknown);
        assert!(
            r.problems.iter().any(|p| p.contains("#2")),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn no_workload_during_faults_is_unknown() {
        let s = schedule();
        let h: Vec<Event> = history(&s, None)
            .into_iter()
            .filter(|e| e.f != "element")
            .collect();
        assert_eq!(check(&h, &s).verdict, Verdict::Unknown);
    }
}
