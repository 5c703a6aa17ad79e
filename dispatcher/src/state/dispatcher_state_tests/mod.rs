//! Table tests of `DispatcherState::apply`: each case is a script of requests applied to a fresh
//! state, with the outcome every step must produce. This module holds the updates and outcomes
//! the tables are written in and the runner; the tables are in one file per entity beside it.

use super::*;
use sluice_element::Compression;
use sluice_types::{
    ClientId, DatasetId, IterationId, JobId, LeaseRequest, ShardingPolicy, SplitLease,
    TargetWorkers, TaskId,
};

mod checkpoints;
mod coordinated_reads;
mod crashes;
mod datasets;
mod exactly_once;
mod expiry_and_removal;
mod fetch_key;
mod jobs_and_splits;
mod properties;
mod requests;
mod workers;

fn meta() -> DatasetMetadata {
    DatasetMetadata {
        element_spec: vec![1, 2],
        cardinality: 10,
        compression: Compression::Auto,
    }
}
fn register(id: Option<&str>, def: &[u8]) -> Update {
    Update::RegisterDataset {
        dataset_id: id.map(|s| DatasetId(s.into())),
        def: def.to_vec(),
        metadata: meta(),
        num_splits: vec![3],
    }
}
/// A dataset whose definition has no split provider (a random source in it, say): no split
/// counts.
fn register_without_provider(id: &str) -> Update {
    Update::RegisterDataset {
        dataset_id: Some(DatasetId(id.into())),
        def: b"nested".to_vec(),
        metadata: meta(),
        num_splits: Vec::new(),
    }
}
/// `register` with the cardinality the dispatcher computed (-1 infinite, -2 unknown).
fn register_with_cardinality(id: &str, def: &[u8], cardinality: i64) -> Update {
    Update::RegisterDataset {
        dataset_id: Some(DatasetId(id.into())),
        def: def.to_vec(),
        metadata: DatasetMetadata {
            cardinality,
            ..meta()
        },
        num_splits: vec![1],
    }
}
/// `register` of a dataset its client asked to send uncompressed.
fn register_uncompressed(def: &[u8]) -> Update {
    Update::RegisterDataset {
        dataset_id: None,
        def: def.to_vec(),
        metadata: DatasetMetadata {
            compression: Compression::None,
            ..meta()
        },
        num_splits: vec![3],
    }
}
fn worker(address: &str) -> Update {
    static_worker(address, &[])
}
/// A worker registered by a leader configured with the static-sharding list `list`.
fn static_worker(address: &str, list: &[&str]) -> Update {
    Update::RegisterWorker {
        address: address.into(),
        tags: vec![],
        worker_addresses: list.iter().map(|s| s.to_string()).collect(),
        owner: String::new(),
    }
}
fn job(dataset: &str, sharding: ShardingPolicy, name: Option<&str>) -> Update {
    Update::GetOrCreateJob {
        dataset_id: DatasetId(dataset.into()),
        sharding,
        job_name: name.map(Into::into),
        anonymous_suffix: 7,
        options: JobOptions::default(),
    }
}
fn iteration(job: u64, repetition: u64) -> Update {
    Update::GetOrCreateIteration {
        job_id: JobId(job),
        repetition,
    }
}
fn lease(iteration: u64, task: u64, repetition: u64, max_splits: u32) -> Update {
    Update::LeaseSplits(LeaseRequest {
        iteration_id: IterationId(iteration),
        provider: 0,
        repetition,
        max_splits,
        task_id: TaskId(task),
    })
}
/// `lease` of split provider `provider`.
fn lease_of(iteration: u64, task: u64, provider: u32, repetition: u64, max_splits: u32) -> Update {
    Update::LeaseSplits(LeaseRequest {
        iteration_id: IterationId(iteration),
        provider,
        repetition,
        max_splits,
        task_id: TaskId(task),
    })
}
/// `register` of a definition with a split provider of each of `num_splits`' counts (a zip of
/// ranges, say).
fn register_providers(def: &[u8], num_splits: &[u64]) -> Update {
    Update::RegisterDataset {
        dataset_id: None,
        def: def.to_vec(),
        metadata: meta(),
        num_splits: num_splits.to_vec(),
    }
}
fn finish(worker: &str, tasks: &[u64]) -> Update {
    Update::FinishTasks {
        worker: worker.into(),
        task_ids: tasks.iter().map(|t| TaskId(*t)).collect(),
    }
}
fn release(client: u64) -> Update {
    Update::ReleaseIterationClient {
        client_id: ClientId(client),
    }
}

fn registered(id: &str) -> Outcome {
    Outcome::DatasetRegistered {
        dataset_id: DatasetId(id.into()),
    }
}
fn workers_tasks(tasks: &[u64]) -> Outcome {
    Outcome::WorkerRegistered {
        tasks: tasks.iter().map(|t| TaskId(*t)).collect(),
    }
}
fn job_id(id: u64) -> Outcome {
    Outcome::Job { job_id: JobId(id) }
}
fn iter_client(iteration: u64, client: u64) -> Outcome {
    Outcome::Iteration {
        iteration_id: IterationId(iteration),
        client_id: ClientId(client),
    }
}
fn splits(repetition: u64, start: u64, end: u64) -> Outcome {
    Outcome::Splits(SplitLease {
        repetition,
        start,
        end,
        end_of_splits: false,
    })
}
fn end_of_splits(repetition: u64) -> Outcome {
    Outcome::Splits(SplitLease {
        repetition,
        start: 0,
        end: 0,
        end_of_splits: true,
    })
}
/// A part of the definition `def` (the key is the whole definition's).
fn stage(def: &[u8], offset: u64, part: &[u8]) -> Update {
    Update::StageDefinition {
        key: definition_key(def),
        offset,
        bytes: part.to_vec(),
    }
}
fn register_staged(id: Option<&str>, def: &[u8], len: u64) -> Update {
    Update::RegisterStagedDataset {
        dataset_id: id.map(|s| DatasetId(s.into())),
        key: definition_key(def),
        len,
        metadata: meta(),
        num_splits: vec![3],
    }
}
fn staged(bytes: u64) -> Outcome {
    Outcome::DefinitionStaged { staged: bytes }
}
fn not_found(msg: &str) -> Outcome {
    Outcome::Rejected(Rejection::NotFound(msg.into()))
}
fn invalid(msg: &str) -> Outcome {
    Outcome::Rejected(Rejection::InvalidArgument(msg.into()))
}
fn precondition(msg: &str) -> Outcome {
    Outcome::Rejected(Rejection::FailedPrecondition(msg.into()))
}

fn run(name: &str, steps: Vec<(Update, Outcome)>) -> DispatcherState {
    let mut state = DispatcherState::default();
    for (i, (update, want)) in steps.into_iter().enumerate() {
        let got = state.apply(
            ApplyContext::default(),
            &Request {
                id: None,
                update: update.clone(),
            },
        );
        assert_eq!(got, want, "case {name:?}, step {i}: {update:?}");
    }
    state
}

fn remove_worker(address: &str) -> Update {
    Update::RemoveWorker {
        address: address.into(),
    }
}
fn gc(iteration: u64) -> Update {
    Update::GarbageCollectIteration {
        iteration_id: IterationId(iteration),
    }
}

fn rounds(client: u64, current_round: u64, blocked_round: Option<u64>) -> Update {
    Update::ClientRounds {
        client_id: ClientId(client),
        current_round,
        blocked_round,
    }
}

fn remove_task(task: u64) -> Update {
    Update::RemoveTask {
        task_id: TaskId(task),
    }
}
