//! `DistributeConfig`: where an input pipeline sits in a tf.distribute-style training cluster
//! (the facts a tf `Strategy` knows) and how a dataset is auto-sharded between pipelines (the
//! `auto_shard_policy` of tf.data's `Options.experimental_distribute`).

use super::input_context::InputContext;
use crate::error::ClientError;
use sluice_pipeline::AutoShardPolicy;

/// The replicas and input pipelines of a training job, seen from one pipeline.
///
/// `num_replicas_in_sync` replicas train in sync, fed by `num_input_pipelines` pipelines (tf:
/// one per worker), each feeding `num_replicas_in_sync / num_input_pipelines` local replicas.
/// This process runs pipeline `input_pipeline_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributeConfig {
    pub num_replicas_in_sync: usize,
    pub num_input_pipelines: usize,
    pub input_pipeline_id: usize,
    /// How `DistributedDataset::new` shards the dataset between pipelines when there are
    /// several (ignored with one, as tf does). Default `Auto`: by file, else by element.
    pub auto_shard_policy: AutoShardPolicy,
}

impl Default for DistributeConfig {
    fn default() -> Self {
        DistributeConfig {
            num_replicas_in_sync: 1,
            num_input_pipelines: 1,
            input_pipeline_id: 0,
            auto_shard_policy: AutoShardPolicy::Auto,
        }
    }
}

impl DistributeConfig {
    /// `replicas` replicas fed by this one pipeline (tf's single-worker `MirroredStrategy`).
    pub fn replicas(replicas: usize) -> DistributeConfig {
        DistributeConfig {
            num_replicas_in_sync: replicas,
            ..DistributeConfig::default()
        }
    }

    /// Checks the numbers; the uneven split of replicas between pipelines is tf's error text.
    pub fn validate(&self) -> Result<(), ClientError> {
        if self.num_replicas_in_sync == 0 {
            return Err(ClientError::InvalidArgument(
                "`num_replicas_in_sync` must be positive, got 0".into(),
            ));
        }
        if self.num_input_pipelines == 0 {
            return Err(ClientError::InvalidArgument(
                "`num_input_pipelines` must be positive, got 0".into(),
            ));
        }
        if self.input_pipeline_id >= self.num_input_pipelines {
            return Err(ClientError::InvalidArgument(format!(
                "`input_pipeline_id` {} must be less than `num_input_pipelines` {}",
                self.input_pipeline_id, self.num_input_pipelines
            )));
        }
        if !self
            .num_replicas_in_sync
            .is_multiple_of(self.num_input_pipelines)
        {
            return Err(ClientError::InvalidArgument(format!(
                "tf.distribute expects every worker to have the same number of replicas. \
                 However, encountered `num_replicas_in_sync` ({}) that cannot be divided by \
                 `num_workers` ({})",
                self.num_replicas_in_sync, self.num_input_pipelines
            )));
        }
        Ok(())
    }

    /// The replicas this pipeline feeds.
    pub fn num_local_replicas(&self) -> usize {
        self.num_replicas_in_sync / self.num_input_pipelines.max(1)
    }

    /// What an input function of this pipeline is told.
    pub fn input_context(&self) -> InputContext {
        InputContext::new(
            self.num_input_pipelines,
            self.input_pipeline_id,
            self.num_replicas_in_sync,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let config = |replicas, pipelines, id| DistributeConfig {
            num_replicas_in_sync: replicas,
            num_input_pipelines: pipelines,
            input_pipeline_id: id,
            ..DistributeConfig::default()
        };
        assert!(config(4, 2, 1).validate().is_ok());
        assert_eq!(config(4, 2, 1).num_local_replicas(), 2);
        assert_eq!(config(4, 2, 1).input_context(), InputContext::new(2, 1, 4));
        for (c, want) in [
            (
                config(0, 1, 0),
                "`num_replicas_in_sync` must be positive, got 0",
            ),
            (
                config(1, 0, 0),
                "`num_input_pipelines` must be positive, got 0",
            ),
            (
                config(2, 2, 2),
                "`input_pipeline_id` 2 must be less than `num_input_pipelines` 2",
            ),
            (
                config(3, 2, 0),
                "tf.distribute expects every worker to have the same number of replicas. \
                 However, encountered `num_replicas_in_sync` (3) that cannot be divided by \
                 `num_workers` (2)",
            ),
        ] {
            assert_eq!(c.validate().unwrap_err().to_string(), want);
        }
    }
}
