use super::*;
use crate::checker::fixtures::*;
use serde_json::{json, Value};

/// A lease of iteration 7 as a worker process's line is recorded.
fn lease(t: u64, worker: &str, incarnation: u64, task: u64, start: u64, end: u64) -> Event {
    ev(
        t,
        worker,
        Kind::Ok,
        "lease",
        json!({"worker": worker, "incarnation": incarnation, "task": task, "iteration": 7,
               "provider": 0, "repetition": 0, "start": start, "end": end,
               "end_of_splits": false}),
    )
}

fn exit(t: u64, worker: &str, incarnation: u64, cause: &str) -> Event {
    ev(
        t,
        worker,
        Kind::Ok,
        "exit",
        json!({"incarnation": incarnation, "cause": cause}),
    )
}

fn removed(t: u64, worker: &str) -> Event {
    ev(
        t,
        "monitor",
        Kind::Ok,
        "worker-removed",
        json!({"worker": worker}),
    )
}

fn epoch(t: u64, kind: Kind, splits: u64) -> Event {
    let value: Value = json!({"job": "j", "splits": splits});
    ev(t, "client-1", kind, "epoch", value)
}

/// Job `j` (iteration 7, 4 splits) read from t=0 to `end` (complete unless `kind` says not),
/// with `middle` in between.
fn run(middle: Vec<Event>, end: u64, kind: Kind) -> Vec<Event> {
    let mut h = vec![
        epoch(0, Kind::Invoke, 4),
        ev(
            1,
            "monitor",
            Kind::Ok,
            "iteration",
            json!({"job": "j", "iteration": 7}),
        ),
    ];
    h.extend(middle);
    h.push(epoch(end, kind, 4));
    h.sort_by_key(|e| e.t_ms);
    h
}

fn elements(t: u64, splits: &[u64]) -> Vec<Event> {
    splits
        .iter()
        .map(|&s| element(t, "client-1", "j", s))
        .collect()
}

#[test]
fn the_loss_bound_is_checked_split_by_split() {
    // (what, middle of the history, epoch end and outcome, verdict, counts that must hold)
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, Vec<Event>, (u64, Kind), Verdict, Vec<(&str, u64)>)> = vec![
        (
            "every split delivered once",
            [
                vec![
                    lease(5, "worker-1", 1, 1, 0, 2),
                    lease(6, "worker-2", 1, 2, 2, 4),
                ],
                elements(10, &[0, 1, 2, 3]),
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Valid,
            vec![("delivered_once", 4), ("leased_splits", 4)],
        ),
        (
            "a split delivered twice",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 4)],
                elements(10, &[0, 1, 2, 3, 3]),
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Invalid,
            vec![("delivered_twice", 1)],
        ),
        (
            "a split lost while its worker lived (a dropped connection)",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 4)],
                elements(10, &[0, 1, 3]),
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Invalid,
            vec![("lost_while_worker_lived", 1)],
        ),
        (
            "splits lost with the incarnation that held them",
            [
                vec![
                    lease(5, "worker-1", 1, 1, 0, 2),
                    lease(6, "worker-2", 1, 2, 2, 4),
                ],
                elements(10, &[2, 3]),
                vec![exit(20, "worker-1", 1, "kill")],
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Valid,
            vec![("lost_with_worker", 2)],
        ),
        (
            "a split lost in transit before its worker died (a later split was delivered)",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 4)],
                elements(10, &[0, 1, 3]),
                vec![exit(20, "worker-1", 1, "kill")],
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Invalid,
            vec![("lost_while_worker_lived", 1)],
        ),
        (
            "a lease recorded after its incarnation's death still counts as held by it",
            [
                vec![
                    exit(4, "worker-1", 1, "kill"),
                    lease(5, "worker-1", 1, 1, 0, 2),
                ],
                elements(10, &[2, 3]),
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Valid,
            vec![("lost_with_worker", 2), ("lost_unleased", 0)],
        ),
        (
            "an earlier incarnation's death does not excuse a later one's loss",
            [
                vec![
                    exit(2, "worker-1", 1, "kill"),
                    lease(5, "worker-1", 2, 1, 0, 4),
                ],
                elements(10, &[0, 1, 2]),
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Invalid,
            vec![("lost_while_worker_lived", 1)],
        ),
        (
            "a death after the epoch ended does not excuse a loss",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 4)],
                elements(10, &[0, 1, 2]),
                vec![exit(200, "worker-1", 1, "kill")],
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Invalid,
            vec![("lost_while_worker_lived", 1)],
        ),
        (
            "a removed worker's splits may be lost",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 4)],
                elements(10, &[0, 1]),
                vec![removed(50, "worker-1")],
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Valid,
            vec![("lost_with_worker", 2)],
        ),
        (
            "a new task of the same iteration means the old one was removed",
            [
                vec![
                    lease(5, "worker-1", 1, 1, 0, 2),
                    lease(50, "worker-1", 1, 9, 2, 4),
                ],
                elements(60, &[2, 3]),
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Valid,
            vec![("lost_with_worker", 2), ("delivered_once", 2)],
        ),
        (
            "an epoch cut short is not judged for loss",
            [vec![lease(5, "worker-1", 1, 1, 0, 4)], elements(10, &[0])].concat(),
            (100, Kind::Info),
            Verdict::Valid,
            vec![("not_judged", 3)],
        ),
        (
            "a split no lease covers, lost while every worker lived",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 3)],
                elements(10, &[0, 1, 2]),
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Invalid,
            vec![("lost_unleased", 1)],
        ),
        (
            "a split no lease covers, lost when a worker died during the epoch",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 3)],
                elements(10, &[0, 1, 2]),
                vec![exit(30, "worker-2", 1, "kill")],
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Valid,
            vec![("lost_unleased", 1)],
        ),
        (
            "a worker that exits on its own is a violation",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 4)],
                elements(10, &[0, 1, 2, 3]),
                vec![exit(30, "worker-2", 1, "crash")],
            ]
            .concat(),
            (100, Kind::Ok),
            Verdict::Invalid,
            vec![("crashes", 1)],
        ),
    ];
    for (what, middle, (end, kind), verdict, counts) in cases {
        let r = check(&run(middle, end, kind), None);
        assert_eq!(
            r.verdict, verdict,
            "{what}: {:?} {:?}",
            r.problems, r.counts
        );
        for (key, n) in counts {
            assert_eq!(r.counts[key], n, "{what}: {key} in {:?}", r.counts);
        }
    }
}

#[test]
fn an_iteration_of_no_known_job_is_not_judged() {
    let h = vec![
        epoch(0, Kind::Invoke, 4),
        lease(5, "worker-1", 1, 1, 0, 4),
        epoch(100, Kind::Ok, 4),
    ];
    let r = check(&h, None);
    assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.problems);
    assert_eq!(r.counts["not_judged"], 4);
}

/// Job `j` (iteration 7, 4 splits) read under exactly-once delivery from t=0 to 100
/// (complete unless `kind` says not), with `middle` in between.
fn exactly_once(middle: Vec<Event>, kind: Kind) -> Vec<Event> {
    let mut h = run(middle, 100, kind);
    h[0].value["delivery"] = json!("exactly-once");
    h
}

#[test]
fn under_exactly_once_no_split_may_be_lost_whatever_happened_to_its_worker() {
    // (what, middle of the history, verdict, counts that must hold, words the problem has)
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, Vec<Event>, Verdict, Vec<(&str, u64)>, &str)> = vec![
        (
            "a killed worker's splits produced again by the task that took its stream over \
             (the replay leases nothing, so no lease event names the new task)",
            [
                vec![
                    lease(5, "worker-1", 1, 1, 0, 2),
                    lease(6, "worker-2", 1, 2, 2, 4),
                ],
                elements(10, &[0, 2]),
                vec![exit(20, "worker-1", 1, "kill")],
                elements(40, &[1, 3]),
            ]
            .concat(),
            Verdict::Valid,
            vec![
                ("delivered_once", 4),
                ("lost_with_worker", 0),
                ("epochs_exactly_once", 1),
            ],
            "",
        ),
        (
            "a split lost with the incarnation that held it",
            [
                vec![
                    lease(5, "worker-1", 1, 1, 0, 2),
                    lease(6, "worker-2", 1, 2, 2, 4),
                ],
                elements(10, &[0, 2, 3]),
                vec![exit(20, "worker-1", 1, "kill")],
            ]
            .concat(),
            Verdict::Invalid,
            vec![("lost_with_worker", 1), ("delivered_once", 3)],
            "1 splits of job j (iteration 7) lost under exactly-once delivery: 1; held by \
             worker-1 incarnation 1 (task 1, lease [0, 2) at 5 ms), which exited at 20 ms (kill)",
        ),
        (
            "a split lost with a killed worker, a later split of its lease delivered by the \
             task that took the stream over",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 4)],
                elements(10, &[0]),
                vec![exit(20, "worker-1", 1, "kill")],
                elements(40, &[2, 3]),
            ]
            .concat(),
            Verdict::Invalid,
            vec![("lost_with_worker", 1), ("lost_while_worker_lived", 0)],
            "lost under exactly-once delivery: 1; held by worker-1 incarnation 1 (task 1, \
             lease [0, 4) at 5 ms), which exited at 20 ms (kill) before the epoch ended at 100 ms",
        ),
        (
            "a split lost with a worker the dispatcher removed",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 4)],
                elements(10, &[0, 1, 2]),
                vec![removed(50, "worker-1")],
            ]
            .concat(),
            Verdict::Invalid,
            vec![("lost_with_worker", 1)],
            "which was removed by the dispatcher at 50 ms",
        ),
        (
            "a split lost while its worker lived",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 4)],
                elements(10, &[0, 1, 3]),
            ]
            .concat(),
            Verdict::Invalid,
            vec![("lost_while_worker_lived", 1)],
            "which neither died nor was removed",
        ),
        (
            "a split no lease covers, lost although a worker died",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 3)],
                elements(10, &[0, 1, 2]),
                vec![exit(30, "worker-2", 1, "kill")],
            ]
            .concat(),
            Verdict::Invalid,
            vec![("lost_unleased", 1)],
            "with no lease known for them: 3; during the epoch (0..100 ms): worker-2 \
             incarnation 1 exited at 30 ms (kill)",
        ),
        (
            "a split delivered twice",
            [
                vec![lease(5, "worker-1", 1, 1, 0, 4)],
                elements(10, &[0, 1, 2, 3, 1]),
            ]
            .concat(),
            Verdict::Invalid,
            vec![("delivered_twice", 1)],
            "delivered more than once: 1",
        ),
        (
            "a lease seen twice (a split covered by two lease events) is one split here",
            [
                vec![
                    lease(5, "worker-1", 1, 1, 0, 4),
                    lease(30, "worker-2", 1, 2, 2, 4),
                ],
                elements(10, &[0, 1, 2, 3]),
            ]
            .concat(),
            Verdict::Valid,
            vec![("leased_splits", 4), ("delivered_once", 4)],
            "",
        ),
        (
            "an epoch cut short is not judged for loss",
            [vec![lease(5, "worker-1", 1, 1, 0, 4)], elements(10, &[0])].concat(),
            Verdict::Valid,
            vec![("not_judged", 3), ("epochs_exactly_once", 0)],
            "",
        ),
    ];
    for (what, middle, verdict, counts, words) in cases {
        let kind = if what.contains("cut short") {
            Kind::Info
        } else {
            Kind::Ok
        };
        let r = check(&exactly_once(middle, kind), None);
        assert_eq!(
            r.verdict, verdict,
            "{what}: {:?} {:?}",
            r.problems, r.counts
        );
        for (key, n) in counts {
            assert_eq!(r.counts[key], n, "{what}: {key} in {:?}", r.counts);
        }
        assert!(
            r.problems.iter().any(|p| p.contains(words)) || words.is_empty(),
            "{what}: {:?}",
            r.problems
        );
    }
}

#[test]
fn a_complete_exactly_once_epoch_without_any_lease_is_judged_too() {
    let h = exactly_once(elements(10, &[0, 1]), Kind::Ok);
    let r = check(&h, None);
    assert_eq!(r.verdict, Verdict::Invalid, "{:?}", r.counts);
    assert_eq!(r.counts["lost_unleased"], 2);
}

#[test]
fn the_delivery_comes_from_the_epoch_the_run_or_the_check() {
    // A split lost with its killed worker: allowed at most once, a violation exactly once.
    let middle = || {
        [
            vec![lease(5, "worker-1", 1, 1, 0, 4)],
            elements(10, &[0, 1, 2]),
            vec![exit(20, "worker-1", 1, "kill")],
        ]
        .concat()
    };
    let setup = |delivery: &str| {
        ev(
            0,
            "harness",
            Kind::Invoke,
            "setup",
            json!({"seed": 1, "delivery": delivery}),
        )
    };
    let older = run(middle(), 100, Kind::Ok);
    let mut recorded_by_run = older.clone();
    recorded_by_run.insert(0, setup("exactly-once"));
    let mut at_most_once_epoch = exactly_once(middle(), Kind::Ok);
    at_most_once_epoch[0].value["delivery"] = json!("at-most-once");
    // (what, history, --delivery of `check`, verdict)
    let cases = [
        ("an older build's history", &older, None, Verdict::Valid),
        (
            "an older history checked as exactly-once",
            &older,
            Some(Delivery::ExactlyOnce),
            Verdict::Invalid,
        ),
        (
            "the run's delivery",
            &recorded_by_run,
            None,
            Verdict::Invalid,
        ),
        (
            "the epoch's own delivery",
            &at_most_once_epoch,
            None,
            Verdict::Valid,
        ),
        (
            "an exactly-once run checked as at-most-once",
            &recorded_by_run,
            Some(Delivery::AtMostOnce),
            Verdict::Valid,
        ),
    ];
    for (what, history, delivery, verdict) in cases {
        let r = check(history, delivery);
        assert_eq!(r.verdict, verdict, "{what}: {:?}", r.problems);
        assert_eq!(r.counts["lost_with_worker"], 1, "{what}");
    }
}
