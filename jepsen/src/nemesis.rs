//! `Nemesis`: plays a `Schedule` against the cluster, the workers and the link proxies, and
//! records every fault's start and end in the history (`process: nemesis`). Its three tracks
//! (dispatcher faults, worker faults, trainer kills) play at once, each one fault at a time.
//!
//! Each fault is an `invoke` then `ok` (applied) or `info` (the harness could not apply it;
//! the coverage checker then finds it missing), and its end a `recover` `invoke` then
//! `ok`/`info`. Targets are resolved when a fault starts: "the leader" is the monitor's last
//! view, and the history records the nodes actually hit (`nodes`), or the worker (`workers`,
//! with the `incarnation` a kill or pause hit, and the dispatchers whose links were cut), or the
//! trainer's run it killed (`job`, `run`, `pid`, and the `state` it will restart from).

use crate::cluster::Cluster;
use crate::history::{History, Kind};
use crate::monitor::Monitor;
use crate::proxy_net::{Link, ProxyNet};
use crate::schedule::{Action, Fault, Schedule, Shape, Target, Track, WorkerShape};
use crate::trainer::Trainer;
use crate::worker_net::WorkerNet;
use crate::worker_pool::{self, WorkerPool};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub struct Nemesis {
    pub cluster: Arc<Cluster>,
    pub net: Arc<ProxyNet>,
    pub monitor: Arc<Monitor>,
    pub history: History,
    pub workers: Arc<WorkerPool>,
    pub worker_net: Arc<WorkerNet>,
    /// The trainer, when the trainer nemesis is on.
    pub trainer: Option<Arc<Trainer>>,
}

/// What a fault did, to undo it.
enum Applied {
    Down(u64),
    Paused(u64),
    Cut,
    WorkerDown(u32),
    WorkerPaused(u32),
    WorkerCut,
    TrainerDown,
}

impl Nemesis {
    /// Plays every fault of `schedule`, the fault phase having started at `start`: both tracks
    /// at once. Returns early (after undoing the current faults) when `cancel` fires.
    pub async fn run(&self, schedule: &Schedule, start: Instant, cancel: CancellationToken) {
        let of_track = |track: Track| -> Vec<&Fault> {
            schedule
                .faults
                .iter()
                .filter(|f| f.action.kind().track() == track)
                .collect()
        };
        let (dispatchers, workers, trainer) = (
            of_track(Track::Dispatchers),
            of_track(Track::Workers),
            of_track(Track::Trainer),
        );
        tokio::join!(
            self.track(&dispatchers, start, &cancel),
            self.track(&workers, start, &cancel),
            self.track(&trainer, start, &cancel),
        );
    }

    /// Plays one track's faults, one at a time.
    async fn track(&self, faults: &[&Fault], start: Instant, cancel: &CancellationToken) {
        for &fault in faults {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(start + fault.at()) => {}
            }
            let applied = self.begin(fault).await;
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep_until(start + fault.end()) => {}
            }
            if let Some(applied) = applied {
                self.end(fault, applied).await;
            }
            if cancel.is_cancelled() {
                return;
            }
        }
    }

    fn resolve(&self, target: &Target) -> (u64, Option<u64>) {
        let leader = self.monitor.leader();
        match target {
            // No leader known: hit the lowest id rather than skip (recorded as not the leader).
            Target::Leader => (leader.unwrap_or(1), leader),
            Target::Node(id) => (*id, leader),
        }
    }

    fn cut_links(&self, shape: &Shape, leader: u64) -> Vec<Link> {
        let links = self.net.links();
        match shape {
            Shape::IsolateLeader => links
                .filter(|(f, t)| *f == leader || *t == leader)
                .collect(),
            Shape::Halves(side) => links
                .filter(|(f, t)| side.contains(f) != side.contains(t))
                .collect(),
            Shape::OneWayFromLeader => links.filter(|(f, _)| *f == leader).collect(),
            Shape::OneWayToLeader => links.filter(|(_, t)| *t == leader).collect(),
        }
    }

    async fn begin(&self, fault: &Fault) -> Option<Applied> {
        let kind = fault.action.kind().name();
        let (applied, detail): (anyhow::Result<Applied>, Value) = match &fault.action {
            Action::Kill { target } | Action::Pause { target } | Action::Restart { target } => {
                let (node, leader) = self.resolve(target);
                let detail = json!({
                    "fault": fault.id, "action": fault.action, "nodes": [node],
                    "leader": leader, "hit_leader": leader == Some(node),
                });
                self.history
                    .record("nemesis", Kind::Invoke, kind, detail.clone());
                let result = match &fault.action {
                    Action::Kill { .. } => {
                        self.cluster.kill(node).await.map(|_| Applied::Down(node))
                    }
                    Action::Restart { .. } => self
                        .cluster
                        .terminate(node)
                        .await
                        .map(|_| Applied::Down(node)),
                    _ => self
                        .cluster
                        .pause(node)
                        .await
                        .map(|_| Applied::Paused(node)),
                };
                (result, detail)
            }
            Action::Partition { shape, mode } => {
                let leader = self.monitor.leader();
                let pivot = match shape {
                    Shape::Halves(_) => 0,
                    _ => leader.unwrap_or(1),
                };
                let cut = self.cut_links(shape, pivot);
                let nodes: Vec<u64> = match shape {
                    Shape::Halves(side) => side.clone(),
                    _ => vec![pivot],
                };
                let detail = json!({
                    "fault": fault.id, "action": fault.action, "nodes": nodes, "links": cut,
                    "leader": leader,
                    "hit_leader": matches!(shape, Shape::Halves(_)) || leader == Some(pivot),
                });
                self.history
                    .record("nemesis", Kind::Invoke, kind, detail.clone());
                self.net.set(&cut, *mode);
                (Ok(Applied::Cut), detail)
            }
            Action::WorkerKill { worker }
            | Action::WorkerPause { worker }
            | Action::WorkerRestart { worker }
            | Action::WorkerPartition { worker, .. }
            | Action::ReaderPartition { worker, .. } => self.begin_on_worker(fault, *worker).await,
            Action::TrainerKill => {
                let mut detail =
                    json!({"fault": fault.id, "action": fault.action, "hit_leader": false});
                self.history
                    .record("nemesis", Kind::Invoke, kind, detail.clone());
                let result = match &self.trainer {
                    Some(trainer) => trainer.kill().await.map(|killed| {
                        if let (Some(into), Value::Object(from)) = (detail.as_object_mut(), killed)
                        {
                            into.extend(from);
                        }
                        Applied::TrainerDown
                    }),
                    None => Err(anyhow::anyhow!("the run has no trainer")),
                };
                (result, detail)
            }
        };
        match applied {
            Ok(applied) => {
                info!(fault = fault.id, %kind, detail = %detail, "fault started");
                self.history.record("nemesis", Kind::Ok, kind, detail);
                Some(applied)
            }
            Err(e) => {
                warn!(fault = fault.id, %kind, error = %e, "fault not applied");
                let mut detail = detail;
                detail["error"] = json!(format!("{e:#}"));
                self.history.record("nemesis", Kind::Info, kind, detail);
                None
            }
        }
    }

    /// Starts a worker fault: records the `invoke` (with the incarnation it hits) and applies it.
    async fn begin_on_worker(
        &self,
        fault: &Fault,
        worker: u32,
    ) -> (anyhow::Result<Applied>, Value) {
        let kind = fault.action.kind().name();
        let name = worker_pool::name(worker);
        let leader = self.monitor.leader();
        let incarnation = self.workers.incarnation(worker).await.unwrap_or(0);
        let dispatchers: Vec<u64> = match &fault.action {
            Action::WorkerPartition { shape, .. } => match shape {
                WorkerShape::AllDispatchers => self.cluster.ids().collect(),
                // No leader known: cut the lowest id rather than skip (recorded).
                WorkerShape::Leader => vec![leader.unwrap_or(1)],
            },
            _ => Vec::new(),
        };
        let detail = json!({
            "fault": fault.id, "action": fault.action, "workers": [worker], "worker": name,
            "incarnation": incarnation, "dispatchers": dispatchers, "leader": leader,
            "hit_leader": false,
        });
        self.history
            .record("nemesis", Kind::Invoke, kind, detail.clone());
        let result = match &fault.action {
            Action::WorkerKill { .. } => self
                .workers
                .kill(worker)
                .await
                .map(|_| Applied::WorkerDown(worker)),
            Action::WorkerRestart { .. } => self
                .workers
                .terminate(worker)
                .await
                .map(|_| Applied::WorkerDown(worker)),
            Action::WorkerPause { .. } => self
                .workers
                .pause(worker)
                .await
                .map(|_| Applied::WorkerPaused(worker)),
            Action::WorkerPartition { mode, .. } => {
                self.worker_net.cut_worker(&name, &dispatchers, *mode);
                Ok(Applied::WorkerCut)
            }
            Action::ReaderPartition { mode, .. } => {
                self.worker_net.cut_readers(worker, *mode);
                Ok(Applied::WorkerCut)
            }
            Action::Kill { .. }
            | Action::Pause { .. }
            | Action::Restart { .. }
            | Action::Partition { .. } => unreachable!("a dispatcher fault"),
            Action::TrainerKill => unreachable!("a trainer fault"),
        };
        (result, detail)
    }

    async fn end(&self, fault: &Fault, applied: Applied) {
        let detail = json!({"fault": fault.id, "kind": fault.action.kind()});
        self.history
            .record("nemesis", Kind::Invoke, "recover", detail.clone());
        let result = match applied {
            Applied::Down(node) => self.cluster.spawn(node).await,
            Applied::Paused(node) => self.cluster.resume(node).await,
            Applied::Cut => {
                self.net.heal();
                Ok(())
            }
            Applied::WorkerDown(worker) => self.workers.spawn(worker).await,
            Applied::WorkerPaused(worker) => self.workers.resume(worker).await,
            Applied::WorkerCut => {
                self.worker_net.heal();
                Ok(())
            }
            Applied::TrainerDown => {
                if let Some(trainer) = &self.trainer {
                    trainer.release();
                }
                Ok(())
            }
        };
        match result {
            Ok(()) => {
                info!(fault = fault.id, "fault ended");
                self.history.record("nemesis", Kind::Ok, "recover", detail);
            }
            Err(e) => {
                warn!(fault = fault.id, error = %e, "fault not undone");
                let mut detail = detail;
                detail["error"] = json!(format!("{e:#}"));
                self.history
                    .record("nemesis", Kind::Info, "recover", detail);
            }
        }
    }
}
