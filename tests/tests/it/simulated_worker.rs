//! A worker simulated through the dispatcher API alone: it registers, keeps heartbeating (so it
//! is never removed), and leases splits for its tasks as a real worker does, from one client
//! (one requester). Tests drive its requests one by one.

use sluice_client::DispatcherClientExt;
use sluice_rpc::{DispatcherClient, JobRequest, WorkerHeartbeat};
use sluice_tests::TestCluster;
use sluice_types::{DatasetId, IterationId, LeaseRequest, ShardingPolicy, TaskId};
use std::time::Duration;

pub struct SimulatedWorker {
    /// The worker's own client: every lease goes through it.
    pub client: DispatcherClient,
    /// One `(iteration, task)` per distributed_epoch iteration made for it.
    pub tasks: Vec<(IterationId, TaskId)>,
    heartbeats: tokio::task::JoinHandle<()>,
}

impl SimulatedWorker {
    /// Registers `range(splits)` and `iterations` anonymous distributed_epoch iterations of it,
    /// then a worker at `127.0.0.1:9`, which gets a task in each.
    pub async fn start(
        cluster: &TestCluster,
        splits: i64,
        iterations: usize,
    ) -> anyhow::Result<SimulatedWorker> {
        let trainer = cluster.client();
        let dataset_id = trainer
            .register_dataset(
                &sluice_pipeline::Dataset::range(splits),
                &Default::default(),
            )
            .await?;
        let mut iteration_ids = Vec::new();
        for _ in 0..iterations {
            let job = trainer
                .get_or_create_job(&JobRequest {
                    dataset_id: DatasetId(dataset_id.clone()),
                    sharding: ShardingPolicy::Dynamic,
                    job_name: None,
                    num_consumers: None,
                    use_cross_trainer_cache: false,
                    target_workers: Default::default(),
                    // Simulated workers number no elements: tf.data's delivery.
                    delivery: sluice_types::Delivery::AtMostOnce,
                })
                .await?;
            let iteration = trainer.get_or_create_iteration(job, 0).await?;
            iteration_ids.push(iteration.iteration_id);
        }
        let client = cluster.client();
        let mut heartbeat = WorkerHeartbeat {
            worker: "127.0.0.1:9".into(),
            current_tasks: vec![],
            tags: vec![],
            incarnation: 0,
        };
        let new_tasks = client
            .worker_heartbeat(&heartbeat, Duration::ZERO)
            .await?
            .new_tasks;
        let tasks: Vec<(IterationId, TaskId)> = iteration_ids
            .iter()
            .map(|it| {
                let task = new_tasks
                    .iter()
                    .find(|t| t.iteration_id == it.0)
                    .expect("a task in each iteration");
                (*it, TaskId(task.task_id))
            })
            .collect();
        heartbeat.current_tasks = tasks.iter().map(|(_, t)| *t).collect();
        let heartbeats = {
            let client = cluster.client();
            tokio::spawn(async move {
                loop {
                    let _ = client
                        .worker_heartbeat(&heartbeat, Duration::from_millis(100))
                        .await;
                }
            })
        };
        Ok(SimulatedWorker {
            client,
            tasks,
            heartbeats,
        })
    }

    /// A lease request of one split of repetition `repetition` for task `index`.
    pub fn lease(&self, index: usize, repetition: u64) -> LeaseRequest {
        let (iteration_id, task_id) = self.tasks[index];
        LeaseRequest {
            iteration_id,
            task_id,
            provider: 0,
            repetition,
            max_splits: 1,
        }
    }
}

impl Drop for SimulatedWorker {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}
