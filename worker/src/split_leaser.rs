//! `SplitLeaser`: the worker side of distributed_epoch splits.
//!
//! The pipeline thread asks for one split at a time; the leaser hands out indices from the
//! range it leased from the dispatcher. A lease is committed at the dispatcher before it arrives
//! here, so the indices are this task's alone; if this worker dies, the rest of its leases is
//! lost (at-most-once), never handed out again.
//!
//! Each lease is a Raft write, fsynced on a quorum, so the leaser keeps one lease ahead: as soon
//! as a lease is installed, the next one is requested in the background, and the pipeline only
//! waits for the dispatcher when it consumes a lease faster than a commit takes. (Leasing only
//! when the current lease was used up stalled the pipeline on every commit.) The next lease
//! doubles, up to the largest size, while a lease lasts less than `LEASE_TARGET`, so a short task
//! loses little, a fast one costs one commit per `LEASE_TARGET` or more of work, and a worker that
//! dies loses about two leases' worth of splits at most.
//!
//! The prefetched lease is never re-requested or handed out by anyone else: the request carries
//! its own request id, and a lease that arrives after the pipeline stopped is simply lost, which
//! at-most-once allows.
//!
//! Every task's leaser leases through the worker's one `DispatcherClient`, which sends the
//! leases asked for while another is on its way together in its next call. The lease kept ahead
//! may also wait a while for company (`lease_slack`: half the time the lease before lasted, at
//! most a second), so a worker with many tasks makes far fewer calls than it leases.

use crate::config::{LeaseEvent, LeaseObserver};
use sluice_element::DatasetError;
use sluice_executor::SplitSupplier;
use sluice_rpc::{lease_slack, DispatcherClient, RpcError};
use sluice_types::{IterationId, LeaseRequest, SplitLease, TaskId};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// A lease should last at least this long before the next one doubles.
pub const LEASE_TARGET: Duration = Duration::from_millis(100);

type LeaseReply = Result<SplitLease, RpcError>;

struct Lease {
    repetition: u64,
    next: u64,
    end: u64,
    /// When it was installed (for sizing the next one).
    since: Instant,
}

/// A lease request in flight.
struct Pending {
    repetition: u64,
    rx: flume::Receiver<LeaseReply>,
}

struct Provider {
    lease: Lease,
    /// Size of the next lease.
    size: u32,
    pending: Option<Pending>,
}

pub struct SplitLeaser {
    client: DispatcherClient,
    iteration_id: IterationId,
    task_id: TaskId,
    runtime: Handle,
    first_lease: u32,
    max_lease: u32,
    /// The next lease doubles while a lease lasts less than this (`LEASE_TARGET`).
    lease_target: Duration,
    /// Per provider. A std mutex held while blocking on a lease: only the task's own pipeline
    /// thread calls in.
    providers: Mutex<HashMap<u32, Provider>>,
    /// Told of every lease, with this worker's address.
    observer: Option<(LeaseObserver, String)>,
}

impl SplitLeaser {
    pub fn new(
        client: DispatcherClient,
        iteration_id: IterationId,
        task_id: TaskId,
        runtime: Handle,
        lease: (u32, u32),
        observer: Option<(LeaseObserver, String)>,
    ) -> Self {
        SplitLeaser {
            client,
            iteration_id,
            task_id,
            runtime,
            first_lease: lease.0,
            max_lease: lease.1,
            lease_target: LEASE_TARGET,
            providers: Mutex::new(HashMap::new()),
            observer,
        }
    }

    /// The same leaser, growing its leases while one lasts less than `target` (tests make
    /// growth certain, or impossible, with it).
    pub fn with_lease_target(mut self, target: Duration) -> Self {
        self.lease_target = target;
        self
    }

    /// Sends a lease request on the runtime, which may wait `slack` for company; the reply
    /// arrives on the returned channel (the observer hears of the lease as soon as it arrives,
    /// used or not). Retries of the request (leader changes, lost replies) carry its one request
    /// id, so a retry gets the lease the dispatcher recorded for it, never a second one.
    fn request(&self, provider: u32, repetition: u64, max_splits: u32, slack: Duration) -> Pending {
        let request = LeaseRequest {
            iteration_id: self.iteration_id,
            task_id: self.task_id,
            provider,
            repetition,
            max_splits,
        };
        let (tx, rx) = flume::bounded(1);
        let client = self.client.clone();
        let observer = self.observer.clone();
        let (task_id, iteration_id) = (self.task_id.0, self.iteration_id.0);
        self.runtime.spawn(async move {
            let response = client.lease_splits_ahead(&request, slack).await;
            if let (Some((observer, worker)), Ok(lease)) = (&observer, &response) {
                (observer.0)(LeaseEvent {
                    worker: worker.clone(),
                    task_id,
                    iteration_id,
                    provider,
                    repetition: lease.repetition,
                    start: lease.start,
                    end: lease.end,
                    end_of_splits: lease.end_of_splits,
                });
            }
            let _ = tx.send(response);
        });
        Pending { repetition, rx }
    }

    /// Waits for a lease reply. The pipeline thread waits on a channel, so a runtime that shuts
    /// down (worker stopping) ends the wait with an error instead of a panic.
    fn wait(pending: Pending) -> Result<SplitLease, DatasetError> {
        pending
            .rx
            .recv()
            .map_err(|_| DatasetError::Splits {
                retryable: false,
                message: "the worker is shutting down".into(),
            })?
            .map_err(|e| DatasetError::Splits {
                retryable: e.is_retryable(),
                message: e.to_string(),
            })
    }
}

impl SplitSupplier for SplitLeaser {
    fn next_split(&self, provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
        let mut providers = self.providers.lock().expect("lease lock poisoned");
        let state = providers.entry(provider).or_insert_with(|| Provider {
            lease: Lease {
                repetition,
                next: 0,
                end: 0,
                since: Instant::now(),
            },
            size: self.first_lease,
            pending: None,
        });
        if state.lease.repetition == repetition && state.lease.next < state.lease.end {
            state.lease.next += 1;
            return Ok(Some(state.lease.next - 1));
        }
        // The current lease is used up: the prefetched one, or a lease asked for now. A
        // prefetch for another repetition cannot be used (its splits are lost, at most once).
        let pending = match state.pending.take() {
            Some(pending) if pending.repetition == repetition => pending,
            _ => self.request(provider, repetition, state.size, Duration::ZERO),
        };
        let response = Self::wait(pending)?;
        if response.end_of_splits {
            state.lease = Lease {
                repetition,
                next: 0,
                end: 0,
                since: Instant::now(),
            };
            return Ok(None);
        }
        // Grow while leases go by faster than the target: a fast pipeline needs fewer commits.
        let lasted = state.lease.since.elapsed();
        if lasted < self.lease_target {
            state.size = state.size.saturating_mul(2).min(self.max_lease);
        }
        state.lease = Lease {
            repetition: response.repetition,
            next: response.start + 1,
            end: response.end,
            since: Instant::now(),
        };
        // Keep one lease ahead, so the pipeline does not wait for the next commit. It is not
        // needed before this lease is used up, so it may wait a while for the leases of the
        // worker's other tasks, and go in one call with them.
        state.pending = Some(self.request(
            provider,
            response.repetition,
            state.size,
            lease_slack(lasted),
        ));
        Ok(Some(response.start))
    }
}

#[cfg(test)]
#[path = "split_leaser_tests.rs"]
mod tests;
