//! Fetching a task's dataset definition from the dispatcher when its pipeline starts.
//!
//! Task assignments name the dataset by id only, so a heartbeat reply stays small however large
//! the definitions of its tasks are; each task fetches its definition once, with `GetDataset`,
//! on its pipeline thread as the pipeline starts (so a task no client reads never fetches).
//! The call follows the leader and retries retryable failures as every dispatcher call of the
//! worker does; the pipeline thread waits on a channel and stops waiting as soon as the task is
//! cancelled or the runtime goes away. A failure that retrying cannot mend (an unknown dataset,
//! a refused call) fails the task, naming the dataset.
//!
//! There is deliberately no cache of definitions across tasks: a dataset id may name another
//! definition once the dispatcher has collected the first, and one fetch per task is already
//! one per iteration and worker. The blobs a definition names (its large tensors) are another
//! matter: named by their content, they are fetched once and cached (see `blob_cache`).

use crate::blob_cache;
use crate::task_failure::TaskFailure;
use sluice_element::pb as dpb;
use sluice_proto::dispatcher as pb;
use sluice_rpc::DispatcherClient;
use sluice_types::DatasetId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::runtime::Handle;

/// How often a waiting pipeline thread looks at its task's cancellation.
const CANCEL_CHECK: Duration = Duration::from_millis(50);

/// The definition of `dataset_id` for task `task_id`; `Ok(None)` when the task was cancelled
/// while waiting.
pub fn fetch_definition(
    client: &DispatcherClient,
    runtime: &Handle,
    task_id: u64,
    dataset_id: &str,
    cancelled: &AtomicBool,
) -> Result<Option<dpb::DatasetDef>, TaskFailure> {
    let (tx, rx) = flume::bounded(1);
    let client = client.clone();
    let id = DatasetId(dataset_id.to_string());
    let call = runtime.spawn(async move {
        let mut fetched = client.get_dataset(&id).await.map_err(|e| e.to_string());
        // The definition's large tensors travel apart from it, as blobs: put them back.
        if let Ok(pb::GetDatasetResponse {
            dataset: Some(def), ..
        }) = &mut fetched
        {
            if let Err(e) = blob_cache::resolve(&client, def).await {
                fetched = Err(e);
            }
        }
        let _ = tx.send(fetched);
    });
    let failed = |message: String| {
        TaskFailure::from(format!(
            "task {task_id}: could not fetch the definition of dataset {dataset_id}: {message}"
        ))
    };
    loop {
        if cancelled.load(Ordering::Relaxed) {
            call.abort();
            return Ok(None);
        }
        match rx.recv_timeout(CANCEL_CHECK) {
            Ok(Ok(response)) => {
                return response
                    .dataset
                    .map(Some)
                    .ok_or_else(|| failed("the dispatcher's reply has no definition".into()));
            }
            Ok(Err(e)) => return Err(failed(e)),
            Err(flume::RecvTimeoutError::Timeout) => {}
            Err(flume::RecvTimeoutError::Disconnected) => {
                return Err(failed("the worker is shutting down".into()))
            }
        }
    }
}
