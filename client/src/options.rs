//! The options of `distribute` / `from_dataset_id` / `register_dataset`, with tf.data's names,
//! defaults and validation messages, and which tasks a reader's `target_workers` reads (the
//! enums themselves are `sluice_rpc`'s, shared with the dispatcher).

use crate::error::ClientError;
use rand::Rng;
use sluice_element::Compression;
use sluice_proto::dispatcher as pb;
use sluice_types::{Delivery, ShardingPolicy, TargetWorkers};
use std::time::Duration;

/// Whether a reader that is not coordinated reads `task` (tf.data's `ShouldReadFromTask`;
/// coordinated readers read every task). `local`: the task's worker runs in this process.
/// `AUTO` avoids reading another host's colocated worker, which serves its own trainer.
pub(crate) fn reads_task(target: TargetWorkers, task: &pb::TaskInfo, local: bool) -> bool {
    match target {
        TargetWorkers::Any => true,
        TargetWorkers::Local => local,
        TargetWorkers::Auto => local || !is_colocated(task),
    }
}

/// The workers a reader of a `mode` job reads when it asked for `target`. Under a static
/// sharding policy, a process that runs a worker beside its trainer reads only its own workers
/// with `AUTO`: each worker's shard belongs to the trainer beside it, as in tf.data's colocated
/// deployments. Without a worker in the process, `AUTO` keeps its usual meaning.
pub(crate) fn effective_target_workers(
    mode: ShardingPolicy,
    target: TargetWorkers,
    has_local_worker: bool,
) -> TargetWorkers {
    match target {
        TargetWorkers::Auto if mode.is_static() && has_local_worker => TargetWorkers::Local,
        other => other,
    }
}

/// Whether a reader that is not coordinated, going away, deletes `task` from its in-process
/// worker (tf.data's `ShouldDeleteLocalTask`): with `LOCAL`, or with `AUTO` for a colocated
/// worker's task, nobody else reads it.
pub(crate) fn deletes_task_when_done(target: TargetWorkers, task: &pb::TaskInfo) -> bool {
    match target {
        TargetWorkers::Local => true,
        TargetWorkers::Auto => is_colocated(task),
        TargetWorkers::Any => false,
    }
}

/// The worker runs beside a trainer (tag `COLOCATED`, any case).
fn is_colocated(task: &pb::TaskInfo) -> bool {
    task.worker_tags
        .iter()
        .any(|tag| tag.eq_ignore_ascii_case("COLOCATED"))
}

/// Cross-trainer cache: trainers reading the same named job share the elements its workers
/// produce, each trainer with its own position in a sliding window per task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrossTrainerCache {
    pub trainer_id: String,
}

impl CrossTrainerCache {
    pub fn new(trainer_id: impl Into<String>) -> Self {
        CrossTrainerCache {
            trainer_id: trainer_id.into(),
        }
    }
}

/// Options of `register_dataset`.
#[derive(Clone, Debug, Default)]
pub struct RegisterOptions {
    pub compression: Compression,
    /// An explicit id; re-registering the same id with the same dataset returns it.
    pub dataset_id: Option<String>,
}

/// Options of `distribute` and `from_dataset_id`.
#[derive(Clone, Debug)]
pub struct DistributeOptions {
    /// Consumers with the same job name share one job and split its data.
    pub job_name: Option<String>,
    /// Coordinated reads: this consumer's index in `0..num_consumers`.
    pub consumer_index: Option<u32>,
    /// Coordinated reads: how many consumers read the job in lockstep rounds (needs a job name
    /// and an infinite dataset).
    pub num_consumers: Option<u32>,
    /// Share elements between trainers reading the same named job.
    pub cross_trainer_cache: Option<CrossTrainerCache>,
    pub target_workers: TargetWorkers,
    /// Elements requested or buffered at most (memory ≤ element size × this); `None` autotunes.
    pub max_outstanding_requests: Option<u32>,
    /// Compression, when `distribute` registers the dataset.
    pub compression: Compression,
    /// How long a client heartbeat may wait for news (long poll). News (new tasks, the end of
    /// the iteration) ends the wait at once, so this bounds no delay; it sets how often an idle
    /// reader calls the dispatcher. Each heartbeat waits a time drawn below this
    /// ([`HeartbeatWaits`]). At most 10 s, and half the dispatcher's client timeout.
    pub heartbeat_poll: Duration,
    /// Exactly once (the default; for distributed_epoch and the static sharding policies) or
    /// tf.data's at most once: see [`Delivery`].
    pub delivery: Delivery,
}

impl Default for DistributeOptions {
    fn default() -> Self {
        DistributeOptions {
            job_name: None,
            consumer_index: None,
            num_consumers: None,
            cross_trainer_cache: None,
            target_workers: TargetWorkers::Auto,
            max_outstanding_requests: None,
            compression: Compression::Auto,
            heartbeat_poll: HEARTBEAT_POLL,
            delivery: Delivery::ExactlyOnce,
        }
    }
}

/// The default long poll of a client's heartbeats.
pub const HEARTBEAT_POLL: Duration = Duration::from_secs(10);

/// How long each heartbeat of one reader waits for news, when its heartbeats may wait `poll`:
/// the first between none and all of it, each later one between three quarters and all of it.
/// The readers of a job start together, and polls of one length would then end together, every
/// time: the dispatcher would answer thousands in the same instant, and the last of them late.
pub struct HeartbeatWaits {
    poll: Duration,
    drawn: bool,
}

impl HeartbeatWaits {
    pub fn new(poll: Duration) -> Self {
        HeartbeatWaits { poll, drawn: false }
    }

    /// The wait of a heartbeat that may wait `poll`.
    pub(crate) fn wait(&mut self, poll: Poll) -> Duration {
        match poll {
            Poll::Now => Duration::ZERO,
            Poll::Drawn => self.draw(),
        }
    }

    /// The next heartbeat's wait.
    pub fn draw(&mut self) -> Duration {
        let least = if self.drawn { 0.75 } else { 0.0 };
        self.drawn = true;
        self.poll.mul_f64(rand::rng().random_range(least..=1.0))
    }
}

/// How long a heartbeat may wait for news.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Poll {
    /// Not at all (the first heartbeat: the reader has no task yet).
    Now,
    /// The reader's next drawn wait ([`HeartbeatWaits`]).
    Drawn,
}

/// Elements in flight or buffered when `max_outstanding_requests` is not set, at most (the
/// window grows to it: see `read_ahead`).
pub(crate) const AUTOTUNE_OUTSTANDING: u32 = 256;

impl DistributeOptions {
    pub fn validate(&self) -> Result<(), ClientError> {
        if let Some(name) = &self.job_name {
            if name.is_empty() {
                return Err(ClientError::InvalidArgument(
                    "`job_name` must not be empty".into(),
                ));
            }
        }
        if let Some(n) = self.num_consumers {
            if self.job_name.is_none() {
                return Err(ClientError::InvalidArgument(format!(
                    "`job_name` must be set when setting `num_consumers`. num_consumers was set \
                     to {n}."
                )));
            }
        }
        if self.consumer_index.is_some() != self.num_consumers.is_some() {
            return Err(ClientError::InvalidArgument(
                "Must either set both `consumer_index` and `num_consumers`, or neither.".into(),
            ));
        }
        if let Some(cache) = &self.cross_trainer_cache {
            if cache.trainer_id.is_empty() {
                return Err(ClientError::InvalidArgument(
                    "tf.data service cross-trainer cache requires a non-empty trainer ID.".into(),
                ));
            }
        }
        if self.max_outstanding_requests == Some(0) {
            return Err(ClientError::InvalidArgument(
                "max_outstanding_requests must be positive or -1".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn outstanding(&self) -> u32 {
        self.max_outstanding_requests
            .unwrap_or(AUTOTUNE_OUTSTANDING)
    }

    /// The read-ahead window of a reader: `max_outstanding_requests` as given, or (unset) one
    /// that starts small and grows to `AUTOTUNE_OUTSTANDING` while the caller starves.
    /// Coordinated reads keep the maximum: a round is read from every consumer at once.
    pub(crate) fn read_ahead(&self) -> crate::read_ahead::ReadAhead {
        use crate::read_ahead::{ReadAhead, INITIAL_AUTOTUNED};
        match self.max_outstanding_requests {
            Some(n) => ReadAhead::fixed(n),
            None if self.num_consumers.is_some() => ReadAhead::fixed(AUTOTUNE_OUTSTANDING),
            None => ReadAhead::growing(INITIAL_AUTOTUNED, AUTOTUNE_OUTSTANDING),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(tags: &[&str]) -> pb::TaskInfo {
        pb::TaskInfo {
            worker_tags: tags.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn target_workers_choose_tasks_as_tf_data_does() {
        use TargetWorkers::*;
        // (target, worker tags, worker in this process) -> (reads, deletes when done)
        let cases = [
            (Auto, vec![], false, (true, false)),
            (Auto, vec![], true, (true, false)),
            (Auto, vec!["COLOCATED"], false, (false, true)),
            (Auto, vec!["colocated"], false, (false, true)),
            (Auto, vec!["other", "Colocated"], true, (true, true)),
            (Any, vec!["COLOCATED"], false, (true, false)),
            (Any, vec![], true, (true, false)),
            (Local, vec![], false, (false, true)),
            (Local, vec!["COLOCATED"], true, (true, true)),
        ];
        for (target, tags, local, expected) in cases {
            let t = task(&tags);
            assert_eq!(
                (
                    reads_task(target, &t, local),
                    deletes_task_when_done(target, &t)
                ),
                expected,
                "{target} {tags:?} local={local}"
            );
        }
    }

    #[test]
    fn static_sharding_in_a_process_with_a_worker_reads_only_its_own_workers() {
        use ShardingPolicy::*;
        use TargetWorkers::*;
        // (mode, asked, worker in this process) -> read
        let cases = [
            (FileOrData, Auto, true, Local),
            (File, Auto, true, Local),
            (Data, Auto, true, Local),
            (Hint, Auto, true, Local),
            (FileOrData, Auto, false, Auto),
            (FileOrData, Any, true, Any),
            (FileOrData, Local, true, Local),
            (Off, Auto, true, Auto),
            (Dynamic, Auto, true, Auto),
        ];
        for (mode, asked, local, expected) in cases {
            assert_eq!(
                effective_target_workers(mode, asked, local),
                expected,
                "{mode} {asked} local={local}"
            );
        }
    }

    #[test]
    fn a_readers_first_wait_is_drawn_from_the_whole_poll_and_later_ones_from_its_last_quarter() {
        let poll = Duration::from_secs(10);
        // Over many readers: the first waits cover the poll (some under a quarter of it); each
        // later one is between three quarters and all of it.
        let mut firsts = Vec::new();
        for _ in 0..1000 {
            let mut waits = HeartbeatWaits::new(poll);
            firsts.push(waits.draw());
            for _ in 0..10 {
                let later = waits.draw();
                assert!(later >= poll * 3 / 4 && later <= poll, "{later:?}");
            }
        }
        assert!(firsts.iter().all(|w| *w <= poll));
        assert!(firsts.iter().any(|w| *w < poll / 4), "first waits spread");
        assert!(
            firsts.iter().any(|w| *w > poll * 3 / 4),
            "first waits spread"
        );
    }
}
