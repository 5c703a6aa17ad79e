//! `Heartbeats`: what a worker's and a client's heartbeat do on the leader.
//!
//! Both record the caller's liveness (leader-local), make the read current, propose what the
//! heartbeat implies (a worker's (re)registration, a coordinated reader's rounds), and then long
//! poll: the reply waits, up to the caller's poll timeout, until there is something new to tell.
//! A worker's poll is bounded by half the worker timeout, and a client's by half the client
//! timeout, so a caller that keeps polling is never expired.

use crate::access;
use crate::admissions;
use crate::config::DispatcherConfig;
use crate::convert::{request_id, task_def, task_info};
use crate::error::DispatcherError;
use crate::liveness::Liveness;
use crate::proposer::ProposerHandle;
use crate::state::check_rounds;
use crate::state::{Dataset, DispatcherState, Iteration, Job, Rejection, Task, Watched};
use crate::state_reader::{Check, StateReader};
use sluice_proto::dispatcher as pb;
use sluice_security::Identity;
use sluice_types::{ClientId, TaskId};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Longest long poll a caller may ask for.
const MAX_POLL: Duration = Duration::from_secs(10);

pub struct Heartbeats {
    reader: StateReader,
    proposer: ProposerHandle,
    liveness: Arc<Liveness>,
    /// Longest worker long poll: half the worker timeout.
    max_worker_poll: Duration,
    /// Longest client long poll: half the client timeout.
    max_client_poll: Duration,
    /// The configured static-sharding worker list, put into every `RegisterWorker` this
    /// replica proposes (the state records it and checks that every leader has the same).
    worker_addresses: Vec<String>,
}

impl Heartbeats {
    pub fn new(
        config: &DispatcherConfig,
        reader: StateReader,
        proposer: ProposerHandle,
        liveness: Arc<Liveness>,
    ) -> Self {
        Heartbeats {
            reader,
            proposer,
            liveness,
            max_worker_poll: config.worker_timeout / 2,
            max_client_poll: config.client_timeout / 2,
            worker_addresses: config.worker_addresses.clone(),
        }
    }

    pub async fn client(
        &self,
        req: pb::ClientHeartbeatRequest,
    ) -> Result<pb::ClientHeartbeatResponse, DispatcherError> {
        let client_id = ClientId(req.iteration_client_id);
        self.liveness.client_seen(client_id.0);
        let poll = Duration::from_millis(req.poll_timeout_ms).min(self.max_client_poll);
        let deadline = poll_deadline(poll);
        self.reader.linearizable().await?;
        // A coordinated reader's rounds matter while a task waits to join its iteration.
        let pending = self.reader.read(|s| {
            s.client_iteration(client_id)
                .is_some_and(|it| !it.pending_tasks.is_empty())
        });
        if let (true, Some(current_round)) = (pending, req.current_round) {
            self.reader.check_quorum()?;
            check_rounds(current_round, req.blocked_round)?;
            self.proposer
                .client_rounds(client_id, current_round, req.blocked_round)
                .await?;
        }
        let known = KnownTasks::of(&req);
        let iteration_id = self
            .reader
            .read(|s| iteration_of(s, client_id).map(|it| it.id))?;
        self.reader
            .long_poll(
                Watched::Iteration(iteration_id),
                deadline,
                |_, s| {
                    Ok(match client_changed(s, client_id, &known)? {
                        true => Check::Changed,
                        false => Check::Unchanged,
                    })
                },
                |_, s| client_view(s, client_id, &known),
            )
            .await
    }

    pub async fn worker(
        &self,
        req: pb::WorkerHeartbeatRequest,
        caller: &Identity,
        cert_hosts: Option<&[String]>,
    ) -> Result<pb::WorkerHeartbeatResponse, DispatcherError> {
        if req.worker_address.is_empty() {
            return Err(DispatcherError::InvalidArgument(
                "`worker_address` is required".into(),
            ));
        }
        // Before anything is proposed: an address nobody can dial never registers.
        sluice_rpc::check_worker_address(&req.worker_address)
            .map_err(|e| DispatcherError::InvalidArgument(e.0))?;
        // A worker whose certificate says where it serves registers nowhere else.
        access::check_named_address(caller, &req.worker_address, cert_hosts)?;
        // Before the liveness record: another worker's heartbeat must not keep this one alive.
        self.reader
            .read(|s| access::check_worker(s, caller, &req.worker_address))?;
        self.liveness.worker_seen(&req.worker_address);
        if let Some(crash) = &req.crash {
            self.report_crash(crash, caller).await?;
        }
        let poll = Duration::from_millis(req.poll_timeout_ms).min(self.max_worker_poll);
        let deadline = poll_deadline(poll);
        self.reader.linearizable().await?;
        let register = self.reader.read(|s| {
            s.worker(&req.worker_address).is_none()
                || s.worker_lacks_coordinated_task(&req.worker_address)
        });
        if register {
            self.reader.check_quorum()?;
            self.proposer
                .register_worker(
                    request_id(req.request_id),
                    req.worker_address.clone(),
                    req.tags.clone(),
                    self.worker_addresses.clone(),
                    access::owner_of(caller),
                )
                .await?;
        }
        // A process other than the one recorded at this address restarted there: its
        // exactly-once lineages move before it is told what to run.
        let restarted = req.incarnation != 0
            && self.reader.read(|s| {
                s.worker(&req.worker_address).is_some()
                    && s.worker_incarnation_of(&req.worker_address) != Some(req.incarnation)
            });
        if restarted {
            self.reader.check_quorum()?;
            let moved = self
                .proposer
                .worker_incarnation(req.worker_address.clone(), req.incarnation)
                .await?;
            if !moved.is_empty() {
                tracing::info!(worker = %req.worker_address, tasks = ?moved, "the worker restarted: its exactly-once tasks move");
            }
        }
        // The worker checks readers' admissions with it; a cluster without one gets one now.
        let key =
            admissions::fetch_key(|| self.reader.read(admissions::key_of), &self.proposer).await?;
        let current: BTreeSet<TaskId> = req.current_tasks.iter().map(|t| TaskId(*t)).collect();
        let worker = req.worker_address.as_str();
        let mut response = self
            .reader
            .long_poll(
                Watched::Worker(req.worker_address.clone()),
                deadline,
                |_, s| {
                    let active = s.active_tasks_of_worker(worker);
                    Ok(if worker_changed(s, active, &current) {
                        Check::Changed
                    } else {
                        Check::Unchanged
                    })
                },
                |_, s| {
                    let active = s.active_tasks_of_worker(worker);
                    Ok(worker_view(s, active, &current))
                },
            )
            .await?;
        response.fetch_key = key.to_bytes();
        Ok(response)
    }
}

impl Heartbeats {
    /// A worker's previous run crashed while running `crash.task_ids`: their iterations are
    /// failed (through the log) before the worker registers again, so neither it nor any
    /// other worker is given those tasks again. The caller must be allowed to act for the
    /// crashed run's address and its tasks, as for finishing them.
    async fn report_crash(
        &self,
        crash: &pb::CrashReport,
        caller: &Identity,
    ) -> Result<(), DispatcherError> {
        let tasks: Vec<TaskId> = crash.task_ids.iter().map(|t| TaskId(*t)).collect();
        if crash.worker_address.is_empty() || crash.signal.is_empty() || tasks.is_empty() {
            return Err(DispatcherError::InvalidArgument(
                "a crash report needs the crashed worker's address, its signal and its tasks"
                    .into(),
            ));
        }
        self.reader
            .read(|s| access::check_finish(s, caller, &crash.worker_address, &tasks))?;
        self.reader.check_quorum()?;
        let failed = self
            .proposer
            .fail_crashed_tasks(crash.worker_address.clone(), tasks, crash.signal.clone())
            .await?;
        tracing::warn!(
            worker = %crash.worker_address,
            signal = %crash.signal,
            tasks = ?crash.task_ids,
            iterations = ?failed,
            "a worker's previous run crashed running these tasks; their iterations are failed"
        );
        Ok(())
    }
}

fn poll_deadline(poll: Duration) -> Instant {
    Instant::now() + poll.min(MAX_POLL)
}

/// The client's iteration, or `NotFound`.
fn iteration_of(
    state: &DispatcherState,
    client_id: ClientId,
) -> Result<&Iteration, DispatcherError> {
    Ok(state.client_iteration(client_id).ok_or_else(|| {
        Rejection::NotFound(format!("Iteration client id not found: {client_id}"))
    })?)
}

/// The task list a client holds, as its heartbeat describes it.
struct KnownTasks {
    count: usize,
    last: u64,
    /// Whether the client takes a reply without tasks when its list is current.
    omit_unchanged: bool,
}

impl KnownTasks {
    fn of(req: &pb::ClientHeartbeatRequest) -> Self {
        KnownTasks {
            count: req.known_tasks as usize,
            last: req.last_known_task,
            omit_unchanged: req.omit_unchanged_tasks,
        }
    }

    /// Whether the iteration's tasks are the ones the client knows. Exact when the client sent
    /// its last task: tasks are only appended (with ids never listed before) or removed, so a
    /// list of the same length with the same last task is the same list. Without it, the count
    /// alone.
    fn current(&self, iteration: &Iteration) -> bool {
        let same_last = !self.omit_unchanged
            || self.count == 0
            || iteration.tasks.last().is_some_and(|t| t.0 == self.last);
        iteration.tasks.len() == self.count && same_last
    }
}

/// Whether the client has news: the iteration finished, a round is blocked (always news: it
/// needs the consumer's answer), or its tasks changed. Without building the reply: long polls
/// ask this after every applied entry.
fn client_changed(
    state: &DispatcherState,
    client_id: ClientId,
    known: &KnownTasks,
) -> Result<bool, DispatcherError> {
    let iteration = iteration_of(state, client_id)?;
    Ok(iteration.finished
        || state.iteration_failure(iteration.id).is_some()
        || !iteration.pending_tasks.is_empty()
        || !known.current(iteration)
        || !state.tasks_to_release(client_id).is_empty())
}

/// A client's tasks (left out when the client's list is current and it asked for that) and
/// its iteration's progress.
fn client_view(
    state: &DispatcherState,
    client_id: ClientId,
    known: &KnownTasks,
) -> Result<pb::ClientHeartbeatResponse, DispatcherError> {
    let iteration = iteration_of(state, client_id)?;
    let tasks_unchanged = known.omit_unchanged && known.current(iteration);
    let tasks: Vec<pb::TaskInfo> = if tasks_unchanged {
        Vec::new()
    } else {
        state
            .tasks_of_iteration(iteration)
            .into_iter()
            .map(|t| task_info(state, t))
            .collect()
    };
    let response = pb::ClientHeartbeatResponse {
        iteration_finished: iteration.finished,
        block_round: iteration.pending_tasks.front().map(|p| p.target_round),
        tasks,
        tasks_unchanged,
        iteration_failure: state
            .iteration_failure(iteration.id)
            .unwrap_or_default()
            .to_string(),
        release_tasks: state
            .tasks_to_release(client_id)
            .into_iter()
            .map(|t| t.0)
            .collect(),
    };
    Ok(response)
}

/// Whether the worker has a task to start or to stop; [`worker_view`] without building it.
fn worker_changed(
    state: &DispatcherState,
    active: &BTreeSet<TaskId>,
    current: &BTreeSet<TaskId>,
) -> bool {
    // As `worker_view`: a task whose definition cannot be found is not sent.
    active
        .difference(current)
        .any(|id| definition_of(state, *id).is_some())
        || !current.is_subset(active)
}

/// The iteration, job and dataset a task runs, when all are stored.
fn definition_of(state: &DispatcherState, id: TaskId) -> Option<(&Task, &Job, &Dataset)> {
    let task = state.task(id)?;
    let iteration = state.iteration(task.iteration_id)?;
    let job = state.job(iteration.job_id)?;
    let dataset = state.dataset(&job.dataset_id)?;
    Some((task, job, dataset))
}

/// What a worker should start (assigned, unfinished, not running) and stop (running, no longer
/// assigned or finished), given its `active` tasks.
fn worker_view(
    state: &DispatcherState,
    active: &BTreeSet<TaskId>,
    current: &BTreeSet<TaskId>,
) -> pb::WorkerHeartbeatResponse {
    let new_tasks = active
        .difference(current)
        .filter_map(|id| definition_of(state, *id))
        .map(|(task, job, dataset)| task_def(state, task, job, dataset))
        .collect();
    let tasks_to_delete = current.difference(active).map(|t| t.0).collect();
    pb::WorkerHeartbeatResponse {
        new_tasks,
        tasks_to_delete,
        // Set by the caller, once the poll is over.
        fetch_key: Vec::new(),
    }
}
