//! `SplitLeaser`: the worker side of distributed_epoch splits.
//!
//! The pipeline thread asks for one split at a time; the leaser hands out indices from the
//! range it leased from the dispatcher and leases the next range when it runs out. A lease is
//! committed at the dispatcher before it arrives here, so the indices are this task's alone; if
//! this worker dies, the rest of its lease is lost (at-most-once), never handed out again. The
//! lease size doubles while the task keeps consuming, so a short task loses little and a long
//! one costs one dispatcher round trip per many splits.

use crate::config::{LeaseEvent, LeaseObserver};
use sluice_client::DispatcherClient;
use sluice_dataset::{DatasetError, SplitSupplier};
use sluice_proto::dispatcher as pb;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::runtime::Handle;

struct Lease {
    repetition: u64,
    next: u64,
    end: u64,
}

pub struct SplitLeaser {
    client: DispatcherClient,
    iteration_id: u64,
    task_id: u64,
    runtime: Handle,
    max_lease: u32,
    /// Per provider: the current lease and the size of the next one. A std mutex held while
    /// blocking on the lease RPC: only the task's own pipeline thread calls in.
    leases: Mutex<HashMap<u32, (Lease, u32)>>,
    first_lease: u32,
    /// Told of every lease, with this worker's address.
    observer: Option<(LeaseObserver, String)>,
}

impl SplitLeaser {
    pub fn new(
        client: DispatcherClient,
        iteration_id: u64,
        task_id: u64,
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
            leases: Mutex::new(HashMap::new()),
            observer,
        }
    }
}

impl SplitSupplier for SplitLeaser {
    fn next_split(&self, provider: u32, repetition: u64) -> Result<Option<u64>, DatasetError> {
        let mut leases = self.leases.lock().expect("lease lock poisoned");
        let (lease, size) = leases.entry(provider).or_insert((
            Lease {
                repetition,
                next: 0,
                end: 0,
            },
            self.first_lease,
        ));
        if lease.repetition == repetition && lease.next < lease.end {
            lease.next += 1;
            return Ok(Some(lease.next - 1));
        }
        let request_id = self.client.next_request_id();
        let request = pb::LeaseSplitsRequest {
            iteration_id: self.iteration_id,
            provider_index: provider,
            repetition,
            max_splits: *size,
            task_id: self.task_id,
            request_id: Some(request_id),
        };
        // The RPC runs on the runtime; this thread waits on a channel, so a runtime that shuts
        // down (worker stopping) ends the wait with an error instead of a panic.
        let (tx, rx) = flume::bounded(1);
        let client = self.client.clone();
        self.runtime.spawn(async move {
            let response = client
                .call("lease_splits", Duration::ZERO, |mut c, timeout| {
                    let mut request = tonic::Request::new(request);
                    request.set_timeout(timeout);
                    async move { c.lease_splits(request).await }
                })
                .await;
            let _ = tx.send(response);
        });
        let response = rx
            .recv()
            .map_err(|_| DatasetError::Splits {
                retryable: false,
                message: "the worker is shutting down".into(),
            })?
            .map_err(|e| DatasetError::Splits {
                retryable: e.is_retryable(),
                message: e.to_string(),
            })?;
        if let Some((observer, worker)) = &self.observer {
            (observer.0)(LeaseEvent {
                worker: worker.clone(),
                task_id: self.task_id,
                iteration_id: self.iteration_id,
                provider,
                repetition: response.repetition,
                start: response.start,
                end: response.end,
                end_of_splits: response.end_of_splits,
            });
        }
        if response.end_of_splits {
            *lease = Lease {
                repetition,
                next: 0,
                end: 0,
            };
            return Ok(None);
        }
        *lease = Lease {
            repetition: response.repetition,
            next: response.start + 1,
            end: response.end,
        };
        *size = size.saturating_mul(2).min(self.max_lease);
        Ok(Some(response.start))
    }
}
