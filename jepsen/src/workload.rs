//! The workload: in-process clients (the `sluice-client` library) reading from the worker
//! processes (`worker_pool`), given every dispatcher's front, so they follow the leader by
//! themselves. Clients present the client's credentials (see `run_security`), unless the run is
//! plain; their fetch streams reach each worker through its reader proxy (`worker_net`).
//!
//! A client reads distributed epochs of `range(N)`, one named job per epoch
//! (`j<seed>-c<client>-e<epoch>`), delivered as `--delivery` says (recorded with the epoch), so an element's split identity is (job, value): value v is
//! split v of provider 0, repetition 0 of the job's one iteration. Each element is recorded with
//! the worker and incarnation whose lease held the split, when the `LeaseBook` already knows it.
//! Between epochs it issues
//! other operations, each recorded as `invoke` then `ok`, `fail` (definitely not applied: the
//! request was refused) or `info` (unknown: the quorum was unavailable or the call timed out
//! after the request may have reached a leader):
//! - `register`: a dataset under an explicit, fresh id;
//! - `register` of an already acknowledged id with another definition (must `fail`);
//! - `read`: `GetDataset` of an id tried before (served after `ensure_linearizable`, so a
//!   miss of an acknowledged id is a stale read);
//! - `status`: one node's `GetStatus` (its local view; not checked, drawn in the report).

use crate::history::{delivery_name, History, Kind};
use crate::lease_book::LeaseBook;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use sluice_client::{
    ClientError, DatasetId, Delivery, DispatcherClient, DispatcherClientExt, DistributeOptions,
    RegisterOptions, RetryConfig, RpcError, ShardingPolicy,
};
use sluice_pipeline::Dataset;
use sluice_security::ClientSecurity;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What the workload does.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Every dispatcher's front, comma-separated.
    pub dispatchers: String,
    pub seed: u64,
    /// Splits (elements) per epoch; above 64 so leases cross multiples of 64.
    pub splits: u64,
    /// Elements per second one client reads at most.
    pub rate: f64,
    /// Retry deadline of single operations (short, so they complete and get classified).
    pub op_timeout: Duration,
    /// Retry deadline of an epoch's calls (heartbeats, job creation).
    pub epoch_retry: Duration,
    /// An epoch that takes longer is abandoned (`info`).
    pub epoch_timeout: Duration,
    /// What clients present to dispatchers and workers.
    pub client_security: ClientSecurity,
    /// How every epoch's job delivers (`--delivery`).
    pub delivery: Delivery,
}

/// Whether a failed call definitely changed nothing (`fail`) or may have (`info`).
fn classify(e: &ClientError) -> Kind {
    match e {
        ClientError::InvalidArgument(_)
        | ClientError::NotFound(_)
        | ClientError::FailedPrecondition(_)
        | ClientError::Dataset(_)
        | ClientError::WorkerPipeline { .. }
        | ClientError::OutOfRange(_) => Kind::Fail,
        ClientError::Unavailable { .. } | ClientError::Worker { .. } | ClientError::Rpc { .. } => {
            Kind::Info
        }
    }
}

/// One client.
pub struct Client {
    pub process: String,
    pub index: u32,
    pub config: WorkloadConfig,
    pub history: History,
    book: LeaseBook,
    /// For single operations: short retries.
    ops: DispatcherClient,
    /// For epochs: retries that outlast a failover.
    epochs: DispatcherClient,
    rng: StdRng,
    /// Ids this client tried to register, and whether the registration was acknowledged.
    tried: Vec<(String, bool)>,
}

impl Client {
    pub fn new(
        process: &str,
        index: u32,
        config: WorkloadConfig,
        history: History,
        book: LeaseBook,
    ) -> anyhow::Result<Client> {
        let ops = DispatcherClient::connect(
            &config.dispatchers,
            RetryConfig {
                rpc_timeout: config.op_timeout.min(Duration::from_secs(2)),
                retry_timeout: config.op_timeout,
                ..RetryConfig::default()
            },
            config.client_security.clone(),
        )?;
        let epochs = DispatcherClient::connect(
            &config.dispatchers,
            RetryConfig {
                rpc_timeout: Duration::from_secs(2),
                retry_timeout: config.epoch_retry,
                ..RetryConfig::default()
            },
            config.client_security.clone(),
        )?;
        let rng = StdRng::seed_from_u64(config.seed.wrapping_mul(1000).wrapping_add(index as u64));
        Ok(Client {
            process: process.to_string(),
            index,
            config,
            history,
            book,
            ops,
            epochs,
            rng,
            tried: Vec::new(),
        })
    }

    /// Epochs and operations until `cancel`.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut epoch = 0u64;
        while !cancel.is_cancelled() {
            for _ in 0..self.rng.random_range(1..=3) {
                if cancel.is_cancelled() {
                    return;
                }
                self.random_op(epoch).await;
            }
            let job = format!("j{}-c{}-e{}", self.config.seed, self.index, epoch);
            self.epoch(&job, &cancel).await;
            epoch += 1;
        }
    }

    async fn random_op(&mut self, epoch: u64) {
        let acked: Vec<String> = self
            .tried
            .iter()
            .filter(|(_, ok)| *ok)
            .map(|(id, _)| id.clone())
            .collect();
        match self.rng.random_range(0..10) {
            0..=3 => {
                let id = format!("c{}-d{}", self.index, epoch);
                if !self.tried.iter().any(|(t, _)| *t == id) {
                    self.register(&id, epoch as i64 + 1).await;
                }
            }
            4 if !acked.is_empty() => {
                let id = acked.choose(&mut self.rng).expect("not empty").clone();
                // Another definition under an acknowledged id: must be refused.
                self.register(&id, 1_000_000 + epoch as i64).await;
            }
            5..=7 if !self.tried.is_empty() => {
                let id = self
                    .tried
                    .choose(&mut self.rng)
                    .expect("not empty")
                    .0
                    .clone();
                self.read(&id).await;
            }
            _ => self.status().await,
        }
    }

    async fn register(&mut self, id: &str, stop: i64) {
        let value = json!({"dataset_id": id, "def": format!("range({stop})")});
        self.history
            .record(&self.process, Kind::Invoke, "register", value.clone());
        let options = RegisterOptions {
            dataset_id: Some(id.to_string()),
            ..RegisterOptions::default()
        };
        let result = self
            .ops
            .register_dataset(&Dataset::range(stop), &options)
            .await;
        let first = !self.tried.iter().any(|(t, _)| t == id);
        match result {
            Ok(_) => {
                self.history
                    .record(&self.process, Kind::Ok, "register", value);
                if first {
                    self.tried.push((id.to_string(), true));
                }
            }
            Err(e) => {
                let mut value = value;
                value["error"] = json!(e.to_string());
                self.history
                    .record(&self.process, classify(&e), "register", value);
                if first {
                    self.tried.push((id.to_string(), false));
                }
            }
        }
    }

    async fn read(&mut self, id: &str) {
        let value = json!({"dataset_id": id});
        self.history
            .record(&self.process, Kind::Invoke, "read", value.clone());
        let result = self.ops.get_dataset(&DatasetId::from(id)).await;
        match result {
            Ok(_) => self.history.record(
                &self.process,
                Kind::Ok,
                "read",
                json!({"dataset_id": id, "found": true}),
            ),
            Err(RpcError::NotFound(_)) => self.history.record(
                &self.process,
                Kind::Ok,
                "read",
                json!({"dataset_id": id, "found": false}),
            ),
            Err(e) => self.history.record(
                &self.process,
                Kind::Info,
                "read",
                json!({"dataset_id": id, "error": e.to_string()}),
            ),
        }
    }

    async fn status(&mut self) {
        let addrs: Vec<String> = self
            .config
            .dispatchers
            .split(',')
            .map(str::to_string)
            .collect();
        let node = self.rng.random_range(0..addrs.len());
        let value = json!({"addr": addrs[node]});
        self.history
            .record(&self.process, Kind::Invoke, "status", value.clone());
        let one = DispatcherClient::connect(
            &addrs[node],
            RetryConfig {
                rpc_timeout: Duration::from_millis(500),
                retry_timeout: Duration::from_millis(500),
                ..RetryConfig::default()
            },
            self.config.client_security.clone(),
        );
        let result = match one {
            Ok(one) => one.get_status().await,
            Err(e) => Err(e),
        };
        match result.map(|json| serde_json::from_str::<serde_json::Value>(&json)) {
            Ok(Ok(s)) => self.history.record(
                &self.process,
                Kind::Ok,
                "status",
                json!({"addr": addrs[node], "node": s["node"], "state": s["state"],
                       "term": s["term"], "applied_index": s["applied_index"]}),
            ),
            Ok(Err(e)) => {
                let mut value = value;
                value["error"] = json!(e.to_string());
                self.history
                    .record(&self.process, Kind::Info, "status", value);
            }
            Err(e) => {
                let mut value = value;
                value["error"] = json!(e.to_string());
                self.history
                    .record(&self.process, Kind::Info, "status", value);
            }
        }
    }

    /// Reads one epoch of job `job`. Returns the number of elements received and whether the
    /// epoch completed.
    pub async fn epoch(&self, job: &str, cancel: &CancellationToken) -> (u64, bool) {
        let splits = self.config.splits;
        self.history.record(
            &self.process,
            Kind::Invoke,
            "epoch",
            json!({"job": job, "splits": splits,
                   "delivery": delivery_name(self.config.delivery)}),
        );
        let mut count = 0u64;
        let started = Instant::now();
        let deadline = started + self.config.epoch_timeout;
        let read = async {
            let options = DistributeOptions {
                job_name: Some(job.to_string()),
                max_outstanding_requests: Some(64),
                delivery: self.config.delivery,
                ..DistributeOptions::default()
            };
            let service = self
                .epochs
                .distribute(
                    &Dataset::range(splits as i64),
                    ShardingPolicy::Dynamic,
                    options,
                )
                .await?;
            let mut stream = service.iter().await?;
            while let Some(element) = stream.next().await {
                let element = element?;
                let split = element.as_i64();
                let mut value = json!({"job": job, "split": split});
                let holder = split
                    .and_then(|s| u64::try_from(s).ok())
                    .and_then(|s| self.book.holder(job, s));
                if let Some((worker, incarnation)) = holder {
                    value["worker"] = json!(worker);
                    value["incarnation"] = json!(incarnation);
                }
                self.history
                    .record(&self.process, Kind::Ok, "element", value);
                count += 1;
                if self.config.rate > 0.0 {
                    let due = started + Duration::from_secs_f64(count as f64 / self.config.rate);
                    if due > Instant::now() + Duration::from_millis(2) {
                        tokio::time::sleep_until(due).await;
                    }
                }
            }
            Ok::<(), ClientError>(())
        };
        let outcome = tokio::select! {
            _ = cancel.cancelled() => Err("cancelled".to_string()),
            _ = tokio::time::sleep_until(deadline) => Err("epoch timed out".to_string()),
            result = read => result.map_err(|e| e.to_string()),
        };
        match outcome {
            Ok(()) => {
                self.history.record(
                    &self.process,
                    Kind::Ok,
                    "epoch",
                    json!({"job": job, "elements": count, "ms": started.elapsed().as_millis() as u64}),
                );
                (count, true)
            }
            Err(error) => {
                self.history.record(
                    &self.process,
                    Kind::Info,
                    "epoch",
                    json!({"job": job, "elements": count, "error": error}),
                );
                (count, false)
            }
        }
    }
}
