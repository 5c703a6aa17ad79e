//! Delivery gaps: the windows in which some reader wanted elements (was inside an epoch) and no
//! reader received any. A gap begins at an element (or when the first reader starts an epoch)
//! and ends at the next element (or when the last reader leaves its epoch).
//!
//! Each fault is given the longest gap that began while it was on. A gap that overlaps a worker
//! or link fault is not held to the bound: a worker that is gone holds up the end of its epoch
//! until it returns or the dispatcher removes it, which the worker timeout decides, not
//! failover. Every other gap of the fault phase (from the first fault to the heal) is.

use crate::history::{Event, Kind};
use crate::schedule::NemesisKind;
use serde::Serialize;
use std::collections::BTreeSet;
use std::str::FromStr;

/// Gaps shorter than this are not kept (the longest is always known).
const KEEP_MS: u64 = 20;

/// One window without deliveries, `[start_ms, end_ms)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Gap {
    pub start_ms: u64,
    pub end_ms: u64,
}

impl Gap {
    pub fn ms(&self) -> u64 {
        self.end_ms - self.start_ms
    }
}

/// One fault's span as it happened, and the longest gap that began during it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultGap {
    pub fault: u64,
    pub kind: String,
    pub on_workers: bool,
    pub start_ms: u64,
    pub end_ms: u64,
    pub longest_gap: Option<Gap>,
}

/// The gaps of a history.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeliveryGaps {
    /// Gaps of at least `KEEP_MS`, in order.
    pub gaps: Vec<Gap>,
    pub faults: Vec<FaultGap>,
    /// The longest gap held to the bound (in the fault phase, overlapping no worker fault).
    pub longest_bounded: Option<Gap>,
    /// The longest gap of the fault phase, bounded or not.
    pub longest: Option<Gap>,
}

/// Every fault's span: `(fault, kind, start, end)`; a fault never undone ends at `end_ms`.
pub fn fault_spans(events: &[Event], end_ms: u64) -> Vec<(u64, String, u64, u64)> {
    let mut spans: Vec<(u64, String, u64, u64)> = Vec::new();
    for e in events
        .iter()
        .filter(|e| e.process == "nemesis" && e.kind == Kind::Ok)
    {
        let Some(id) = e.value["fault"].as_u64() else {
            continue;
        };
        if e.f == "recover" {
            if let Some(span) = spans.iter_mut().find(|s| s.0 == id) {
                span.3 = e.t_ms;
            }
        } else {
            spans.push((id, e.f.clone(), e.t_ms, end_ms));
        }
    }
    spans
}

fn longer(a: Option<Gap>, b: Gap) -> Option<Gap> {
    match a {
        Some(a) if a.ms() >= b.ms() => Some(a),
        _ => Some(b),
    }
}

pub fn delivery_gaps(events: &[Event]) -> DeliveryGaps {
    let end_ms = events.last().map(|e| e.t_ms).unwrap_or(0);
    let heal = super::heal_time(events).unwrap_or(end_ms);
    let spans = fault_spans(events, heal);
    let phase_start = spans.iter().map(|s| s.2).min().unwrap_or(heal);

    // Sweep: who is inside an epoch, and when the current gap began.
    let mut all = Vec::new();
    let mut reading: BTreeSet<&str> = BTreeSet::new();
    let mut since: Option<u64> = None;
    let close = |since: &mut Option<u64>, t: u64, all: &mut Vec<Gap>| {
        if let Some(start) = since.take() {
            if t > start {
                all.push(Gap {
                    start_ms: start,
                    end_ms: t,
                });
            }
        }
    };
    for e in events {
        match (e.f.as_str(), e.kind) {
            ("epoch", Kind::Invoke) => {
                if reading.is_empty() {
                    since = Some(e.t_ms);
                }
                reading.insert(&e.process);
            }
            ("epoch", _) => {
                let left = reading.remove(e.process.as_str());
                if left && reading.is_empty() {
                    close(&mut since, e.t_ms, &mut all);
                }
            }
            ("element", Kind::Ok) if !reading.is_empty() => {
                close(&mut since, e.t_ms, &mut all);
                since = Some(e.t_ms);
            }
            _ => {}
        }
    }
    close(&mut since, end_ms, &mut all);

    let in_phase = |g: &Gap| g.start_ms >= phase_start && g.start_ms < heal;
    let on_workers = |kind: &str| NemesisKind::from_str(kind).is_ok_and(|k| k.on_workers());
    let overlaps_worker_fault = |g: &Gap| {
        spans
            .iter()
            .any(|(_, kind, s, e)| on_workers(kind) && g.start_ms < *e && *s < g.end_ms)
    };
    let mut result = DeliveryGaps::default();
    for gap in all.iter().filter(|g| in_phase(g)) {
        result.longest = longer(result.longest, *gap);
        if !overlaps_worker_fault(gap) {
            result.longest_bounded = longer(result.longest_bounded, *gap);
        }
    }
    result.faults = spans
        .iter()
        .map(|(fault, kind, start, end)| FaultGap {
            fault: *fault,
            kind: kind.clone(),
            on_workers: on_workers(kind),
            start_ms: *start,
            end_ms: *end,
            longest_gap: all
                .iter()
                .filter(|g| g.start_ms >= *start && g.start_ms < *end)
                .fold(None, |best, g| longer(best, *g)),
        })
        .collect();
    result.gaps = all.into_iter().filter(|g| g.ms() >= KEEP_MS).collect();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::fixtures::*;
    use serde_json::json;

    fn epoch(t: u64, client: &str, kind: Kind) -> Event {
        ev(t, client, kind, "epoch", json!({"job": "j"}))
    }

    fn fault(t: u64, kind: Kind, f: &str, id: u64) -> Event {
        ev(t, "nemesis", kind, f, json!({"fault": id}))
    }

    /// A history: epochs of one client with elements at `elements`, faults as given.
    fn history(elements: &[u64], faults: &[(u64, &str, u64, u64)], end: u64) -> Vec<Event> {
        let mut h = vec![epoch(0, "client-1", Kind::Invoke)];
        for &(id, f, start, stop) in faults {
            h.push(fault(start, Kind::Ok, f, id));
            h.push(fault(stop, Kind::Ok, "recover", id));
        }
        for &t in elements {
            h.push(element(t, "client-1", "j", t));
        }
        h.push(epoch(end, "client-1", Kind::Ok));
        h.push(ev(end + 1, "harness", Kind::Ok, "heal", json!({})));
        h.sort_by_key(|e| e.t_ms);
        h
    }

    #[test]
    fn gaps_are_measured_and_given_to_the_fault_they_began_in() {
        // (elements, faults, end, longest bounded, per fault longest)
        #[allow(clippy::type_complexity)]
        let cases: Vec<(
            Vec<u64>,
            Vec<(u64, &str, u64, u64)>,
            u64,
            Option<u64>,
            Vec<Option<u64>>,
        )> = vec![
            // a leader pause from 1000 to 3000 ms; nothing delivered from 1100 to 2900
            (
                vec![100, 500, 1000, 1100, 2900, 3000],
                vec![(1, "pause", 1000, 3000)],
                3100,
                Some(1800),
                vec![Some(1800)],
            ),
            // the same gap during a worker kill is not held to the bound
            (
                vec![100, 500, 1000, 1100, 2900, 3000],
                vec![(1, "worker-kill", 1000, 3000)],
                3100,
                Some(100),
                vec![Some(1800)],
            ),
            // a gap that began before the first fault is outside the fault phase
            (
                vec![10, 1500, 1600],
                vec![(1, "kill", 1000, 1200)],
                1700,
                Some(100),
                vec![None],
            ),
            // the wait after the last element until the epoch ends is a gap too
            (
                vec![1000, 1100],
                vec![(1, "partition", 1000, 3000)],
                2600,
                Some(1500),
                vec![Some(1500)],
            ),
        ];
        for (elements, faults, end, bounded, per_fault) in cases {
            let g = delivery_gaps(&history(&elements, &faults, end));
            assert_eq!(
                g.longest_bounded.map(|g| g.ms()),
                bounded,
                "{elements:?} {faults:?}"
            );
            let got: Vec<Option<u64>> = g
                .faults
                .iter()
                .map(|f| f.longest_gap.map(|g| g.ms()))
                .collect();
            assert_eq!(got, per_fault, "{elements:?} {faults:?}");
        }
    }

    #[test]
    fn time_between_epochs_is_no_gap() {
        let mut h = vec![
            fault(0, Kind::Ok, "kill", 1),
            epoch(0, "client-1", Kind::Invoke),
            element(10, "client-1", "a", 0),
            epoch(20, "client-1", Kind::Ok),
            // 5 s of other operations, reading nothing
            epoch(5020, "client-1", Kind::Invoke),
            element(5030, "client-1", "b", 0),
            epoch(5040, "client-1", Kind::Ok),
            fault(6000, Kind::Ok, "recover", 1),
        ];
        h.push(ev(6001, "harness", Kind::Ok, "heal", json!({})));
        let g = delivery_gaps(&h);
        assert_eq!(g.longest.map(|g| g.ms()), Some(10));
    }
}
