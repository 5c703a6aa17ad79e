//! (b) No lost acknowledged state: after convergence, every node holds every acknowledged
//! write, all nodes report the same applied state, and no linearizable read missed a write
//! acknowledged before the read began.
//!
//! Acknowledged writes: `ok` registrations (the dataset id), jobs of epochs that were created
//! (`ok`, or elements were read), and every lease a worker got (its iteration's cursor must be
//! at or past the lease's end, or in a later repetition). `info` writes may be present or not.
//! The final states are the harness's `final-status` events, one per node.

use super::{CheckResult, Verdict};
use crate::history::{Event, Kind};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The parts of a node's status that every replica must agree on (node-local fields such as
/// its role, term and snapshot are left out).
fn replicated(status: &Value) -> Value {
    serde_json::json!({
        "applied_index": status["applied_index"],
        "datasets": status["datasets"],
        "jobs": status["jobs"],
        "iterations": status["iterations"],
        "workers": status["workers"],
    })
}

pub fn check(events: &[Event]) -> CheckResult {
    let mut result = CheckResult::new("no-lost-state");
    let mut finals: BTreeMap<u64, Value> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.process == "harness" && e.f == "final-status")
    {
        let node = e.value["node"].as_u64().unwrap_or(0);
        match e.kind {
            Kind::Ok => {
                finals.insert(node, e.value["status"].clone());
            }
            _ => result.flag(
                Verdict::Unknown,
                format!("node {node} gave no final status: {}", e.value["error"]),
            ),
        }
    }
    if finals.is_empty() {
        result.flag(Verdict::Unknown, "no final status was read".into());
        return result;
    }
    result.count("nodes", finals.len() as u64);

    // All nodes agree.
    let mut views = finals.iter().map(|(n, s)| (n, replicated(s)));
    let (first_node, first) = views.next().expect("not empty");
    for (node, view) in views {
        if view != first {
            result.flag(
                Verdict::Invalid,
                format!(
                    "nodes {first_node} and {node} diverge after convergence: applied index {} vs {}",
                    first["applied_index"], view["applied_index"]
                ),
            );
        }
    }
    if let Some(i) = first["applied_index"].as_u64() {
        result.count("applied_index", i);
    }

    // Acknowledged writes, and stale reads.
    let mut acked_datasets: BTreeSet<String> = BTreeSet::new();
    let mut acked_jobs: BTreeSet<String> = BTreeSet::new();
    // dataset id -> position in the history of its first acknowledgement
    let mut acked_at: HashMap<String, usize> = HashMap::new();
    // process -> position of its pending invoke (processes are sequential)
    let mut pending: HashMap<&str, usize> = HashMap::new();
    let mut leases = Vec::new();
    for (pos, e) in events.iter().enumerate() {
        if e.kind == Kind::Invoke {
            pending.insert(e.process.as_str(), pos);
            continue;
        }
        let invoked_at = pending.remove(e.process.as_str());
        match (e.f.as_str(), e.kind) {
            ("register", Kind::Ok) => {
                if let Some(id) = e.value["dataset_id"].as_str() {
                    acked_datasets.insert(id.to_string());
                    acked_at.entry(id.to_string()).or_insert(pos);
                }
            }
            ("epoch", kind) => {
                let read_some = e.value["elements"].as_u64().unwrap_or(0) > 0;
                if kind == Kind::Ok || read_some {
                    if let Some(job) = e.value["job"].as_str() {
                        acked_jobs.insert(job.to_string());
                    }
                }
            }
            ("read", Kind::Ok) => {
                result.count("reads", 1);
                let id = e.value["dataset_id"].as_str().unwrap_or_default();
                let missed = e.value["found"].as_bool() == Some(false);
                let acked_before = acked_at
                    .get(id)
                    .zip(invoked_at)
                    .is_some_and(|(acked, invoked)| *acked < invoked);
                if missed && acked_before {
                    result.count("stale_reads", 1);
                    result.flag(
                        Verdict::Invalid,
                        format!(
                            "stale read: {} did not find dataset {id} at {} ms, acknowledged before the read began",
                            e.process, e.t_ms
                        ),
                    );
                }
            }
            ("lease", Kind::Ok) if e.value["end_of_splits"].as_bool() != Some(true) => {
                leases.push(&e.value);
            }
            _ => {}
        }
    }
    result.count("acked_datasets", acked_datasets.len() as u64);
    result.count("acked_jobs", acked_jobs.len() as u64);
    result.count("acked_leases", leases.len() as u64);
    result.counts.entry("stale_reads").or_insert(0);

    for (node, status) in &finals {
        let datasets: BTreeSet<&str> = status["datasets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        for id in &acked_datasets {
            if !datasets.contains(id.as_str()) {
                result.count("lost_writes", 1);
                result.flag(
                    Verdict::Invalid,
                    format!("lost write: dataset {id} was acknowledged but node {node} does not have it"),
                );
            }
        }
        let jobs: BTreeSet<&str> = status["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|j| j["name"].as_str())
            .collect();
        for job in &acked_jobs {
            if !jobs.contains(job.as_str()) {
                result.count("lost_writes", 1);
                result.flag(
                    Verdict::Invalid,
                    format!("lost write: job {job} was created but node {node} does not have it"),
                );
            }
        }
        let iterations: HashMap<u64, &Value> = status["iterations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|it| Some((it["iteration_id"].as_u64()?, it)))
            .collect();
        for lease in &leases {
            let field = |k: &str| lease[k].as_u64().unwrap_or(0);
            let (it, provider, repetition, end) = (
                field("iteration"),
                field("provider") as usize,
                field("repetition"),
                field("end"),
            );
            let cursor = iterations.get(&it).map(|i| &i["split_cursors"][provider]);
            let holds = cursor.is_some_and(|c| {
                let rep = c["repetition"].as_u64().unwrap_or(0);
                rep > repetition || (rep == repetition && c["next"].as_u64().unwrap_or(0) >= end)
            });
            if !holds {
                result.count("lost_writes", 1);
                result.flag(
                    Verdict::Invalid,
                    format!(
                        "lost write: node {node} has iteration {it} provider {provider} at {}, \
                         behind a lease up to {end} (repetition {repetition})",
                        cursor
                            .map(|c| c.to_string())
                            .unwrap_or_else(|| "nothing".into())
                    ),
                );
            }
        }
    }
    result.counts.entry("lost_writes").or_insert(0);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::fixtures::*;
    use serde_json::json;

    fn register(t: u64, id: &str, kind: Kind) -> [Event; 2] {
        [
            ev(
                t,
                "client-1",
                Kind::Invoke,
                "register",
                json!({"dataset_id": id}),
            ),
            ev(
                t + 1,
                "client-1",
                kind,
                "register",
                json!({"dataset_id": id}),
            ),
        ]
    }

    #[test]
    fn acknowledged_writes_on_every_node_are_valid() {
        let mut h: Vec<Event> = register(1, "a", Kind::Ok).into();
        h.extend(register(3, "b", Kind::Info)); // unknown: may be missing
        h.push(lease(5, "worker-1", 1, 0, 40));
        h.push(final_status(9, 1, 10, &["1", "a"], 40));
        h.push(final_status(9, 2, 10, &["1", "a"], 40));
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.problems);
    }

    #[test]
    fn a_lost_registration_is_invalid() {
        let mut h: Vec<Event> = register(1, "a", Kind::Ok).into();
        h.push(final_status(9, 1, 10, &["1", "a"], 0));
        h.push(final_status(9, 2, 10, &["1"], 0)); // node 2 lost it (and diverges)
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.counts["lost_writes"], 1);
    }

    #[test]
    fn a_cursor_behind_a_lease_is_a_lost_write() {
        let h = vec![
            lease(5, "worker-1", 1, 0, 40),
            final_status(9, 1, 10, &["1"], 32),
        ];
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
    }

    #[test]
    fn divergent_nodes_are_invalid() {
        let h = vec![
            final_status(9, 1, 10, &["1"], 0),
            final_status(9, 2, 11, &["1"], 0),
        ];
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert!(r.problems[0].contains("diverge"), "{:?}", r.problems);
    }

    #[test]
    fn a_read_missing_an_acknowledged_write_is_stale() {
        let mut h: Vec<Event> = register(1, "a", Kind::Ok).into();
        h.push(ev(
            5,
            "client-2",
            Kind::Invoke,
            "read",
            json!({"dataset_id": "a"}),
        ));
        h.push(ev(
            6,
            "client-2",
            Kind::Ok,
            "read",
            json!({"dataset_id": "a", "found": false}),
        ));
        h.push(final_status(9, 1, 10, &["a"], 0));
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.counts["stale_reads"], 1);
    }

    #[test]
    fn a_read_concurrent_with_the_write_may_miss_it() {
        let h = vec![
            ev(
                1,
                "client-2",
                Kind::Invoke,
                "read",
                json!({"dataset_id": "a"}),
            ),
            ev(
                2,
                "client-1",
                Kind::Invoke,
                "register",
                json!({"dataset_id": "a"}),
            ),
            ev(
                3,
                "client-1",
                Kind::Ok,
                "register",
                json!({"dataset_id": "a"}),
            ),
            ev(
                4,
                "client-2",
                Kind::Ok,
                "read",
                json!({"dataset_id": "a", "found": false}),
            ),
            final_status(9, 1, 10, &["a"], 0),
        ];
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.problems);
    }

    #[test]
    fn a_missing_final_status_is_unknown() {
        let h = vec![
            final_status(9, 1, 10, &[], 0),
            ev(
                9,
                "harness",
                Kind::Info,
                "final-status",
                json!({"node": 2, "error": "timeout"}),
            ),
        ];
        assert_eq!(check(&h).verdict, Verdict::Unknown);
    }
}
