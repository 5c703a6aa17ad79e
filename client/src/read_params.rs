//! `ReadParams`: what an epoch is about to read, checked when the iterator is created (tf.data's
//! `ValidateDataServiceParams`), before any job or iteration exists at the dispatcher.
//!
//! The checks need facts `DistributeOptions::validate` cannot see: the registered cardinality,
//! the epoch's repetition, and whether this process runs a worker. The texts are tf.data's.

use crate::error::ClientError;
use sluice_rpc::LocalWorkers;
use sluice_types::{ShardingPolicy, TargetWorkers};

pub(crate) struct ReadParams<'a> {
    pub mode: ShardingPolicy,
    pub job_name: Option<&'a str>,
    pub num_consumers: Option<u32>,
    pub cross_trainer_cache: bool,
    pub target_workers: TargetWorkers,
    /// As registered: `INFINITE`, `UNKNOWN` or a count.
    pub cardinality: i64,
    /// The epoch's repetition of the job (0 for the first epoch of a dataset object).
    pub repetition: u64,
}

impl ReadParams<'_> {
    pub fn validate(&self) -> Result<(), ClientError> {
        self.validate_local_workers()?;
        self.validate_cross_trainer_cache()?;
        self.validate_coordinated()
    }

    /// A coordinated read serves rounds for ever: a dataset known to be finite is refused up
    /// front (tf.data refuses it when the worker creates the task, before any element); one of
    /// unknown cardinality is read until it ends, which fails the round-robin read then.
    fn validate_coordinated(&self) -> Result<(), ClientError> {
        if self.num_consumers.is_none() || self.cardinality < 0 {
            return Ok(());
        }
        Err(ClientError::FailedPrecondition(format!(
            "Round robin reads require that the input dataset has infinite cardinality, but the \
             dataset has cardinality {}. Consider adding a `.repeat()` transformation to the \
             dataset.",
            self.cardinality
        )))
    }

    fn validate_local_workers(&self) -> Result<(), ClientError> {
        // A worker in this process makes it a colocated deployment, where each worker's static
        // shard is its own trainer's: reading the others' would read them twice.
        if self.mode.is_static()
            && self.target_workers == TargetWorkers::Any
            && !LocalWorkers::global().is_empty()
        {
            return Err(ClientError::InvalidArgument(format!(
                "Static sharding requires reading from local workers, but `target_workers` is \
                 \"ANY\": this process runs a tf.data service worker, whose shard of the \
                 <{}> policy is this trainer's, and the other workers' shards are their own \
                 trainers'. Read with `target_workers` \"AUTO\" or \"LOCAL\".",
                self.mode
            )));
        }
        if self.target_workers != TargetWorkers::Local {
            return Ok(());
        }
        if LocalWorkers::global().is_empty() {
            let message = if self.mode.is_static() {
                format!(
                    "Static sharding policy <{}> requires local tf.data workers, but no local \
                     worker is found. You need to run local tf.data service workers in your \
                     training workers. Static sharding also requires a fixed worker pool and a \
                     list of worker addresses in the DispatcherConfig. See the \"Processing \
                     Modes\" section in the module doc for details.",
                    self.mode
                )
            } else {
                "Local reads require local tf.data workers, but no local worker is found. You \
                 need to run local tf.data service workers in your training workers."
                    .to_string()
            };
            return Err(ClientError::InvalidArgument(message));
        }
        if self.num_consumers.is_some() {
            return Err(ClientError::InvalidArgument(
                "Coordinated reads require non-local workers, but `target_workers` is \"LOCAL\"."
                    .into(),
            ));
        }
        Ok(())
    }

    fn validate_cross_trainer_cache(&self) -> Result<(), ClientError> {
        if !self.cross_trainer_cache {
            return Ok(());
        }
        if self.job_name.is_none_or(str::is_empty) {
            return Err(ClientError::InvalidArgument(
                "Cross-trainer caching requires named jobs. Got empty `job_name`.".into(),
            ));
        }
        // Unknown cardinality passes, as in tf.data: only a known finite input is refused.
        if self.cardinality >= 0 {
            return Err(ClientError::InvalidArgument(format!(
                "Cross-trainer caching requires the input dataset to be infinite. Got input with \
                 cardinality {}",
                self.cardinality
            )));
        }
        // tf.data's check is `> 1`: a dataset object's first two epochs pass.
        if self.repetition > 1 {
            return Err(ClientError::InvalidArgument(format!(
                "Cross-trainer caching requires infinite datasets and disallows multiple \
                 repetitions of the same dataset. Got repetition {}",
                self.repetition
            )));
        }
        if let Some(n) = self.num_consumers {
            return Err(ClientError::InvalidArgument(format!(
                "Cross-trainer caching does not support coordinated reads. Got number of \
                 coordinated consumers: {n}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_pipeline::INFINITE;

    fn cache_params() -> ReadParams<'static> {
        ReadParams {
            mode: ShardingPolicy::Off,
            job_name: Some("job"),
            num_consumers: None,
            cross_trainer_cache: true,
            target_workers: TargetWorkers::Auto,
            cardinality: INFINITE,
            repetition: 0,
        }
    }

    fn message(params: ReadParams<'_>) -> Option<String> {
        match params.validate() {
            Ok(()) => None,
            Err(ClientError::InvalidArgument(m)) => Some(m),
            Err(other) => panic!("not an InvalidArgument: {other:?}"),
        }
    }

    #[test]
    fn cross_trainer_cache_checks_in_tf_data_order() {
        let cases: Vec<(ReadParams<'static>, Option<&str>)> = vec![
            (cache_params(), None),
            (ReadParams { repetition: 1, ..cache_params() }, None),
            (ReadParams { cardinality: sluice_pipeline::UNKNOWN, ..cache_params() }, None),
            (
                ReadParams { job_name: None, cardinality: 10, ..cache_params() },
                Some("Cross-trainer caching requires named jobs. Got empty `job_name`."),
            ),
            (
                ReadParams { cardinality: 10, repetition: 5, ..cache_params() },
                Some("Cross-trainer caching requires the input dataset to be infinite. Got input with cardinality 10"),
            ),
            (
                ReadParams { cardinality: 0, ..cache_params() },
                Some("Cross-trainer caching requires the input dataset to be infinite. Got input with cardinality 0"),
            ),
            (
                ReadParams { repetition: 2, num_consumers: Some(2), ..cache_params() },
                Some("Cross-trainer caching requires infinite datasets and disallows multiple repetitions of the same dataset. Got repetition 2"),
            ),
            (
                ReadParams { num_consumers: Some(2), ..cache_params() },
                Some("Cross-trainer caching does not support coordinated reads. Got number of coordinated consumers: 2"),
            ),
            (
                ReadParams { cross_trainer_cache: false, cardinality: 10, job_name: None, ..cache_params() },
                None,
            ),
        ];
        for (params, expected) in cases {
            assert_eq!(message(params).as_deref(), expected);
        }
    }

    #[test]
    fn local_reads_without_a_local_worker_are_refused() {
        // No worker runs in a unit-test process of this crate: the global registry is empty.
        let local = |mode| ReadParams {
            mode,
            cross_trainer_cache: false,
            target_workers: TargetWorkers::Local,
            ..cache_params()
        };
        assert_eq!(
            message(local(ShardingPolicy::Dynamic)).as_deref(),
            Some(
                "Local reads require local tf.data workers, but no local worker is found. You \
                 need to run local tf.data service workers in your training workers."
            )
        );
        assert_eq!(
            message(local(ShardingPolicy::FileOrData)).as_deref(),
            Some(
                "Static sharding policy <FILE_OR_DATA> requires local tf.data workers, but no \
                 local worker is found. You need to run local tf.data service workers in your \
                 training workers. Static sharding also requires a fixed worker pool and a list \
                 of worker addresses in the DispatcherConfig. See the \"Processing Modes\" \
                 section in the module doc for details."
            )
        );
    }

    #[test]
    fn a_coordinated_read_of_a_dataset_known_to_be_finite_is_refused_up_front() {
        for (cardinality, refused) in [
            (INFINITE, false),
            (sluice_pipeline::UNKNOWN, false),
            (0, true),
            (3, true),
        ] {
            let params = ReadParams {
                cross_trainer_cache: false,
                num_consumers: Some(2),
                cardinality,
                ..cache_params()
            };
            match params.validate() {
                Ok(()) => assert!(!refused, "{cardinality}"),
                Err(ClientError::FailedPrecondition(m)) => {
                    assert!(refused, "{cardinality}: {m}");
                    assert!(m.contains(&format!("but the dataset has cardinality {cardinality}.")));
                }
                Err(other) => panic!("{cardinality}: {other:?}"),
            }
        }
        let uncoordinated = ReadParams {
            cross_trainer_cache: false,
            cardinality: 3,
            ..cache_params()
        };
        assert!(uncoordinated.validate().is_ok());
    }
}
