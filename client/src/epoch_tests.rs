//! Table tests of `Epoch::handle`: each case is a script of events applied to a fresh epoch of a
//! reader with the given `target_workers` and `max_outstanding_requests`, with the decisions
//! every step must produce (written as `show` renders them).

use super::*;

/// A task of worker `w<id>`, which runs in another process.
fn remote(id: u64) -> Listed {
    listed(id, false, &[])
}
/// A task of worker `w<id>`, which runs in this process.
fn local(id: u64) -> Listed {
    listed(id, true, &[])
}
/// A task of a worker tagged `COLOCATED` (it serves its own host's trainer).
fn colocated(id: u64, local: bool) -> Listed {
    listed(id, local, &["colocated"])
}
fn listed(id: u64, local: bool, tags: &[&str]) -> Listed {
    Listed {
        task: pb::TaskInfo {
            task_id: id,
            worker_address: format!("w{id}"),
            worker_tags: tags.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        },
        local,
    }
}

/// A heartbeat reply listing `tasks`.
fn listing(tasks: &[Listed], iteration_finished: bool) -> Event {
    Event::Heartbeat {
        tasks: Some(tasks.to_vec()),
        iteration_finished,
    }
}
/// A heartbeat reply that says the task list known is current.
fn unchanged(iteration_finished: bool) -> Event {
    Event::Heartbeat {
        tasks: None,
        iteration_finished,
    }
}
fn ended(task_id: u64) -> Event {
    Event::TaskEnded {
        task_id,
        result: Ok(()),
    }
}
fn failed(task_id: u64, message: &str) -> Event {
    Event::TaskEnded {
        task_id,
        result: Err(ClientError::worker(format!("w{task_id}"), message)),
    }
}
fn heartbeat_failed() -> Event {
    Event::HeartbeatFailed(ClientError::Unavailable {
        attempts: 3,
        message: "no leader".into(),
    })
}

/// A decision as the tables write it.
fn show(decision: &Decision) -> String {
    match decision {
        Decision::Open { task, max_credits } => {
            format!("open {} ({max_credits} credits)", task.task_id)
        }
        Decision::Skip { task_id, worker } => format!("skip {task_id} of {worker}"),
        Decision::IterationFinished => "iteration finished".into(),
        Decision::Heartbeat { known_tasks, poll } => {
            let last = known_tasks
                .last
                .map_or_else(|| "-".to_string(), |l| l.to_string());
            let poll = match poll {
                Poll::Now => "now",
                Poll::Drawn => "drawn",
            };
            format!(
                "heartbeat knowing {} (last {last}), {poll}",
                known_tasks.count
            )
        }
        Decision::End {
            error,
            delete_local,
        } => {
            let mut text = match error {
                None => "end".to_string(),
                Some(e) => format!("end: {e}"),
            };
            if !delete_local.is_empty() {
                let ids: Vec<u64> = delete_local.iter().map(|t| t.task_id).collect();
                text += &format!(", deleting {ids:?}");
            }
            text
        }
    }
}

type Step = (Event, Vec<&'static str>);

fn run(name: &str, target_workers: TargetWorkers, outstanding: u32, steps: Vec<Step>) {
    let mut epoch = Epoch::new(target_workers, outstanding);
    let first: Vec<String> = epoch.start().iter().map(show).collect();
    assert_eq!(
        first,
        ["heartbeat knowing 0 (last -), now"],
        "case {name:?}"
    );
    for (i, (event, want)) in steps.into_iter().enumerate() {
        let shown = format!("{event:?}");
        let got: Vec<String> = epoch.handle(event).iter().map(show).collect();
        assert_eq!(got, want, "case {name:?}, step {i}: {shown}");
    }
}

#[test]
fn epoch_table() {
    use TargetWorkers::*;
    let cases: Vec<(&str, TargetWorkers, u32, Vec<Step>)> = vec![
        ("listed tasks are opened with equal shares of the credits; the epoch ends once the iteration finished and every stream ended", Any, 8, vec![
            (listing(&[remote(1), remote(2)], false), vec!["open 1 (4 credits)", "open 2 (4 credits)", "heartbeat knowing 2 (last 2), drawn"]),
            (ended(1), vec![]),
            (unchanged(true), vec!["iteration finished", "heartbeat knowing 2 (last 2), drawn"]),
            (ended(2), vec!["end"]),
        ]),
        ("streams that all ended wait for the iteration to finish", Any, 8, vec![
            (listing(&[remote(1)], false), vec!["open 1 (8 credits)", "heartbeat knowing 1 (last 1), drawn"]),
            (ended(1), vec![]),
            (unchanged(false), vec!["heartbeat knowing 1 (last 1), drawn"]),
            (unchanged(true), vec!["iteration finished", "end"]),
        ]),
        ("tasks joining later share the credits with every task read so far; none is opened twice", Any, 8, vec![
            (listing(&[remote(1)], false), vec!["open 1 (8 credits)", "heartbeat knowing 1 (last 1), drawn"]),
            (listing(&[remote(1), remote(2), remote(3)], false), vec!["open 2 (2 credits)", "open 3 (2 credits)", "heartbeat knowing 3 (last 3), drawn"]),
            (unchanged(false), vec!["heartbeat knowing 3 (last 3), drawn"]),
            (listing(&[remote(1), remote(2), remote(3)], false), vec!["heartbeat knowing 3 (last 3), drawn"]),
        ]),
        ("a task gets at least one credit", Any, 2, vec![
            (listing(&[remote(1), remote(2), remote(3)], false), vec!["open 1 (1 credits)", "open 2 (1 credits)", "open 3 (1 credits)", "heartbeat knowing 3 (last 3), drawn"]),
        ]),
        ("a task removed from the list is still read to its end; the list known shrinks", Any, 8, vec![
            (listing(&[remote(1), remote(2)], false), vec!["open 1 (4 credits)", "open 2 (4 credits)", "heartbeat knowing 2 (last 2), drawn"]),
            (listing(&[remote(2)], false), vec!["heartbeat knowing 1 (last 2), drawn"]),
            (listing(&[], true), vec!["iteration finished", "heartbeat knowing 0 (last -), drawn"]),
            (ended(2), vec![]),
            (ended(1), vec!["end"]),
        ]),
        ("no task is opened from the reply that says the iteration finished, nor later", Any, 8, vec![
            (listing(&[remote(1)], false), vec!["open 1 (8 credits)", "heartbeat knowing 1 (last 1), drawn"]),
            (listing(&[remote(1), remote(2)], true), vec!["iteration finished", "heartbeat knowing 2 (last 2), drawn"]),
            (listing(&[remote(1), remote(2), remote(3)], true), vec!["heartbeat knowing 3 (last 3), drawn"]),
            (ended(1), vec!["end"]),
        ]),
        ("an iteration finished before any task was read ends the epoch empty", Any, 8, vec![
            (listing(&[remote(1)], true), vec!["iteration finished", "end"]),
        ]),
        ("an iteration with no task at all ends when it finished", Any, 8, vec![
            (unchanged(false), vec!["heartbeat knowing 0 (last -), drawn"]),
            (listing(&[], false), vec!["heartbeat knowing 0 (last -), drawn"]),
            (unchanged(true), vec!["iteration finished", "end"]),
        ]),
        ("LOCAL: other processes' tasks are skipped, and the epoch ends with this reader's own tasks, which it deletes", Local, 8, vec![
            (listing(&[local(1), remote(2)], false), vec!["skip 2 of w2", "open 1 (8 credits)", "heartbeat knowing 2 (last 2), drawn"]),
            (ended(1), vec!["end, deleting [1]"]),
        ]),
        ("a skipped task stays skipped and a read one is not opened again; credits count the tasks read", Local, 8, vec![
            (listing(&[remote(1), local(2)], false), vec!["skip 1 of w1", "open 2 (8 credits)", "heartbeat knowing 2 (last 2), drawn"]),
            (listing(&[remote(1), local(2), local(3)], false), vec!["open 3 (4 credits)", "heartbeat knowing 3 (last 3), drawn"]),
            (ended(3), vec![]),
            (ended(2), vec!["end, deleting [2, 3]"]),
        ]),
        ("with a task skipped and none read, the epoch waits for a task to read or the iteration's end", Local, 8, vec![
            (listing(&[remote(1)], false), vec!["skip 1 of w1", "heartbeat knowing 1 (last 1), drawn"]),
            (unchanged(false), vec!["heartbeat knowing 1 (last 1), drawn"]),
            (listing(&[remote(1), local(2)], false), vec!["open 2 (8 credits)", "heartbeat knowing 2 (last 2), drawn"]),
            (ended(2), vec!["end, deleting [2]"]),
        ]),
        ("with a task skipped and none read, a finished iteration ends the epoch", Local, 8, vec![
            (listing(&[remote(1)], false), vec!["skip 1 of w1", "heartbeat knowing 1 (last 1), drawn"]),
            (unchanged(true), vec!["iteration finished", "end"]),
        ]),
        ("AUTO: another host's colocated worker is skipped; this host's is read and deleted, a shared worker is read and kept", Auto, 9, vec![
            (listing(&[colocated(1, true), colocated(2, false), remote(3)], false), vec!["skip 2 of w2", "open 1 (4 credits)", "open 3 (4 credits)", "heartbeat knowing 3 (last 3), drawn"]),
            (ended(1), vec![]),
            (ended(3), vec!["end, deleting [1]"]),
        ]),
        ("AUTO with nothing skipped waits for the iteration to finish", Auto, 8, vec![
            (listing(&[local(1), remote(2)], false), vec!["open 1 (4 credits)", "open 2 (4 credits)", "heartbeat knowing 2 (last 2), drawn"]),
            (ended(1), vec![]),
            (ended(2), vec![]),
            (unchanged(true), vec!["iteration finished", "end"]),
        ]),
        ("ANY reads every task and deletes none, local or colocated", Any, 8, vec![
            (listing(&[local(1), colocated(2, true)], false), vec!["open 1 (4 credits)", "open 2 (4 credits)", "heartbeat knowing 2 (last 2), drawn"]),
            (unchanged(true), vec!["iteration finished", "heartbeat knowing 2 (last 2), drawn"]),
            (ended(2), vec![]),
            (ended(1), vec!["end"]),
        ]),
        ("a failed stream ends the epoch with its error; nothing is decided after the end", Any, 8, vec![
            (listing(&[remote(1), remote(2)], false), vec!["open 1 (4 credits)", "open 2 (4 credits)", "heartbeat knowing 2 (last 2), drawn"]),
            (failed(2, "boom"), vec!["end: Failed to get element from worker w2: boom"]),
            (ended(1), vec![]),
            (unchanged(true), vec![]),
        ]),
        ("a failed heartbeat ends the epoch with its error, and the tasks read are deleted", Local, 8, vec![
            (listing(&[local(1)], false), vec!["open 1 (8 credits)", "heartbeat knowing 1 (last 1), drawn"]),
            (heartbeat_failed(), vec!["end: dispatcher unavailable after 3 attempts: no leader, deleting [1]"]),
        ]),
        ("cancellation ends the epoch without an error, and the tasks read are deleted", Local, 8, vec![
            (listing(&[local(1), local(2)], false), vec!["open 1 (4 credits)", "open 2 (4 credits)", "heartbeat knowing 2 (last 2), drawn"]),
            (Event::Cancelled, vec!["end, deleting [1, 2]"]),
            (ended(1), vec![]),
        ]),
        ("a stream that failed after the iteration finished still fails the epoch", Any, 8, vec![
            (listing(&[remote(1)], false), vec!["open 1 (8 credits)", "heartbeat knowing 1 (last 1), drawn"]),
            (unchanged(true), vec!["iteration finished", "heartbeat knowing 1 (last 1), drawn"]),
            (failed(1, "Got request for local task 1 of worker w1, which has been deleted."), vec!["end: Failed to get element from worker w1: Got request for local task 1 of worker w1, which has been deleted."]),
        ]),
    ];
    for (name, target_workers, outstanding, steps) in cases {
        run(name, target_workers, outstanding, steps);
    }
}
