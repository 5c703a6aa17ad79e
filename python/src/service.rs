//! tf.data service's reading calls: `distribute`, `register_dataset` and `from_dataset_id`, over
//! `sluice_client`. The Python layer names and documents them; here strings become the Rust
//! enums (with the Rust parsers' error texts) and the calls run on the module's runtime.

use pyo3::prelude::*;
use sluice_client::{
    ClientError, Compression, CrossTrainerCache, Delivery, DispatcherClient, DispatcherClientExt,
    DistributeOptions, RegisterOptions, ShardingPolicy, TargetWorkers,
};

use sluice_client::RetryConfig;
use sluice_security::{ClientSecurity, ClientSecurityFiles, Role};

use crate::errors::{client_error, dataset_error, invalid_argument};
use crate::in_process;
use crate::pipeline::{Dataset, Pipeline};
use crate::runtime::wait;

/// The options shared by `distribute` and `from_dataset_id`.
#[allow(clippy::too_many_arguments)]
fn options(
    job_name: Option<String>,
    consumer_index: Option<u32>,
    num_consumers: Option<u32>,
    max_outstanding_requests: Option<u32>,
    compression: &str,
    cross_trainer_cache: Option<String>,
    target_workers: &str,
    delivery: &str,
) -> PyResult<DistributeOptions> {
    let target_workers = target_workers
        .parse::<TargetWorkers>()
        .map_err(|e| invalid_argument(e.0))?;
    let delivery = delivery
        .parse::<Delivery>()
        .map_err(|e| invalid_argument(e.0))?;
    Ok(DistributeOptions {
        job_name,
        consumer_index,
        num_consumers,
        cross_trainer_cache: cross_trainer_cache.map(CrossTrainerCache::new),
        target_workers,
        max_outstanding_requests,
        compression: compression_of(compression)?,
        delivery,
        ..DistributeOptions::default()
    })
}

fn compression_of(text: &str) -> PyResult<Compression> {
    text.parse().map_err(dataset_error)
}

fn mode_of(text: &str) -> PyResult<ShardingPolicy> {
    text.parse::<ShardingPolicy>()
        .map_err(|e| invalid_argument(e.0))
}

/// A client of `service` with the credentials of this process's environment: tf.data's API has
/// no place for them, so a trainer sets `SLUICE_TLS_CA` (and `SLUICE_TLS_CERT`/`SLUICE_TLS_KEY`
/// for mutual TLS) and `SLUICE_AUTH_TOKEN` or `SLUICE_AUTH_TOKEN_FILE`. Workers are read with
/// the same credentials.
fn client(service: &str) -> Result<DispatcherClient, ClientError> {
    client_as(service, Role::Client)
}

/// A client of `service` acting as `role` (`Role::Admin` for membership changes: a token file
/// with role lines presents its `admin` line).
fn client_as(service: &str, role: Role) -> Result<DispatcherClient, ClientError> {
    let files = ClientSecurityFiles::default().or_env();
    let security = ClientSecurity::load(&files, role)
        .map_err(|e| ClientError::InvalidArgument(format!("{role} credentials: {e}")))?;
    DispatcherClient::connect(service, RetryConfig::default(), security).map_err(ClientError::from)
}

#[pyfunction]
#[pyo3(signature = (dataset, processing_mode, service, job_name=None, consumer_index=None,
    num_consumers=None, max_outstanding_requests=None, compression="AUTO",
    cross_trainer_cache=None, target_workers="AUTO", delivery="exactly_once"))]
#[allow(clippy::too_many_arguments)]
pub fn distribute(
    py: Python<'_>,
    dataset: &Dataset,
    processing_mode: &str,
    service: String,
    job_name: Option<String>,
    consumer_index: Option<u32>,
    num_consumers: Option<u32>,
    max_outstanding_requests: Option<u32>,
    compression: &str,
    cross_trainer_cache: Option<String>,
    target_workers: &str,
    delivery: &str,
) -> PyResult<Dataset> {
    let mode = mode_of(processing_mode)?;
    let options = options(
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        compression,
        cross_trainer_cache,
        target_workers,
        delivery,
    )?;
    let local = dataset.local()?.clone();
    let service = wait(py, async move {
        client(&service)?.distribute(&local, mode, options).await
    })?
    .map_err(client_error)?;
    Ok(Dataset::new(Pipeline::Service(Box::new(
        service.with_python_runner(in_process::runner()),
    ))))
}

#[pyfunction]
#[pyo3(signature = (service, dataset, compression="AUTO", dataset_id=None))]
pub fn register_dataset(
    py: Python<'_>,
    service: String,
    dataset: &Dataset,
    compression: &str,
    dataset_id: Option<String>,
) -> PyResult<String> {
    let options = RegisterOptions {
        compression: compression_of(compression)?,
        dataset_id,
    };
    let local = dataset.local()?.clone();
    wait(py, async move {
        client(&service)?.register_dataset(&local, &options).await
    })?
    .map_err(client_error)
}

#[pyfunction]
#[pyo3(signature = (processing_mode, service, dataset_id, job_name=None, consumer_index=None,
    num_consumers=None, max_outstanding_requests=None, cross_trainer_cache=None,
    target_workers="AUTO", delivery="exactly_once"))]
#[allow(clippy::too_many_arguments)]
pub fn from_dataset_id(
    py: Python<'_>,
    processing_mode: &str,
    service: String,
    dataset_id: String,
    job_name: Option<String>,
    consumer_index: Option<u32>,
    num_consumers: Option<u32>,
    max_outstanding_requests: Option<u32>,
    cross_trainer_cache: Option<String>,
    target_workers: &str,
    delivery: &str,
) -> PyResult<Dataset> {
    let mode = mode_of(processing_mode)?;
    let options = options(
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        "AUTO",
        cross_trainer_cache,
        target_workers,
        delivery,
    )?;
    let service = wait(py, async move {
        client(&service)?
            .from_dataset_id(mode, &dataset_id, options)
            .await
    })?
    .map_err(client_error)?;
    Ok(Dataset::new(Pipeline::Service(Box::new(
        service.with_python_runner(in_process::runner()),
    ))))
}

/// Adds replica `node_id`, started with `join` and serving Raft at `peer_address`, to the quorum
/// at `service` (a learner that catches up, then a voter). Returns the voters after the change.
#[pyfunction]
pub fn add_node(
    py: Python<'_>,
    service: &str,
    node_id: u64,
    peer_address: &str,
) -> PyResult<Vec<u64>> {
    let client = client_as(service, Role::Admin).map_err(client_error)?;
    let peer_address = peer_address.to_string();
    wait(
        py,
        async move { client.add_node(node_id, &peer_address).await },
    )?
    .map_err(|e| client_error(ClientError::from(e)))
}

/// Removes replica `node_id` from the quorum at `service` (even the leader; the rest elect a new
/// one). Returns the voters after the change.
#[pyfunction]
pub fn remove_node(py: Python<'_>, service: &str, node_id: u64) -> PyResult<Vec<u64>> {
    let client = client_as(service, Role::Admin).map_err(client_error)?;
    wait(py, async move { client.remove_node(node_id).await })?
        .map_err(|e| client_error(ClientError::from(e)))
}

/// The JSON document `sluice status` prints, from the replica at `address`: its view of the
/// members, workers, jobs and iterations (with their clients).
#[pyfunction]
pub fn status(py: Python<'_>, address: &str) -> PyResult<String> {
    let client = client(address).map_err(client_error)?;
    wait(py, async move { client.get_status().await })?
        .map_err(|e| client_error(ClientError::from(e)))
}
