//! A reader's state, in process: a reader takes its state, reads on, and is dropped without a
//! word (as a killed trainer); a new reader restores from the state and reads to the end. What
//! was read before the state plus what the restored reader reads is the epoch, each element
//! once; several readers taking states at one step and fewer restoring cover it the same way;
//! static sharding resumes too; and a state outlives its job and dataset (collected, then
//! registered again), while a state of another definition is refused.

use crate::{assert_exactly_once, read_ints};
use sluice_client::{DispatcherClientExt, DistributeOptions, ShardingPolicy};
use sluice_pipeline::Dataset;
use sluice_tests::TestCluster;

const N: i64 = 6000;

fn named(job: &str) -> DistributeOptions {
    DistributeOptions {
        job_name: Some(job.into()),
        max_outstanding_requests: Some(64),
        ..DistributeOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_reader_reads_what_it_had_not_read_before_its_state_once() -> anyhow::Result<()>
{
    let cluster = TestCluster::start(1, 2).await?;
    let client = cluster.client();
    let dataset = Dataset::range(N);
    let service = client
        .distribute(&dataset, ShardingPolicy::Dynamic, named("train"))
        .await?;
    let mut epoch = service.iter().await?;
    let mut before = read_ints(&mut epoch, 1500).await?;
    let state = epoch.state().await?;
    assert_eq!(state.step, 1500);
    // Read after the state: the killed trainer's model never kept these.
    read_ints(&mut epoch, 700).await?;
    drop(epoch);

    let restored = client
        .distribute(&dataset, ShardingPolicy::Dynamic, named("train"))
        .await?;
    restored.load_state(state.clone())?;
    let mut epoch = restored.iter().await?;
    assert_eq!(epoch.position(), 1500);
    let mut after = Vec::new();
    while let Some(element) = epoch.next().await {
        after.push(element?.as_i64().expect("an integer"));
    }
    before.extend(after);
    assert_exactly_once(&before, N);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_readers_at_one_step_resume_as_two() -> anyhow::Result<()> {
    let cluster = TestCluster::start(1, 2).await?;
    let client = cluster.client();
    let dataset = Dataset::range(N);
    // One dataset object per rank, as each trainer process has its own: each reads the job's
    // first epoch.
    let mut epochs = Vec::new();
    for _ in 0..4 {
        let service = client
            .distribute(&dataset, ShardingPolicy::Dynamic, named("ranks"))
            .await?;
        epochs.push(service.iter().await?);
    }
    let mut read = Vec::new();
    let mut states = Vec::new();
    for epoch in &mut epochs {
        read.extend(read_ints(epoch, 500).await?);
    }
    for epoch in &mut epochs {
        states.push(epoch.state().await?);
    }
    for epoch in &mut epochs {
        read_ints(epoch, 100).await?;
    }
    drop(epochs);
    let mut restored = Vec::new();
    for state in &states[..2] {
        let service = client
            .distribute(&dataset, ShardingPolicy::Dynamic, named("ranks"))
            .await?;
        service.load_state(state.clone())?;
        restored.push(service.iter().await?);
    }
    let mut handles = Vec::new();
    for mut epoch in restored {
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(element) = epoch.next().await {
                got.push(element?.as_i64().expect("an integer"));
            }
            anyhow::Ok(got)
        }));
    }
    for handle in handles {
        read.extend(handle.await??);
    }
    assert_exactly_once(&read, N);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_sharding_reader_resumes_from_its_state() -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    let cluster = TestCluster::start_static(1, 2, &["127.0.0.1:%port%"; 2]).await?;
    let client = cluster.client();
    let dataset = Dataset::range(N);
    let service = client
        .distribute(&dataset, ShardingPolicy::Data, named("static"))
        .await?;
    let mut epoch = service.iter().await?;
    let mut before = read_ints(&mut epoch, 2500).await?;
    let state = epoch.state().await?;
    read_ints(&mut epoch, 400).await?;
    drop(epoch);

    let restored = client
        .distribute(&dataset, ShardingPolicy::Data, named("static"))
        .await?;
    restored.load_state(state)?;
    let mut epoch = restored.iter().await?;
    while let Some(element) = epoch.next().await {
        before.push(element?.as_i64().expect("an integer"));
    }
    assert_exactly_once(&before, N);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_outlives_its_job_and_dataset() -> anyhow::Result<()> {
    sluice_tests::init_tracing();
    let cluster = TestCluster::start_with(1, 2, |config| {
        config.job_gc_timeout = Some(std::time::Duration::from_millis(200));
        config.dataset_gc_timeout = Some(std::time::Duration::from_millis(200));
        config.gc_dynamic_jobs = true;
    })
    .await?;
    let client = cluster.client();
    let dataset = Dataset::range(N);
    let service = client
        .distribute(&dataset, ShardingPolicy::Dynamic, named("collected"))
        .await?;
    let mut epoch = service.iter().await?;
    let mut before = read_ints(&mut epoch, 1000).await?;
    let state = epoch.state().await?;
    epoch.close(sluice_tests::HANG).await;
    drop(service);
    let leader = cluster.wait_for_leader(sluice_tests::HANG).await?;
    sluice_tests::wait_until(
        "the job and its dataset collected",
        sluice_tests::HANG,
        || {
            cluster.state_of(leader).is_some_and(|state| {
                state.jobs().all(|job| job.name != "collected") && state.datasets().next().is_none()
            })
        },
    )
    .await?;

    // The same definition registered again, the job created again under its name.
    let restored = client
        .distribute(&dataset, ShardingPolicy::Dynamic, named("collected"))
        .await?;
    let state_again = state.clone();
    restored.load_state(state)?;
    let mut epoch = restored.iter().await?;
    while let Some(element) = epoch.next().await {
        before.push(element?.as_i64().expect("an integer"));
    }
    assert_exactly_once(&before, N);
    epoch.close(sluice_tests::HANG).await;
    drop(restored);
    sluice_tests::wait_until("the job collected again", sluice_tests::HANG, || {
        cluster
            .state_of(leader)
            .is_some_and(|state| state.jobs().all(|job| job.name != "collected"))
    })
    .await?;

    // Another definition under the job's name is refused, naming both.
    let other = client
        .distribute(
            &Dataset::range(N + 1),
            ShardingPolicy::Dynamic,
            named("collected"),
        )
        .await?;
    other.load_state(state_again)?;
    let message = match other.iter().await {
        Err(e) => e.to_string(),
        Ok(_) => anyhow::bail!("a state of another definition was restored"),
    };
    assert!(
        message.contains("the state was taken reading dataset definition")
            && message.contains("and job 'collected' reads definition"),
        "{message}"
    );
    cluster.shutdown().await;
    Ok(())
}
