//! Jobs: get-or-create by name, where a named job requested again must ask for the same
//! parameters.

use super::DispatcherState;
use crate::state::entities::Job;
use crate::state::update::{JobOptions, Outcome, Rejection};
use sluice_types::{DatasetId, Delivery, IterationId, JobId, ShardingPolicy};

impl DispatcherState {
    pub(super) fn coordinated(&self, iteration_id: IterationId) -> bool {
        let job_id = self.iterations[&iteration_id].job_id;
        self.jobs[&job_id].options.num_consumers.is_some()
    }

    pub(super) fn get_or_create_job(
        &mut self,
        dataset_id: &DatasetId,
        sharding: ShardingPolicy,
        job_name: Option<&str>,
        anonymous_suffix: u64,
        options: JobOptions,
        now_micros: u64,
    ) -> Result<Outcome, Rejection> {
        let Some(dataset) = self.datasets.get(dataset_id) else {
            return Err(Rejection::NotFound(format!(
                "Dataset id {dataset_id} not found"
            )));
        };
        let definition = dataset.definition;
        // A definition without split providers (a random source in it) has no splits to
        // hand out.
        if sharding == ShardingPolicy::Dynamic && dataset.num_splits.is_empty() {
            return Err(Rejection::InvalidArgument(format!(
                "Dataset {dataset_id} has no split provider, so it cannot be read in \
                 distributed_epoch mode: its sources must all be splittable (range, \
                 from_slices, from_tensors or files; not random); use parallel_epochs or a \
                 static sharding policy"
            )));
        }
        if let Some(name) = job_name {
            if name.is_empty() {
                return Err(Rejection::InvalidArgument(
                    "`job_name` must not be empty".into(),
                ));
            }
            if let Some(job) = self.job_names.get(name).and_then(|id| self.jobs.get(id)) {
                let mut diff = String::new();
                if job.sharding != sharding {
                    diff += &format!(
                        "Existing processing mode: <{}>; got <{}>. ",
                        job.sharding, sharding
                    );
                }
                let enabled = |on: bool| if on { "enabled" } else { "disabled" };
                if job.options.use_cross_trainer_cache != options.use_cross_trainer_cache {
                    diff += &format!(
                        "Existing cross-trainer cache: <{}>; got <{}>. ",
                        enabled(job.options.use_cross_trainer_cache),
                        enabled(options.use_cross_trainer_cache)
                    );
                }
                if job.options.target_workers != options.target_workers {
                    diff += &format!(
                        "Existing target workers: <{}>; got <{}>. ",
                        job.options.target_workers, options.target_workers
                    );
                }
                // tf.data ignores a different number of consumers; rounds of another
                // size cannot be shared, so Sluice rejects it.
                if job.options.num_consumers != options.num_consumers {
                    let show = |n: Option<u32>| n.map_or("none".to_string(), |n| n.to_string());
                    diff += &format!(
                        "Existing number of consumers: <{}>; got <{}>. ",
                        show(job.options.num_consumers),
                        show(options.num_consumers)
                    );
                }
                // Consumers of a shared job each register the dataset (and get their own id),
                // so datasets are compared by definition; another definition is another
                // dataset (tf.data silently serves the first one).
                let job_dataset = self.datasets.get(&job.dataset_id);
                if job_dataset.map(|d| d.definition) != Some(definition) {
                    diff += &format!(
                        "Existing dataset: {}; got {}, whose definition differs. ",
                        job.dataset_id, dataset_id
                    );
                }
                // The same definition registered with another compression: its readers expect
                // elements encoded otherwise (tf.data fails such a reader with a data type
                // mismatch once it reads).
                let compression =
                    |id: &DatasetId| self.datasets.get(id).map(|d| d.metadata.compression);
                if let (Some(existing), Some(got)) =
                    (compression(&job.dataset_id), compression(dataset_id))
                {
                    if existing != got {
                        diff += &format!(
                            "Existing compression: <{existing}>; got <{got}> (Data type \
                             mismatch). "
                        );
                    }
                }
                return if diff.is_empty() {
                    let (job_id, job_dataset) = (job.id, job.dataset_id.clone());
                    self.touch_job(job_id, &job_dataset, now_micros);
                    Ok(Outcome::Job { job_id })
                } else {
                    Err(Rejection::InvalidArgument(format!(
                        "Tried to create job with name {name}, but found an existing job with \
                         different parameters: {diff}"
                    )))
                };
            }
        }
        let id = JobId(self.next_job_id);
        self.next_job_id = self.next_job_id.saturating_add(1);
        let name = match job_name {
            Some(name) => name.to_string(),
            None => format!("anonymous_job_{id}_{anonymous_suffix}"),
        };
        self.job_names.insert(name.clone(), id);
        self.jobs.insert(
            id,
            Job {
                id,
                name,
                dataset_id: dataset_id.clone(),
                sharding,
                options,
                iterations: 0,
                last_used_micros: now_micros,
            },
        );
        if let Some(dataset) = self.datasets.get_mut(dataset_id) {
            dataset.jobs += 1;
        }
        self.touch_job(id, dataset_id, now_micros);
        Ok(Outcome::Job { job_id: id })
    }

    /// `get_or_create_job`, and how the job delivers: recorded for a new job; a named job asked
    /// for again must deliver as asked (compared as it applies: exactly once only for jobs it
    /// applies to). Checked before anything changes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn get_or_create_job_with_delivery(
        &mut self,
        dataset_id: &DatasetId,
        sharding: ShardingPolicy,
        job_name: Option<&str>,
        anonymous_suffix: u64,
        options: JobOptions,
        delivery: Delivery,
        now_micros: u64,
    ) -> Result<Outcome, Rejection> {
        let effective = effective_delivery(sharding, options, delivery);
        if let Some(job) = job_name
            .and_then(|name| self.job_names.get(name))
            .and_then(|id| self.jobs.get(id))
        {
            let existing = self.job_delivery(job.id);
            let comparable = job.sharding == sharding && job.options == options;
            if comparable && existing != effective {
                return Err(Rejection::InvalidArgument(format!(
                    "Tried to create job with name {}, but found an existing job with \
                     different parameters: Existing delivery: <{existing}>; got <{effective}>. ",
                    job.name
                )));
            }
        }
        let existed = job_name.is_some_and(|name| self.job_names.contains_key(name));
        let outcome = self.get_or_create_job(
            dataset_id,
            sharding,
            job_name,
            anonymous_suffix,
            options,
            now_micros,
        )?;
        if let (false, Outcome::Job { job_id }) = (existed, &outcome) {
            self.set_job_delivery(*job_id, effective);
        }
        Ok(outcome)
    }

    /// A job (and the dataset it reads) was asked for at `now_micros`.
    fn touch_job(&mut self, job_id: JobId, dataset_id: &DatasetId, now_micros: u64) {
        if let Some(job) = self.jobs.get_mut(&job_id) {
            job.last_used_micros = job.last_used_micros.max(now_micros);
        }
        if let Some(dataset) = self.datasets.get_mut(dataset_id) {
            dataset.last_used_micros = dataset.last_used_micros.max(now_micros);
        }
    }
}

/// How a job of `sharding` and `options` asked to deliver `delivery` delivers: exactly once
/// applies to jobs whose workers share out the data (distributed_epoch and the static
/// policies), without coordinated reads or a cross-trainer cache.
pub(super) fn effective_delivery(
    sharding: ShardingPolicy,
    options: JobOptions,
    delivery: Delivery,
) -> Delivery {
    let applies = sharding != ShardingPolicy::Off
        && options.num_consumers.is_none()
        && !options.use_cross_trainer_cache;
    if applies {
        delivery
    } else {
        Delivery::AtMostOnce
    }
}
