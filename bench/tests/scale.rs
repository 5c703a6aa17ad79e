//! The scale workload and the soak, small, against a three-replica quorum in this process.

use sluice_bench::{run_scale, run_soak, ScaleConfig, SoakConfig, Target};
use sluice_security::ClientSecurity;
use sluice_testkit::LocalCluster;
use std::time::Duration;

async fn quorum() -> (LocalCluster, Target) {
    target_of(LocalCluster::start(3, 0).await.expect("start the quorum"))
}

fn target_of(cluster: LocalCluster) -> (LocalCluster, Target) {
    let target = Target {
        addrs: cluster
            .dispatcher_addrs()
            .split(',')
            .map(str::to_string)
            .collect(),
        pids: Vec::new(),
        security: ClientSecurity::default(),
    };
    (cluster, target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_fleet_heartbeats_and_leases_without_errors() {
    let (cluster, target) = quorum().await;
    let config = ScaleConfig {
        workers: 20,
        clients: 100,
        jobs: 3,
        // Longer than a client's longest poll (10 s): every simulated client's heartbeat comes
        // back inside the window however loaded the machine (in a 3 s window, one at a load of
        // 12 on two cores timed no client heartbeat at all).
        duration: Duration::from_secs(12),
        // About a second of leasing per iteration: iterations end and clients move on.
        splits: 2000,
        split_cost: Duration::from_millis(10),
        callers_per_connection: 30,
        setup_timeout: Duration::from_secs(60),
        warmup: Duration::from_millis(500),
    };
    let f = run_scale(&target, &config).await.expect("scale run");
    println!("{f:?}");
    assert_eq!(f.errors, 0, "first error: {:?}", f.first_error);
    // Heartbeats arrive. How many the window times is `scale_heartbeats` in `sluice bench
    // --only scale`: a loaded machine times far fewer in 3 s (17 at a load of 12 on two cores).
    assert!(f.heartbeats > 0, "no heartbeat timed");
    assert!(f.worker_heartbeat_p99_ms > 0.0 && f.client_heartbeat_p99_ms > 0.0);
    assert!(f.heartbeat_p50_ms <= f.heartbeat_p99_ms);
    // Heartbeats arrived in the window (in how many of its seconds is `sluice bench --only
    // scale`'s `scale_seconds_with_heartbeats`: a loaded machine may starve the fleet for a
    // second); the worst second's p99 is at least the median's.
    assert!(f.seconds >= 1, "heartbeats in {} seconds", f.seconds);
    assert!(f.second_p99_median_ms > 0.0 && f.second_p99_median_ms <= f.second_p99_worst_ms);
    assert!(f.seconds_p99_over_100ms <= f.seconds);
    // Heartbeats are answered: a bound only a hang crosses (the p99 is the benchmark's figure,
    // `scale_heartbeat_p99_ms`: 15-31 ms in a release build).
    assert!(
        f.heartbeat_p99_ms < sluice_testwait::HANG.as_secs_f64() * 1000.0,
        "p99 {} ms: heartbeats hung",
        f.heartbeat_p99_ms
    );
    assert!(f.leases_per_s > 0.0 && f.splits_per_s >= f.leases_per_s);
    // Each of a worker's three tasks leases through its one client: a call carries one lease at
    // least, and never more than the worker's tasks (give or take the calls on the window's
    // edges: a call is counted when sent, its leases when answered).
    assert!(f.lease_calls_per_s > 0.0);
    assert!(
        (0.9..=3.3).contains(&f.leases_per_call),
        "{} leases per call",
        f.leases_per_call
    );
    assert!(f.tasks_finished > 0, "no task finished");
    assert!(f.state_mib > 0.0 && f.leader_rss_mib > 0.0);
    assert!(f.leader_cpu_percent > 0.0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_soak_finishes_every_job_and_reports_sizes() {
    // Long enough that a job is not collected between its creation and its first client's
    // iteration on a loaded machine (with 1 s, one was: "Job with id 5193 not found").
    const GC: Duration = Duration::from_secs(5);
    let cluster = LocalCluster::start_with(3, 0, |config| config.job_gc_timeout = Some(GC))
        .await
        .expect("start the quorum");
    let (cluster, target) = target_of(cluster);
    let config = SoakConfig {
        jobs: 200,
        callers: 4,
        workers: 1,
        drain_timeout: Duration::from_secs(60),
        job_gc_timeout: GC,
    };
    let f = run_soak(&target, &config).await.expect("soak");
    println!("{f:?}");
    assert_eq!(f.errors, 0, "first error: {:?}", f.first_error);
    assert!(f.tasks_finished > 0, "no task finished");
    assert!(f.state_mib > 0.0);
    assert!(f.leader_rss_ratio > 0.0 && f.jobs_per_s > 0.0);
    let leader = cluster
        .wait_for_leader(Duration::from_secs(20))
        .await
        .expect("a leader");
    let sizes = cluster.state_of(leader).expect("the leader runs").sizes();
    assert_eq!(
        (sizes.jobs, sizes.iterations, sizes.tasks),
        (0, 0, 0),
        "every finished job was removed"
    );
    cluster.shutdown().await;
}
