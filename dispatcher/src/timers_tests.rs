//! Table tests of `Timers::decide`: a state built through `apply`, contacts recorded at chosen
//! times, and the exact updates the leader proposes at a given time.

use super::*;
use crate::state::{ApplyContext, DatasetMetadata, JobOptions, Outcome};
use sluice_element::Compression;
use sluice_types::{DatasetId, JobId, ShardingPolicy};

const SECOND: Duration = Duration::from_secs(1);
/// The wall clock (µs) at which the test state's client was released.
const RELEASED_AT: u64 = 1_000_000_000;

fn timers() -> Timers {
    Timers {
        worker_timeout: 10 * SECOND,
        client_timeout: 30 * SECOND,
        job_gc_timeout: Some(60 * SECOND),
        gc_dynamic_jobs: false,
        dataset_gc_timeout: None,
    }
}

fn apply(state: &mut DispatcherState, time_micros: u64, update: Update) -> Outcome {
    let ctx = ApplyContext {
        log_index: 0,
        time_micros,
    };
    let outcome = state.apply(ctx, &Request { id: None, update });
    assert!(!matches!(outcome, Outcome::Rejected(_)), "{outcome:?}");
    outcome
}

/// One worker `w1`, and one job of `sharding` with two iterations: 2000 has client 3000
/// attached, 2001 lost its only client (3001) at `RELEASED_AT`.
fn state(sharding: ShardingPolicy) -> DispatcherState {
    let mut state = DispatcherState::default();
    let metadata = DatasetMetadata {
        element_spec: vec![],
        cardinality: 10,
        compression: Compression::Auto,
    };
    apply(
        &mut state,
        0,
        Update::RegisterDataset {
            dataset_id: Some(DatasetId("d".into())),
            def: vec![1],
            metadata,
            num_splits: vec![10],
        },
    );
    apply(
        &mut state,
        0,
        Update::RegisterWorker {
            address: "w1".into(),
            tags: vec![],
            worker_addresses: vec![],
            owner: String::new(),
        },
    );
    apply(
        &mut state,
        0,
        Update::GetOrCreateJob {
            dataset_id: DatasetId("d".into()),
            sharding,
            job_name: Some("job".into()),
            anonymous_suffix: 0,
            options: JobOptions::default(),
        },
    );
    for repetition in [0, 1] {
        apply(
            &mut state,
            0,
            Update::GetOrCreateIteration {
                job_id: JobId(5000),
                repetition,
            },
        );
    }
    apply(
        &mut state,
        RELEASED_AT,
        Update::ReleaseIterationClient {
            client_id: ClientId(3001),
        },
    );
    state
}

struct Case {
    name: &'static str,
    sharding: ShardingPolicy,
    timers: Timers,
    /// When this replica became leader, in seconds after the test's origin.
    leader_since: u64,
    /// Last contact with `w1` and with client 3000, in seconds after the origin (`None`: never
    /// heard from by this leader).
    worker_seen: Option<u64>,
    client_seen: Option<u64>,
    /// The time of the decision, in seconds after the origin, and in seconds after the release
    /// on the wall clock.
    now: u64,
    wall_after_release: u64,
    expected: Vec<Update>,
}

fn base(name: &'static str) -> Case {
    Case {
        name,
        sharding: ShardingPolicy::Off,
        timers: timers(),
        leader_since: 0,
        worker_seen: Some(100),
        client_seen: Some(100),
        now: 105,
        wall_after_release: 0,
        expected: vec![],
    }
}

fn remove_w1() -> Update {
    Update::RemoveWorker {
        address: "w1".into(),
    }
}

fn release_3000() -> Update {
    Update::ReleaseIterationClient {
        client_id: ClientId(3000),
    }
}

fn collect_2001() -> Update {
    Update::GarbageCollectIteration {
        iteration_id: IterationId(2001),
    }
}

#[test]
fn decide_proposes_exactly_the_expired_and_idle() {
    let cases = vec![
        base("everyone heard from recently: nothing"),
        Case {
            worker_seen: Some(94),
            expected: vec![remove_w1()],
            ..base("a worker silent past its timeout is removed")
        },
        Case {
            worker_seen: Some(95),
            ..base("a worker silent exactly its timeout is kept")
        },
        Case {
            client_seen: Some(74),
            expected: vec![release_3000()],
            ..base("a client silent past its timeout is released")
        },
        Case {
            worker_seen: Some(1),
            client_seen: Some(1),
            expected: vec![remove_w1(), release_3000()],
            ..base("both expire together, workers first")
        },
        Case {
            leader_since: 100,
            worker_seen: None,
            client_seen: None,
            now: 109,
            ..base("grace: a new leader expires nobody it never heard from before a timeout")
        },
        Case {
            leader_since: 100,
            worker_seen: None,
            client_seen: None,
            now: 111,
            expected: vec![remove_w1()],
            ..base("grace: a worker never heard from expires a timeout after the election")
        },
        Case {
            leader_since: 100,
            worker_seen: Some(1),
            client_seen: Some(1),
            now: 109,
            ..base("grace: contacts before the election count from the election")
        },
        Case {
            wall_after_release: 60,
            expected: vec![collect_2001()],
            ..base("an iteration without clients for the GC timeout is collected")
        },
        Case {
            wall_after_release: 59,
            ..base("an iteration idle for less than the GC timeout is kept")
        },
        Case {
            sharding: ShardingPolicy::Dynamic,
            wall_after_release: 600,
            ..base("a distributed_epoch iteration is not collected by default")
        },
        Case {
            sharding: ShardingPolicy::Dynamic,
            timers: Timers {
                gc_dynamic_jobs: true,
                ..timers()
            },
            wall_after_release: 600,
            expected: vec![collect_2001()],
            ..base("a distributed_epoch iteration is collected when configured")
        },
        Case {
            timers: Timers {
                job_gc_timeout: None,
                ..timers()
            },
            wall_after_release: 6000,
            ..base("without a GC timeout nothing is collected")
        },
    ];
    let origin = Instant::now();
    let at = |secs: u64| origin + Duration::from_secs(secs);
    for case in cases {
        let liveness = Liveness::default();
        if let Some(seen) = case.worker_seen {
            liveness.worker_seen_at("w1", at(seen));
        }
        if let Some(seen) = case.client_seen {
            liveness.client_seen_at(3000, at(seen));
        }
        let now = Now {
            instant: at(case.now),
            wall_micros: RELEASED_AT + case.wall_after_release * 1_000_000,
        };
        let decided =
            case.timers
                .decide(now, at(case.leader_since), &state(case.sharding), &liveness);
        assert_eq!(decided, case.expected, "{}", case.name);
    }
}

#[test]
fn a_finished_iterations_clients_are_not_timed_out() {
    let mut state = state(ShardingPolicy::Off);
    let Some(task) = state.active_tasks_of_worker("w1").first().copied() else {
        panic!("w1 has tasks");
    };
    apply(
        &mut state,
        0,
        Update::FinishTasks {
            worker: "w1".into(),
            task_ids: vec![task],
        },
    );
    assert!(state.iteration(IterationId(2000)).unwrap().finished);
    let liveness = Liveness::default();
    let origin = Instant::now();
    liveness.worker_seen_at("w1", origin + 1000 * SECOND);
    let now = Now {
        instant: origin + 1000 * SECOND,
        wall_micros: RELEASED_AT,
    };
    assert_eq!(timers().decide(now, origin, &state, &liveness), vec![]);
}

#[test]
fn the_check_interval_is_a_quarter_of_the_shortest_timeout_within_bounds() {
    assert_eq!(timers().check_interval(), SECOND);
    let short = Timers {
        worker_timeout: Duration::from_millis(400),
        ..timers()
    };
    assert_eq!(short.check_interval(), Duration::from_millis(100));
    let tiny = Timers {
        client_timeout: Duration::from_millis(10),
        ..timers()
    };
    assert_eq!(tiny.check_interval(), Duration::from_millis(50));
}

#[test]
fn what_stayed_idle_for_its_timeout_is_removed() {
    let mut state = state(ShardingPolicy::Off);
    apply(
        &mut state,
        RELEASED_AT + 60 * 1_000_000,
        Update::GarbageCollectIteration {
            iteration_id: IterationId(2001),
        },
    );
    let liveness = Liveness::default();
    let origin = Instant::now();
    liveness.worker_seen_at("w1", origin);
    liveness.client_seen_at(3000, origin);
    let decide = |timers: Timers, wall_after_release: u64| {
        let now = Now {
            instant: origin,
            wall_micros: RELEASED_AT + wall_after_release,
        };
        timers.decide(now, origin, &state, &liveness)
    };
    assert_eq!(
        decide(timers(), 60 * 1_000_000),
        vec![],
        "released exactly the timeout ago: kept"
    );
    let with_datasets = Timers {
        dataset_gc_timeout: Some(SECOND),
        ..timers()
    };
    assert_eq!(
        decide(with_datasets, 60 * 1_000_000 + 1),
        vec![Update::RemoveIdle {
            iterations_before: RELEASED_AT + 1,
            datasets_before: RELEASED_AT + 59 * 1_000_000 + 1,
            iterations: vec![IterationId(2001)],
            jobs: vec![],
            datasets: vec![],
        }],
        "the collected iteration goes; the job has another iteration, the dataset a job"
    );
}

#[test]
fn a_client_that_a_moving_stream_waits_on_is_released_after_the_release_wait() {
    // An exactly-once distributed_epoch job on workers w1 and w2, read by client 3000; w1 was
    // removed, so its task's stream waits for the client to let go of it.
    let mut state = DispatcherState::default();
    apply(
        &mut state,
        0,
        Update::RegisterDataset {
            dataset_id: Some(DatasetId("d".into())),
            def: vec![1],
            metadata: DatasetMetadata {
                element_spec: vec![],
                cardinality: 10,
                compression: Compression::Auto,
            },
            num_splits: vec![10],
        },
    );
    for worker in ["w1", "w2"] {
        apply(
            &mut state,
            0,
            Update::RegisterWorker {
                address: worker.into(),
                tags: vec![],
                worker_addresses: vec![],
                owner: String::new(),
            },
        );
    }
    apply(
        &mut state,
        0,
        Update::GetOrCreateJobWithDelivery {
            dataset_id: DatasetId("d".into()),
            sharding: ShardingPolicy::Dynamic,
            job_name: Some("job".into()),
            anonymous_suffix: 0,
            options: JobOptions::default(),
            delivery: sluice_types::Delivery::ExactlyOnce,
        },
    );
    apply(
        &mut state,
        0,
        Update::GetOrCreateIteration {
            job_id: JobId(5000),
            repetition: 0,
        },
    );
    let timers = timers();
    assert_eq!(timers.release_wait(), 20 * SECOND);
    let origin = Instant::now();
    let at = |s: u64| origin + Duration::from_secs(s);
    let decide = |state: &DispatcherState, silent_for: u64| {
        let liveness = Liveness::default();
        liveness.worker_seen_at("w1", at(100));
        liveness.worker_seen_at("w2", at(100));
        liveness.client_seen_at(3000, at(100));
        let now = Now {
            instant: at(100 + silent_for),
            wall_micros: 0,
        };
        timers
            .decide(now, origin, state, &liveness)
            .into_iter()
            .filter(|u| matches!(u, Update::ReleaseIterationClient { .. }))
            .count()
    };
    // Nothing waits on it: only the client timeout (30 s) releases it.
    assert_eq!(decide(&state, 21), 0);
    apply(
        &mut state,
        0,
        Update::RemoveWorker {
            address: "w1".into(),
        },
    );
    assert_eq!(decide(&state, 19), 0, "silent less than the release wait");
    assert_eq!(decide(&state, 21), 1, "silent past the release wait");
}
