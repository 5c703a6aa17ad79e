//! The loop behind an `ElementStream`: it performs the epoch's decisions and feeds it events.
//!
//! A reader that is not coordinated long-polls the dispatcher (`ClientHeartbeat`) for the
//! iteration's tasks and opens one fetch stream per task (see `task_stream`); what to open and
//! when the epoch ends is `epoch`'s to decide. A coordinated reader's loop is `coordinated`'s.
//!
//! When the epoch ends (or the stream is dropped, which cancels the loop), the loop stops its
//! task streams, deletes the tasks only this client read from workers in this process (tf.data's
//! `DeleteLocalWorkerTasks`), then releases the iteration client (best effort; the dispatcher's
//! client timeout covers a lost release).

use crate::coordinated::{self, CoordinatedConfig};
use crate::delivery::Delivery;
use crate::epoch::{Decision, Epoch, Event, Listed};
use crate::error::ClientError;
use crate::options::{DistributeOptions, HeartbeatWaits};
use crate::read_ahead::ReadAhead;
use crate::received::{Received, REPORT_EVERY};
use crate::task_stream::{self, TaskStreamConfig};
use sluice_proto::dispatcher as pb;
use sluice_rpc::{
    ClientHeartbeat, ClientHeartbeatReply, DispatcherClient, IterationClient, KnownTasks,
    LocalWorkers, TaskDelivery,
};
use sluice_security::Admission;
use sluice_types::{ClientId, TargetWorkers, TaskId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::debug;

pub(crate) struct Driver {
    client: DispatcherClient,
    client_id: ClientId,
    /// The dispatcher's admission of `client_id` to its iteration, presented to the workers.
    admission: Admission,
    /// Coordinated reads: this consumer's index.
    consumer_index: Option<u32>,
    /// Cross-trainer cache jobs: this trainer's id (empty otherwise).
    trainer_id: String,
    /// Which workers' tasks this client reads.
    target_workers: TargetWorkers,
    outstanding: u32,
    heartbeat_poll: Duration,
    read_ahead: Arc<ReadAhead>,
    out: flume::Sender<Delivery>,
    cancel: CancellationToken,
    /// What arrived from exactly-once tasks and was not reported yet.
    received: Received,
}

/// The open task streams: each one's stop and its task.
#[derive(Default)]
struct Streams(HashMap<u64, (CancellationToken, tokio::task::JoinHandle<()>)>);

type HeartbeatFuture =
    Pin<Box<dyn Future<Output = Result<ClientHeartbeatReply, ClientError>> + Send>>;

impl Driver {
    /// A loop that reads for the iteration client `iteration` as `options` say, hands what it
    /// reads to `out`, and stops when `cancel` is cancelled.
    pub(crate) fn new(
        client: DispatcherClient,
        iteration: IterationClient,
        options: &DistributeOptions,
        read_ahead: Arc<ReadAhead>,
        out: flume::Sender<Delivery>,
        cancel: CancellationToken,
    ) -> Driver {
        Driver {
            client,
            client_id: iteration.client_id,
            admission: iteration.admission,
            consumer_index: options.consumer_index,
            trainer_id: options
                .cross_trainer_cache
                .as_ref()
                .map(|c| c.trainer_id.clone())
                .unwrap_or_default(),
            target_workers: options.target_workers,
            outstanding: options.outstanding(),
            heartbeat_poll: options.heartbeat_poll,
            read_ahead,
            out,
            cancel,
            received: Received::default(),
        }
    }

    pub(crate) async fn run(self) {
        let (error, delete_local) = match self.consumer_index {
            Some(consumer_index) => {
                let config = CoordinatedConfig {
                    client_id: self.client_id,
                    admission: self.admission,
                    consumer_index,
                    max_outstanding: self.outstanding,
                    heartbeat_poll: self.heartbeat_poll,
                };
                let (permits, out) = (self.read_ahead.permits(), self.out.clone());
                let result = coordinated::run(
                    self.client.clone(),
                    config,
                    permits,
                    out,
                    self.cancel.clone(),
                )
                .await;
                (result.err(), Vec::new())
            }
            None => self.iterate().await,
        };
        if let Some(e) = error {
            let _ = self.out.send(Err(e));
        }
        self.cancel.cancel();
        self.delete_local_tasks(&delete_local);
        self.release().await;
    }

    /// Reads the iteration's tasks until the epoch ends: the error it ended with, if any, and
    /// the tasks to delete from workers in this process.
    async fn iterate(&self) -> (Option<ClientError>, Vec<pb::TaskInfo>) {
        let (finished_tx, finished_rx) = watch::channel(false);
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(u64, Result<(), ClientError>)>();
        let mut epoch = Epoch::new(self.target_workers, self.outstanding);
        let mut waits = HeartbeatWaits::new(self.heartbeat_poll);
        let mut pending: Option<HeartbeatFuture> = None;
        let mut streams = Streams::default();
        let mut report_every = tokio::time::interval(REPORT_EVERY);
        report_every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut decisions = epoch.start();
        let result = loop {
            let mut ended = None;
            for decision in decisions {
                match decision {
                    Decision::Open { task, max_credits } => {
                        self.open(task, max_credits, &finished_rx, &done_tx, &mut streams)
                    }
                    Decision::Skip { task_id, worker } => {
                        debug!(task = task_id, worker = %worker, "not a target worker: skipping its task");
                    }
                    Decision::IterationFinished => {
                        let _ = finished_tx.send(true);
                    }
                    Decision::Heartbeat { known_tasks, poll } => {
                        let poll = waits.wait(poll);
                        let client = self.client.clone();
                        pending = Some(Box::pin(heartbeat(
                            client,
                            self.client_id,
                            known_tasks,
                            poll,
                        )));
                    }
                    Decision::End {
                        error,
                        delete_local,
                    } => ended = Some((error, delete_local)),
                }
            }
            if let Some(ended) = ended {
                break ended;
            }
            decisions = tokio::select! {
                _ = self.cancel.cancelled() => epoch.handle(Event::Cancelled),
                response = async { pending.as_mut().expect("guarded").await }, if pending.is_some() => {
                    pending = None;
                    match response {
                        Ok(reply) => {
                            let mut decisions = epoch.handle(Event::Heartbeat {
                                tasks: reply.tasks.map(|tasks| tasks.into_iter().map(listed).collect()),
                                iteration_finished: reply.iteration_finished,
                            });
                            // Tasks whose streams move to other workers: stop reading them,
                            // then say so with what arrived from them.
                            for task_id in reply.release_tasks {
                                if self.release_task(task_id.0, &mut streams).await {
                                    decisions.extend(epoch.handle(Event::Released { task_id: task_id.0 }));
                                }
                            }
                            decisions
                        }
                        Err(e) => epoch.handle(Event::HeartbeatFailed(e)),
                    }
                }
                Some((task_id, result)) = done_rx.recv() => {
                    let decisions = epoch.handle(Event::TaskEnded { task_id, result });
                    // What the ended stream received goes now, not with the next tick: the
                    // epoch's end comes soon after a task's, and reports what is left first.
                    self.report().await;
                    decisions
                }
                _ = report_every.tick() => {
                    self.report().await;
                    Vec::new()
                }
            };
        };
        // What arrived since the last report: the dispatcher must know it, should a worker fail
        // after this reader is gone.
        self.report().await;
        result
    }

    /// Starts reading `task`, reporting its end on `done`.
    fn open(
        &self,
        task: pb::TaskInfo,
        max_credits: u32,
        finished: &watch::Receiver<bool>,
        done: &mpsc::UnboundedSender<(u64, Result<(), ClientError>)>,
        streams: &mut Streams,
    ) {
        let config = TaskStreamConfig {
            task_id: task.task_id,
            address: task.worker_address,
            client_id: self.client_id.0,
            admission: self.admission,
            trainer_id: self.trainer_id.clone(),
            max_credits,
            // What the reader presents to the dispatcher, it presents to workers.
            security: self.client.security().clone(),
            received: self.received.clone(),
        };
        debug!(task = config.task_id, worker = %config.address, "reading task");
        let done = done.clone();
        let (read_ahead, out, finished, cancel) = (
            self.read_ahead.clone(),
            self.out.clone(),
            finished.clone(),
            self.cancel.child_token(),
        );
        let task_id = config.task_id;
        let stop = cancel.clone();
        let handle = tokio::spawn(async move {
            let result = task_stream::run(config, read_ahead, out, finished, cancel).await;
            let _ = done.send((task_id, result));
        });
        streams.0.insert(task_id, (stop, handle));
    }

    /// Stops reading `task_id` for good and reports it released, with what arrived from it.
    /// `false` when the report failed (the next heartbeat asks again).
    async fn release_task(&self, task_id: u64, streams: &mut Streams) -> bool {
        if let Some((stop, handle)) = streams.0.remove(&task_id) {
            stop.cancel();
            // Nothing of the task arrives after its stream returned.
            let _ = handle.await;
        }
        let runs = self.received.take_task(task_id);
        let report = TaskDelivery {
            task_id: TaskId(task_id),
            runs: runs.clone(),
            released: true,
        };
        match self
            .client
            .report_delivered(self.client_id, &[report])
            .await
        {
            Ok(()) => {
                debug!(task = task_id, "released a task whose stream moved");
                true
            }
            Err(e) => {
                debug!(task = task_id, error = %e, "reporting a released task failed");
                self.received.put_back(task_id, &runs);
                false
            }
        }
    }

    /// Reports what arrived from exactly-once tasks since the last report; what a failed report
    /// carried is kept for the next.
    async fn report(&self) {
        let received = self.received.take_all();
        if received.is_empty() {
            return;
        }
        let reports: Vec<TaskDelivery> = received
            .iter()
            .map(|(task_id, runs)| TaskDelivery {
                task_id: TaskId(*task_id),
                runs: runs.clone(),
                released: false,
            })
            .collect();
        if let Err(e) = self.client.report_delivered(self.client_id, &reports).await {
            debug!(error = %e, "reporting what arrived failed; it goes with the next report");
            for (task_id, runs) in &received {
                self.received.put_back(*task_id, runs);
            }
        }
    }

    /// Deletes, from workers in this process, the tasks nobody but this client reads, so they
    /// stop producing (a later reader of them gets tf.data's "which has been deleted" error).
    fn delete_local_tasks(&self, tasks: &[pb::TaskInfo]) {
        for task in tasks {
            if let Some(worker) = LocalWorkers::global().get(&task.worker_address) {
                debug!(task = task.task_id, worker = %task.worker_address, "deleting local task");
                worker.delete_local_task(TaskId(task.task_id));
            }
        }
    }

    async fn release(&self) {
        let client_id = self.client_id;
        let release = self.client.release_iteration_client(client_id);
        if tokio::time::timeout(Duration::from_secs(2), release)
            .await
            .is_err()
        {
            debug!(
                client = %client_id,
                "release of the iteration client timed out"
            );
        }
    }
}

/// A task of a heartbeat reply, with whether its worker runs in this process.
fn listed(task: pb::TaskInfo) -> Listed {
    let local = LocalWorkers::global().contains(&task.worker_address);
    Listed { task, local }
}

async fn heartbeat(
    client: DispatcherClient,
    client_id: ClientId,
    known_tasks: KnownTasks,
    poll: Duration,
) -> Result<ClientHeartbeatReply, ClientError> {
    let heartbeat = ClientHeartbeat {
        client_id,
        known_tasks,
        current_round: None,
        blocked_round: None,
    };
    Ok(client.client_heartbeat(&heartbeat, poll).await?)
}
