//! `ServiceDataset`: a dataset whose elements come from the service, plus the ops the caller
//! chains after `distribute` (they run locally, in this process).
//!
//! Each call of [`ServiceDataset::iter`] is a new epoch: it uses the next repetition of the job,
//! so it reads a new iteration (tf.data's per-dataset-object repetition counter).
//!
//! `distribute`, `register_dataset` and `from_dataset_id` are methods of the transport's
//! `DispatcherClient` through [`DispatcherClientExt`]: what the client library adds to the
//! dispatcher's RPCs (definitions checked and expanded here, element specs, job namespaces).

use crate::client_metrics::ClientMetrics;
use crate::element_stream::ElementStream;
use crate::error::ClientError;
use crate::options::{effective_target_workers, DistributeOptions, RegisterOptions};
use crate::read_params::ReadParams;
use crate::reader_state::{Checkpointing, ReaderState};
use sluice_element::Compression;
use sluice_element::{pb as dpb, ElementSpec, PythonRunner};
use sluice_pipeline::{Dataset, FunctionRegistry, Transform};
use sluice_proto::dispatcher as pb;
use sluice_rpc::{DispatcherClient, JobRequest, LocalWorkers};
use sluice_types::{DatasetId, ShardingPolicy};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A dataset served by the Sluice service.
#[derive(Clone)]
pub struct ServiceDataset {
    client: DispatcherClient,
    dataset_id: String,
    mode: ShardingPolicy,
    /// `job_name` here is the name sent to the dispatcher (namespaced for `from_dataset_id`).
    options: DistributeOptions,
    /// The definition the workers run, as registered (file patterns expanded).
    definition: dpb::DatasetDef,
    element_spec: ElementSpec,
    /// As registered (`INFINITE`, `UNKNOWN` or a count): the cross-trainer cache needs infinite.
    cardinality: i64,
    compression: Compression,
    local_ops: Vec<dpb::Op>,
    /// Runs the Python ops among `local_ops` (the reader's own interpreter); `None` refuses
    /// them when an epoch starts.
    python: Option<Arc<dyn PythonRunner>>,
    /// Next repetition, shared by clones (they are the same dataset object).
    repetition: Arc<AtomicU64>,
    /// The state the next epoch resumes from (`load_state`), shared by clones.
    resume: Arc<Mutex<Option<ReaderState>>>,
}

impl std::fmt::Debug for ServiceDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceDataset")
            .field("dataset_id", &self.dataset_id)
            .field("mode", &self.mode)
            .field("job_name", &self.options.job_name)
            .field("local_ops", &self.local_ops.len())
            .field("python", &self.python)
            .finish()
    }
}

impl Transform for ServiceDataset {
    fn push_op(mut self, op: dpb::Op) -> Self {
        self.local_ops.push(op);
        self
    }
}

impl ServiceDataset {
    pub fn dataset_id(&self) -> &str {
        &self.dataset_id
    }

    /// The element spec of what the service produces (before local ops).
    pub fn service_element_spec(&self) -> &ElementSpec {
        &self.element_spec
    }

    /// The element spec of what an epoch yields: the service's, through the local ops.
    pub fn element_spec(&self) -> Result<ElementSpec, ClientError> {
        Ok(sluice_pipeline::ops_element_spec(
            self.element_spec.clone(),
            &self.local_ops,
            &FunctionRegistry::global(),
        )?)
    }

    /// The registered definition: what the workers run.
    pub fn definition(&self) -> &dpb::DatasetDef {
        &self.definition
    }

    /// The same dataset object (same repetitions) without the ops chained after `distribute`.
    pub(crate) fn without_local_ops(&self) -> ServiceDataset {
        ServiceDataset {
            local_ops: Vec::new(),
            ..self.clone()
        }
    }

    /// The same dataset object whose local Python ops run with `runner`.
    pub fn with_python_runner(self, runner: Arc<dyn PythonRunner>) -> ServiceDataset {
        ServiceDataset {
            python: Some(runner),
            ..self
        }
    }

    /// The ops chained after `distribute`, run in this process.
    pub fn local_ops(&self) -> &[dpb::Op] {
        &self.local_ops
    }

    pub fn processing_mode(&self) -> ShardingPolicy {
        self.mode
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The job name sent to the dispatcher, if any.
    pub fn job_name(&self) -> Option<&str> {
        self.options.job_name.as_deref()
    }

    /// The dataset's cardinality as registered (what one worker's pipeline yields):
    /// `INFINITE`, `UNKNOWN` or a count.
    pub fn registered_cardinality(&self) -> i64 {
        self.cardinality
    }

    /// What an epoch read through the service yields, as tf.data reports it
    /// (`reader_cardinality`).
    pub fn cardinality(&self) -> i64 {
        reader_cardinality(
            self.cardinality,
            self.mode,
            self.options.num_consumers.is_some(),
        )
    }

    /// Makes the next epoch resume from `state` (a reader's state, see [`ReaderState`]): it is
    /// the epoch the state was taken in, and what was handed out before the state was taken,
    /// by this reader and by every reader of the job that took a state at the same step, is not
    /// delivered again; everything else is, once. Checked here against this dataset's job; the
    /// dispatcher checks the rest when the epoch starts.
    pub fn load_state(&self, state: ReaderState) -> Result<(), ClientError> {
        state.check(self.options.job_name.as_deref())?;
        *self.resume.lock().unwrap_or_else(|e| e.into_inner()) = Some(state);
        Ok(())
    }

    /// Starts reading the next epoch. A `repeat` among the ops after `distribute` reads the
    /// job's next repetitions, one per pass (see `ElementStream::repeated`).
    pub async fn iter(&self) -> Result<ElementStream, ClientError> {
        let last_repeat = self
            .local_ops
            .iter()
            .rposition(|op| matches!(op.kind, Some(dpb::op::Kind::Repeat(_))));
        if let Some(k) = last_repeat {
            return self.iter_repeated(k);
        }
        self.iter_one_epoch().await
    }

    /// Reads passes of the ops before the `repeat` at `local_ops[k]`, then the ops after it.
    fn iter_repeated(&self, k: usize) -> Result<ElementStream, ClientError> {
        if self
            .resume
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return Err(ClientError::FailedPrecondition(
                "a reader with a repeat after `distribute` cannot resume from a state: move the \
                 repeat before `distribute`"
                    .into(),
            ));
        }
        let Some(dpb::op::Kind::Repeat(repeat)) = &self.local_ops[k].kind else {
            unreachable!("local_ops[{k}] is a repeat");
        };
        let inner = ServiceDataset {
            local_ops: self.local_ops[..k].to_vec(),
            ..self.clone()
        };
        ElementStream::repeated(
            move || {
                let inner = inner.clone();
                async move { Box::pin(inner.iter()).await }
            },
            repeat.count,
            self.local_ops[k + 1..].to_vec(),
            self.python.clone(),
        )
    }

    async fn iter_one_epoch(&self) -> Result<ElementStream, ClientError> {
        let resume = self.resume.lock().unwrap_or_else(|e| e.into_inner()).take();
        let repetition = match &resume {
            Some(state) => {
                self.repetition.store(state.epoch + 1, Ordering::Relaxed);
                state.epoch
            }
            None => self.repetition.fetch_add(1, Ordering::Relaxed),
        };
        if self.mode == ShardingPolicy::Dynamic && has_snapshot(&self.definition) {
            // tf.data's class and text, when the epoch starts: a snapshot's file is one
            // sequence, not splits.
            return Err(ClientError::Rpc {
                code: tonic::Code::Unimplemented,
                message: "Splitting is not implemented for snapshot datasets".into(),
            });
        }
        ReadParams {
            mode: self.mode,
            job_name: self.options.job_name.as_deref(),
            num_consumers: self.options.num_consumers,
            cross_trainer_cache: self.options.cross_trainer_cache.is_some(),
            target_workers: self.options.target_workers,
            cardinality: self.cardinality,
            repetition,
        }
        .validate()?;
        let job_id = self
            .client
            .get_or_create_job(&JobRequest {
                dataset_id: DatasetId(self.dataset_id.clone()),
                sharding: self.mode,
                job_name: self.options.job_name.clone(),
                num_consumers: self.options.num_consumers,
                use_cross_trainer_cache: self.options.cross_trainer_cache.is_some(),
                target_workers: self.options.target_workers,
                delivery: self.options.delivery,
            })
            .await?;
        let iteration = match &resume {
            Some(state) => {
                self.client
                    .resume_iteration(job_id, repetition, state.step, &state.reader)
                    .await?
            }
            None => {
                self.client
                    .get_or_create_iteration(job_id, repetition)
                    .await?
            }
        };
        let checkpointing = match &self.options.job_name {
            Some(_) => Ok(Checkpointing {
                client: self.client.clone(),
                client_id: iteration.client_id,
                first_step: resume.as_ref().map_or(0, |s| s.step),
                base_step: None,
            }),
            None => Err(
                "a reader's state needs a named job (`job_name`): a restored reader \
                         finds its epoch by the job's name"
                    .to_string(),
            ),
        };
        let mut options = self.options.clone();
        options.target_workers = effective_target_workers(
            self.mode,
            options.target_workers,
            !LocalWorkers::global().is_empty(),
        );
        ElementStream::start(
            self.client.clone(),
            iteration,
            &options,
            self.local_ops.clone(),
            self.python.clone(),
            ClientMetrics::global().for_read(&self.dataset_id, self.options.job_name.as_deref()),
            checkpointing,
        )
    }
}

/// The client library's calls on a [`DispatcherClient`]: tf.data's `register_dataset`,
/// `distribute` and `from_dataset_id`.
pub trait DispatcherClientExt {
    /// Registers `dataset` and returns its id. Functions are checked against this process's
    /// registry; file patterns are expanded here, relative to the current directory.
    fn register_dataset(
        &self,
        dataset: &Dataset,
        options: &RegisterOptions,
    ) -> impl Future<Output = Result<String, ClientError>> + Send;

    /// Registers `dataset` and reads it through the service (tf.data's `distribute`). The job
    /// name, if any, is global: every consumer using it shares the job.
    fn distribute(
        &self,
        dataset: &Dataset,
        mode: ShardingPolicy,
        options: DistributeOptions,
    ) -> impl Future<Output = Result<ServiceDataset, ClientError>> + Send;

    /// Reads an already registered dataset. Job names are namespaced by the dataset id, as
    /// tf.data does, so the same name on another dataset is another job.
    // tf.data's name; it reads through this client, so it takes `self`.
    #[allow(clippy::wrong_self_convention)]
    fn from_dataset_id(
        &self,
        mode: ShardingPolicy,
        dataset_id: &str,
        options: DistributeOptions,
    ) -> impl Future<Output = Result<ServiceDataset, ClientError>> + Send;
}

impl DispatcherClientExt for DispatcherClient {
    async fn register_dataset(
        &self,
        dataset: &Dataset,
        options: &RegisterOptions,
    ) -> Result<String, ClientError> {
        Ok(register_definition(self, dataset, options).await?.0)
    }

    async fn distribute(
        &self,
        dataset: &Dataset,
        mode: ShardingPolicy,
        options: DistributeOptions,
    ) -> Result<ServiceDataset, ClientError> {
        options.validate()?;
        if mode == ShardingPolicy::Dynamic {
            // Refused before registering: a definition with a random source (or none) has no
            // split providers for distributed_epoch to hand out.
            sluice_pipeline::split_providers(dataset.def())?;
        }
        let register = RegisterOptions {
            compression: options.compression,
            dataset_id: None,
        };
        let (dataset_id, definition) = register_definition(self, dataset, &register).await?;
        let element_spec = sluice_pipeline::element_spec(&definition, &FunctionRegistry::global())?;
        let cardinality = sluice_pipeline::cardinality(&definition);
        Ok(service_dataset(
            self,
            dataset_id,
            mode,
            options,
            definition,
            element_spec,
            cardinality,
        ))
    }

    async fn from_dataset_id(
        &self,
        mode: ShardingPolicy,
        dataset_id: &str,
        mut options: DistributeOptions,
    ) -> Result<ServiceDataset, ClientError> {
        options.validate()?;
        let response = self
            .get_dataset(&DatasetId(dataset_id.to_string()))
            .await
            .map_err(|e| match ClientError::from(e) {
                ClientError::NotFound(_) => ClientError::NotFound(format!(
                    "Dataset id {dataset_id} not found. It must be registered with \
                     `register_dataset` before calling `from_dataset_id`."
                )),
                other => other,
            })?;
        let definition = response.dataset.unwrap_or_default();
        if mode == ShardingPolicy::Dynamic {
            sluice_pipeline::split_providers(&definition)?;
        }
        let metadata = response.metadata.unwrap_or_default();
        let element_spec = metadata
            .element_spec
            .as_ref()
            .map(ElementSpec::from_proto)
            .transpose()?
            .ok_or_else(|| {
                ClientError::FailedPrecondition(format!(
                    "Failed to fetch element spec for dataset id {dataset_id} from the service."
                ))
            })?;
        options.compression = Compression::from_proto(metadata.compression)?;
        options.job_name = options
            .job_name
            .map(|name| format!("dataset_id=/{dataset_id}/{name}"));
        Ok(service_dataset(
            self,
            dataset_id.to_string(),
            mode,
            options,
            definition,
            element_spec,
            metadata.cardinality,
        ))
    }
}

/// Registers `dataset`; returns its id and the definition as registered.
async fn register_definition(
    client: &DispatcherClient,
    dataset: &Dataset,
    options: &RegisterOptions,
) -> Result<(String, dpb::DatasetDef), ClientError> {
    let registry = FunctionRegistry::global();
    let mut def = dataset.def().clone();
    absolutize_file_pattern(&mut def)?;
    sluice_pipeline::validate(&def, &registry)?;
    check_external_state(&def)?;
    // In the user's own process, so unrestricted: the dispatcher checks the list it is sent
    // against its own data roots.
    sluice_formats::expand_files(&mut def, &sluice_formats::FileAccess::Unrestricted)?;
    let spec = sluice_pipeline::element_spec(&def, &registry)?;
    let metadata = pb::DatasetMetadata {
        element_spec: Some(spec.to_proto()),
        cardinality: sluice_pipeline::cardinality(&def),
        compression: options.compression.to_proto() as i32,
    };
    if let Some(id) = &options.dataset_id {
        if id.is_empty() {
            return Err(ClientError::InvalidArgument(
                "`dataset_id` must not be empty".into(),
            ));
        }
    }
    let dataset_id = options.dataset_id.clone().map(DatasetId);
    let registered = client
        .register_dataset_def(&def, dataset_id.as_ref(), &metadata)
        .await?;
    Ok((registered.0, def))
}

/// Whether `def` (or a dataset nested in it) has a `snapshot` op.
fn has_snapshot(def: &dpb::DatasetDef) -> bool {
    let mut found = false;
    sluice_pipeline::nested::walk(def, |d, _| {
        found |= d
            .ops
            .iter()
            .any(|op| matches!(&op.kind, Some(dpb::op::Kind::Cache(c)) if c.snapshot));
    });
    found
}

/// tf.data's `experimental_external_state_policy`, applied when a definition is registered:
/// `FAIL` refuses one whose Python functions keep state outside it (their code, what they
/// capture), `WARN` logs them, `IGNORE` and an unset policy say nothing.
fn check_external_state(def: &dpb::DatasetDef) -> Result<(), ClientError> {
    use dpb::DatasetOptionsExternalStatePolicy as Policy;
    let policy = def
        .options
        .as_ref()
        .map_or(Policy::ExternalStatePolicyUnset, |o| {
            o.external_state_policy()
        });
    if matches!(
        policy,
        Policy::ExternalStatePolicyUnset | Policy::ExternalStatePolicyIgnore
    ) {
        return Ok(());
    }
    let functions = sluice_pipeline::python_op::python_functions(def);
    if functions.is_empty() {
        return Ok(());
    }
    let functions = functions.join("', '");
    if policy == Policy::ExternalStatePolicyFail {
        return Err(ClientError::FailedPrecondition(format!(
            "the dataset depends on external state: its Python functions ('{functions}') keep \
             state outside the dataset (their code and what they capture), and \
             `experimental_external_state_policy` is FAIL; set it to WARN or IGNORE to \
             distribute the dataset"
        )));
    }
    tracing::warn!(
        "the dataset depends on external state: its Python functions ('{functions}') keep state \
         outside the dataset, which the workers run as pickled"
    );
    Ok(())
}

fn service_dataset(
    client: &DispatcherClient,
    dataset_id: String,
    mode: ShardingPolicy,
    options: DistributeOptions,
    definition: dpb::DatasetDef,
    element_spec: ElementSpec,
    cardinality: i64,
) -> ServiceDataset {
    ServiceDataset {
        client: client.clone(),
        dataset_id,
        mode,
        compression: options.compression,
        options,
        definition,
        element_spec,
        cardinality,
        local_ops: Vec::new(),
        python: None,
        repetition: Arc::new(AtomicU64::new(0)),
        resume: Arc::default(),
    }
}

/// Makes a relative file pattern absolute against this process's current directory, so workers
/// and dispatchers elsewhere read the files the user meant.
fn absolutize_file_pattern(def: &mut dpb::DatasetDef) -> Result<(), ClientError> {
    // Every files source, nested datasets' included.
    let mut result = Ok(());
    sluice_pipeline::nested::walk_mut(def, &mut |d| {
        let Some(dpb::source::Kind::Files(files)) = d.source.as_mut().and_then(|s| s.kind.as_mut())
        else {
            return;
        };
        if !files.files.is_empty()
            || std::path::Path::new(&files.pattern).is_absolute()
            || sluice_formats::is_object_url(&files.pattern)
        {
            return;
        }
        match std::env::current_dir() {
            Ok(cwd) => files.pattern = cwd.join(&files.pattern).to_string_lossy().into_owned(),
            Err(e) => {
                result = Err(ClientError::InvalidArgument(format!(
                    "current directory: {e}"
                )))
            }
        }
    });
    result
}

/// The cardinality tf.data reports for a dataset read through the service, from the registered
/// one: a coordinated read never ends (`INFINITE`); an empty dataset stays empty; an infinite one
/// stays infinite where each worker runs it whole or a part of it (OFF, DYNAMIC, DATA); anything
/// else is `UNKNOWN`, since how many workers contribute is not known up front (`range(10)` over
/// two workers in parallel epochs yields 20).
pub fn reader_cardinality(registered: i64, mode: ShardingPolicy, coordinated: bool) -> i64 {
    use sluice_pipeline::{INFINITE, UNKNOWN};
    if coordinated {
        return INFINITE;
    }
    match registered {
        0 => 0,
        INFINITE
            if matches!(
                mode,
                ShardingPolicy::Off | ShardingPolicy::Dynamic | ShardingPolicy::Data
            ) =>
        {
            INFINITE
        }
        _ => UNKNOWN,
    }
}

#[cfg(test)]
mod cardinality_tests {
    use super::*;
    use sluice_pipeline::{INFINITE, UNKNOWN};

    #[test]
    fn a_reader_reports_tf_datas_cardinality() {
        use ShardingPolicy::*;
        let rows = [
            // (registered, mode, coordinated, reported)
            (10, Off, false, UNKNOWN),
            (10, Dynamic, false, UNKNOWN),
            (10, FileOrData, false, UNKNOWN),
            (0, Off, false, 0),
            (0, File, false, 0),
            (INFINITE, Off, false, INFINITE),
            (INFINITE, Dynamic, false, INFINITE),
            (INFINITE, Data, false, INFINITE),
            (INFINITE, File, false, UNKNOWN),
            (INFINITE, FileOrData, false, UNKNOWN),
            (INFINITE, Hint, false, UNKNOWN),
            (UNKNOWN, Off, false, UNKNOWN),
            (UNKNOWN, FileOrData, false, UNKNOWN),
            (INFINITE, Off, true, INFINITE),
            (10, Off, true, INFINITE),
        ];
        for (registered, mode, coordinated, reported) in rows {
            assert_eq!(
                reader_cardinality(registered, mode, coordinated),
                reported,
                "{registered} under {mode:?}, coordinated {coordinated}"
            );
        }
    }
}
