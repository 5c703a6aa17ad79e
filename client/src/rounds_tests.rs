//! Table tests of `Rounds::handle`: each case is a script of events applied to a fresh
//! coordinated consumer with the given `max_outstanding_requests`, with the decisions every step
//! must produce (written as `show` renders them).

use super::*;

/// A listing of tasks `(id, starting_round)`, of workers `w<id>`.
fn listing(tasks: &[(u64, u64)], iteration_finished: bool, block_round: Option<u64>) -> Event {
    let tasks = tasks
        .iter()
        .map(|&(id, starting_round)| pb::TaskInfo {
            task_id: id,
            worker_address: format!("w{id}"),
            starting_round,
            ..Default::default()
        })
        .collect();
    Event::Heartbeat {
        tasks: Some(tasks),
        iteration_finished,
        block_round,
    }
}
/// A heartbeat reply that says the task list known is current.
fn unchanged(iteration_finished: bool, block_round: Option<u64>) -> Event {
    Event::Heartbeat {
        tasks: None,
        iteration_finished,
        block_round,
    }
}
fn replied(task_id: u64, reply: Reply) -> Event {
    Event::Replied {
        task_id,
        reply: Ok(reply),
    }
}
fn element(task_id: u64, text: &'static str) -> Event {
    replied(
        task_id,
        Reply::Element(bytes::Bytes::from_static(text.as_bytes())),
    )
}
fn skip(task_id: u64) -> Event {
    replied(task_id, Reply::Skip)
}
fn removed(task_id: u64) -> Event {
    replied(task_id, Reply::Removed)
}
fn refused(task_id: u64) -> Event {
    Event::Replied {
        task_id,
        reply: Err(ClientError::worker(format!("w{task_id}"), "deleted")),
    }
}
fn failed(message: &str) -> Event {
    Event::Failed(ClientError::InvalidArgument(message.into()))
}
const PERMIT: fn() -> Event = || Event::Permit;
const DELIVERED: fn() -> Event = || Event::Delivered;

/// A decision as the tables write it.
fn show(decision: &Decision) -> String {
    match decision {
        Decision::Request(r) => format!(
            "request {} of {} for round {}{}",
            r.task_id,
            r.address,
            r.round,
            if r.skipped_previous_round {
                ", after a skip"
            } else {
                ""
            }
        ),
        Decision::Deliver(bytes) => format!("deliver {:?}", String::from_utf8_lossy(bytes)),
        Decision::Heartbeat(h) => {
            let last = h.known_tasks.last.map_or("-".into(), |l| l.to_string());
            let blocked = h.blocked_round.map_or("-".into(), |b| b.to_string());
            let poll = match h.poll {
                Poll::Now => "now",
                Poll::Drawn => "drawn",
            };
            format!(
                "heartbeat knowing {} (last {last}), round {}, blocked {blocked}, after {} ms, {poll}",
                h.known_tasks.count,
                h.current_round,
                h.after.as_millis()
            )
        }
        Decision::End(None) => "end".into(),
        Decision::End(Some(e)) => format!("end: {e}"),
    }
}

type Step = (Event, Vec<&'static str>);

fn run(name: &str, max_outstanding: u32, steps: Vec<Step>) {
    let mut rounds = Rounds::new(max_outstanding);
    let first: Vec<String> = rounds.start().iter().map(show).collect();
    assert_eq!(
        first,
        ["heartbeat knowing 0 (last -), round 0, blocked -, after 0 ms, now"],
        "case {name:?}"
    );
    for (i, (event, want)) in steps.into_iter().enumerate() {
        let shown = format!("{event:?}");
        let got: Vec<String> = rounds.handle(event).iter().map(show).collect();
        assert_eq!(got, want, "case {name:?}, step {i}: {shown}");
    }
}

#[test]
fn rounds_table() {
    let cases: Vec<(&str, u32, Vec<Step>)> = vec![
        ("requests go round the tasks in the dispatcher's order, one at a time per task", 4, vec![
            (listing(&[(1, 0), (2, 0)], false, None), vec!["heartbeat knowing 2 (last 2), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (PERMIT(), vec!["request 2 of w2 for round 0"]),
            (PERMIT(), vec![]), // task 1's request of round 0 is outstanding
            (element(1, "a"), vec!["deliver \"a\""]),
            (DELIVERED(), vec![]),
            (PERMIT(), vec!["request 1 of w1 for round 1"]),
            (PERMIT(), vec![]),
            (element(2, "b"), vec!["deliver \"b\""]),
            (DELIVERED(), vec![]),
            (PERMIT(), vec!["request 2 of w2 for round 1"]),
        ]),
        ("no more requests are outstanding than max_outstanding_requests", 1, vec![
            (listing(&[(1, 0), (2, 0)], false, None), vec!["heartbeat knowing 2 (last 2), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (PERMIT(), vec![]),
            (skip(1), vec![]),
            (PERMIT(), vec!["request 2 of w2 for round 0"]),
        ]),
        ("a task is asked from its starting round; a skip is reported with the task's next request", 4, vec![
            (listing(&[(1, 0), (2, 1)], false, None), vec!["heartbeat knowing 2 (last 2), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (PERMIT(), vec![]), // task 2 is not in round 0, and task 1 is busy
            (skip(1), vec![]),
            (PERMIT(), vec!["request 1 of w1 for round 1, after a skip"]),
            (PERMIT(), vec!["request 2 of w2 for round 1"]),
        ]),
        ("a removed task is never asked again; with every task removed nothing is", 4, vec![
            (listing(&[(1, 0), (2, 0)], false, None), vec!["heartbeat knowing 2 (last 2), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (removed(1), vec![]),
            (PERMIT(), vec!["request 2 of w2 for round 0"]),
            (skip(2), vec![]),
            (PERMIT(), vec!["request 2 of w2 for round 1, after a skip"]),
            (removed(2), vec![]),
            (PERMIT(), vec![]),
        ]),
        ("a pending task blocks its round; heartbeats report the rounds every 20 ms until it is listed", 4, vec![
            (listing(&[(1, 0)], false, Some(1)), vec!["heartbeat knowing 1 (last 1), round 0, blocked 1, after 20 ms, now"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (element(1, "a"), vec!["deliver \"a\""]),
            (DELIVERED(), vec![]),
            (PERMIT(), vec![]), // round 1 is blocked
            (unchanged(false, Some(1)), vec!["heartbeat knowing 1 (last 1), round 1, blocked 1, after 20 ms, now"]),
            (listing(&[(1, 0), (2, 1)], false, None), vec!["heartbeat knowing 2 (last 2), round 1, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 1"]),
            (PERMIT(), vec!["request 2 of w2 for round 1"]),
        ]),
        ("a block at a round the consumer started already does not stop it (the dispatcher moves it later)", 4, vec![
            (listing(&[(1, 0)], false, None), vec!["heartbeat knowing 1 (last 1), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (unchanged(false, Some(0)), vec!["heartbeat knowing 1 (last 1), round 1, blocked -, after 20 ms, now"]),
            (skip(1), vec![]),
            (PERMIT(), vec!["request 1 of w1 for round 1, after a skip"]),
            (unchanged(false, Some(3)), vec!["heartbeat knowing 1 (last 1), round 2, blocked 3, after 20 ms, now"]),
            (unchanged(false, Some(2)), vec!["heartbeat knowing 1 (last 1), round 2, blocked 3, after 20 ms, now"]),
        ]),
        ("a task no longer listed is dropped, and the position in the round kept", 4, vec![
            (listing(&[(1, 0), (2, 0), (3, 0)], false, None), vec!["heartbeat knowing 3 (last 3), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (PERMIT(), vec!["request 2 of w2 for round 0"]),
            (listing(&[(1, 0), (3, 0)], false, None), vec!["heartbeat knowing 2 (last 3), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 3 of w3 for round 0"]),
            (skip(2), vec![]), // a reply of the task dropped changes nothing
            (skip(1), vec![]),
            (PERMIT(), vec!["request 1 of w1 for round 1, after a skip"]),
        ]),
        ("dropping the tasks after the position starts the next round", 4, vec![
            (listing(&[(1, 0), (2, 0)], false, None), vec!["heartbeat knowing 2 (last 2), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (listing(&[(1, 0)], false, None), vec!["heartbeat knowing 1 (last 1), round 1, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec![]),
            (skip(1), vec![]),
            (PERMIT(), vec!["request 1 of w1 for round 1, after a skip"]),
        ]),
        ("once the iteration finished nothing is asked, and the epoch ends with the last reply delivered", 4, vec![
            (listing(&[(1, 0), (2, 0)], false, None), vec!["heartbeat knowing 2 (last 2), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (PERMIT(), vec!["request 2 of w2 for round 0"]),
            (unchanged(true, None), vec!["heartbeat knowing 2 (last 2), round 1, blocked -, after 0 ms, drawn"]),
            (skip(1), vec![]),
            (PERMIT(), vec![]),
            (element(2, "b"), vec!["deliver \"b\""]),
            (DELIVERED(), vec!["end"]),
        ]),
        ("an iteration finished with nothing outstanding ends the epoch at once", 4, vec![
            (listing(&[(1, 0)], false, None), vec!["heartbeat knowing 1 (last 1), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (removed(1), vec![]),
            (listing(&[(1, 0)], true, None), vec!["end"]),
            (PERMIT(), vec![]),
        ]),
        ("an iteration without tasks asks nothing", 4, vec![
            (listing(&[], false, None), vec!["heartbeat knowing 0 (last -), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec![]),
            (unchanged(true, None), vec!["end"]),
        ]),
        ("a refused request ends the epoch with its error; nothing is decided after the end", 4, vec![
            (listing(&[(1, 0), (2, 0)], false, None), vec!["heartbeat knowing 2 (last 2), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (PERMIT(), vec!["request 2 of w2 for round 0"]),
            (refused(1), vec!["end: Failed to get element from worker w1: deleted"]),
            (element(2, "b"), vec![]),
            (PERMIT(), vec![]),
        ]),
        ("a failed heartbeat, or an element that does not decode, ends the epoch with the error", 4, vec![
            (listing(&[(1, 0)], false, None), vec!["heartbeat knowing 1 (last 1), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (element(1, "a"), vec!["deliver \"a\""]),
            (failed("not an element"), vec!["end: not an element"]),
            (DELIVERED(), vec![]),
        ]),
        ("cancellation, or a consumer gone, ends the epoch without an error", 4, vec![
            (listing(&[(1, 0)], false, None), vec!["heartbeat knowing 1 (last 1), round 0, blocked -, after 0 ms, drawn"]),
            (PERMIT(), vec!["request 1 of w1 for round 0"]),
            (Event::Cancelled, vec!["end"]),
            (skip(1), vec![]),
        ]),
    ];
    for (name, max_outstanding, steps) in cases {
        run(name, max_outstanding, steps);
    }
}
