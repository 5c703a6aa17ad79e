//! (a) At-most-once: no split index of an iteration is delivered twice, across every failover.
//!
//! Two views, both from the history: the leases workers got (no two lease ranges of the same
//! iteration, provider and repetition overlap), and the elements clients received (no client
//! job delivers the same split twice; a job has one iteration, and for `range` element v is
//! split v). Lost splits are allowed here: the loss-bound checker judges them, and the
//! fault-free final epoch is held to "none lost" by the progress checker.
//!
//! The lease events are the dispatcher's grants only. Under exactly-once delivery, a task that
//! takes a failed task's stream over produces that task's leased splits again, but by replaying
//! the leases the dispatcher recorded for the stream, not by leasing them: so no lease event
//! repeats them, and a split leased twice is still a dispatcher bug.

use super::{CheckResult, Verdict};
use crate::history::{Event, Kind, LeaseRange};
use std::collections::{BTreeMap, HashMap};

/// Lease ranges `(start, end, worker)` per `(iteration, provider, repetition)`.
type Leases = BTreeMap<(u64, u64, u64), Vec<(u64, u64, String)>>;

pub fn check(events: &[Event]) -> CheckResult {
    let mut result = CheckResult::new("at-most-once");
    let mut leases = Leases::new();
    let mut elements: HashMap<(String, i64), u64> = HashMap::new();
    for e in events.iter().filter(|e| e.kind == Kind::Ok) {
        let v = &e.value;
        match e.f.as_str() {
            "lease" => {
                if v["end_of_splits"].as_bool() == Some(true) {
                    continue;
                }
                let Some(LeaseRange {
                    iteration: it,
                    provider: p,
                    repetition: r,
                    start: s,
                    end,
                }) = LeaseRange::of(v)
                else {
                    result.flag(Verdict::Unknown, format!("malformed lease event: {v}"));
                    continue;
                };
                result.count("leases", 1);
                result.count("leased_splits", end.saturating_sub(s));
                let worker = v["worker"].as_str().unwrap_or(&e.process).to_string();
                leases.entry((it, p, r)).or_default().push((s, end, worker));
            }
            "element" => {
                let (Some(job), Some(split)) = (v["job"].as_str(), v["split"].as_i64()) else {
                    result.flag(Verdict::Unknown, format!("malformed element event: {v}"));
                    continue;
                };
                result.count("elements", 1);
                let seen = elements.entry((job.to_string(), split)).or_insert(0);
                *seen += 1;
                if *seen == 2 {
                    result.count("duplicate_elements", 1);
                    result.flag(
                        Verdict::Invalid,
                        format!(
                            "split {split} of job {job} delivered twice (by {} at {} ms)",
                            e.process, e.t_ms
                        ),
                    );
                }
            }
            _ => {}
        }
    }
    result.count("iterations_leased", leases.len() as u64);
    for ((iteration, provider, repetition), mut ranges) in leases {
        ranges.sort();
        let mut covered_to = 0u64;
        let mut holder = String::new();
        for (start, end, worker) in ranges {
            if start < covered_to {
                let overlap = covered_to.min(end) - start;
                result.count("duplicate_leased_splits", overlap);
                result.flag(
                    Verdict::Invalid,
                    format!(
                        "iteration {iteration} provider {provider} repetition {repetition}: \
                         lease [{start}, {end}) to {worker} overlaps a lease up to {covered_to} to {holder} \
                         ({overlap} splits leased twice)"
                    ),
                );
            }
            if end > covered_to {
                covered_to = end;
                holder = worker;
            }
        }
    }
    result.counts.entry("duplicate_elements").or_insert(0);
    result.counts.entry("duplicate_leased_splits").or_insert(0);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::fixtures::*;

    #[test]
    fn disjoint_leases_and_unique_elements_are_valid() {
        let h = vec![
            lease(1, "worker-1", 7, 0, 8),
            lease(2, "worker-2", 7, 8, 24),
            lease(3, "worker-1", 8, 0, 8), // another iteration may reuse indices
            element(4, "client-1", "j-a", 0),
            element(5, "client-1", "j-a", 1),
            element(6, "client-2", "j-b", 0),
        ];
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.problems);
        assert_eq!(r.counts["leased_splits"], 32);
    }

    #[test]
    fn a_stream_taken_over_leases_nothing_twice() {
        // Worker 1 leased [0, 16) and died; worker 2's new task of the stream produced those
        // splits again from the recorded lease (no lease event), then leased [16, 32).
        let mut h = vec![lease(1, "worker-1", 7, 0, 16)];
        h.extend((0..4).map(|s| element(2, "client-1", "j-a", s)));
        h.push(lease(3, "worker-2", 7, 16, 32));
        h.extend((4..32).map(|s| element(4, "client-1", "j-a", s)));
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.problems);
        assert_eq!(r.counts["duplicate_leased_splits"], 0);
        assert_eq!(r.counts["elements"], 32);
    }

    #[test]
    fn an_overlapping_lease_is_a_duplicate() {
        // The planted bug's shape: a lease at 64 re-issues 60..64.
        let h = vec![
            lease(1, "worker-1", 7, 32, 64),
            lease(2, "worker-2", 7, 60, 128),
        ];
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.counts["duplicate_leased_splits"], 4);
    }

    #[test]
    fn an_element_received_twice_is_a_duplicate() {
        let h = vec![
            element(1, "client-1", "j-a", 5),
            element(2, "client-1", "j-a", 5),
        ];
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.counts["duplicate_elements"], 1);
    }
}
