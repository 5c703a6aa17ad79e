//! `ReaderState`: where a reader stood in an exactly-once epoch, as `state_dict()` hands it to
//! the caller, and the bookkeeping behind it (`Taken`, `Checkpointing`).
//!
//! A state is small and plain (a handful of strings and numbers, the same whatever the epoch's
//! length): the job, the epoch (repetition), the *step* (how many elements the reader had taken
//! from the epoch) and the reader's name. What the elements taken were is in the dispatcher's
//! replicated state, as the job's checkpoint at that step: taking a state sends what the reader
//! handed out since its previous one. Restoring (`ServiceDataset::load_state`) joins the
//! iteration restored from that checkpoint: what the reader and every reader that took a state at
//! the same step had taken is not delivered again, and everything else is, once.

use crate::error::ClientError;
use serde::{Deserialize, Serialize};
use sluice_rpc::{DispatcherClient, TaskDelivery};
use sluice_types::{ClientId, IndexRuns, TaskId};
use std::collections::HashMap;

/// The format this client writes; a state of a newer one is refused.
pub const READER_STATE_FORMAT: u32 = 1;

/// A reader's position in an exactly-once epoch (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaderState {
    /// The state's format ([`READER_STATE_FORMAT`] when this client took it).
    pub format: u32,
    /// The content key (hex) of the dataset definition the job reads.
    pub dataset: String,
    /// The job's name, as the dispatcher knows it.
    pub job: String,
    /// The epoch (the job's repetition) the reader was in.
    pub epoch: u64,
    /// Elements the reader had taken from the epoch.
    pub step: u64,
    /// The reader that took it. Restoring from the same step, each reader joins one restored
    /// epoch; a name that joined it already restores it again (that reader was killed again).
    pub reader: String,
}

impl ReaderState {
    /// Checks that this client can restore `self` into job `job`.
    pub(crate) fn check(&self, job: Option<&str>) -> Result<(), ClientError> {
        if self.format > READER_STATE_FORMAT {
            return Err(ClientError::InvalidArgument(format!(
                "the reader state has format {}, newer than this client's {READER_STATE_FORMAT}: \
                 restore it with the Sluice release that took it, or a newer one",
                self.format
            )));
        }
        if self.format == 0 || self.reader.is_empty() || self.job.is_empty() {
            return Err(ClientError::InvalidArgument(
                "the reader state is incomplete: it needs a format, a job and a reader".into(),
            ));
        }
        match job {
            Some(job) if job == self.job => Ok(()),
            Some(job) => Err(ClientError::InvalidArgument(format!(
                "the reader state is of job '{}', and this dataset reads job '{job}'",
                self.job
            ))),
            None => Err(ClientError::InvalidArgument(format!(
                "the reader state is of job '{}', and this dataset reads no named job: pass \
                 the same `job_name`",
                self.job
            ))),
        }
    }
}

/// Indices the caller has taken, per task, since the reader's last state.
#[derive(Debug, Default)]
pub(crate) struct Taken(HashMap<u64, IndexRuns>);

impl Taken {
    pub(crate) fn add_runs(&mut self, task_id: u64, runs: &[(u64, u64)]) {
        let task = self.0.entry(task_id).or_default();
        for &(start, end) in runs {
            task.insert(start, end);
        }
    }

    /// Adds the first `count` indices of `runs`.
    pub(crate) fn add_prefix(&mut self, task_id: u64, runs: &[(u64, u64)], count: u64) {
        let task = self.0.entry(task_id).or_default();
        let mut left = count;
        for &(start, end) in runs {
            if left == 0 {
                break;
            }
            let n = (end - start).min(left);
            task.insert(start, start + n);
            left -= n;
        }
    }

    fn reports(&self) -> Vec<TaskDelivery> {
        self.0
            .iter()
            .filter(|(_, runs)| !runs.is_empty())
            .map(|(task_id, runs)| TaskDelivery {
                task_id: TaskId(*task_id),
                runs: runs.clone(),
                released: false,
            })
            .collect()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// What an epoch of a named exactly-once job needs to take states.
pub(crate) struct Checkpointing {
    pub client: DispatcherClient,
    pub client_id: ClientId,
    /// The step the epoch was restored at (0 for a fresh one).
    pub first_step: u64,
    /// The step of this reader's last state in this epoch.
    pub base_step: Option<u64>,
}

impl Checkpointing {
    /// Records the reader's state at `step`, having taken `taken` since its last one.
    pub(crate) async fn save(
        &mut self,
        step: u64,
        taken: &mut Taken,
    ) -> Result<ReaderState, ClientError> {
        let reader = self.client_id.0.to_string();
        let response = self
            .client
            .save_checkpoint(
                self.client_id,
                &reader,
                step,
                self.base_step,
                &taken.reports(),
            )
            .await?;
        taken.clear();
        self.base_step = Some(step);
        Ok(ReaderState {
            format: READER_STATE_FORMAT,
            dataset: response.dataset_definition,
            job: response.job_name,
            epoch: response.repetition,
            step,
            reader,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_takes_the_first_indices_of_the_runs() {
        // (runs, count) -> what is taken
        type Case = (&'static [(u64, u64)], u64, &'static [(u64, u64)]);
        let cases: &[Case] = &[
            (&[(0, 10)], 0, &[]),
            (&[(0, 10)], 4, &[(0, 4)]),
            (&[(0, 2), (5, 9)], 4, &[(0, 2), (5, 7)]),
            (&[(0, 2), (5, 9)], 100, &[(0, 2), (5, 9)]),
        ];
        for (runs, count, want) in cases {
            let mut taken = Taken::default();
            taken.add_prefix(3, runs, *count);
            let got: Vec<(u64, u64)> = taken
                .0
                .get(&3)
                .map(|r| r.iter().collect())
                .unwrap_or_default();
            assert_eq!(got, want.to_vec(), "{runs:?} {count}");
        }
    }

    #[test]
    fn a_state_of_another_job_or_a_newer_format_is_refused() {
        let state = ReaderState {
            format: READER_STATE_FORMAT,
            dataset: "ab".into(),
            job: "train".into(),
            epoch: 0,
            step: 10,
            reader: "3000".into(),
        };
        // (change, job) -> error text, or none
        type Case = (
            fn(&mut ReaderState),
            Option<&'static str>,
            Option<&'static str>,
        );
        let cases: &[Case] = &[
            (|_| {}, Some("train"), None),
            (
                |_| {},
                Some("eval"),
                Some("the reader state is of job 'train', and this dataset reads job 'eval'"),
            ),
            (|_| {}, None, Some("this dataset reads no named job")),
            (|s| s.format = 2, Some("train"), Some("has format 2, newer")),
            (|s| s.reader.clear(), Some("train"), Some("incomplete")),
        ];
        for (change, job, want) in cases {
            let mut s = state.clone();
            change(&mut s);
            match (s.check(*job), want) {
                (Ok(()), None) => {}
                (Err(e), Some(want)) => assert!(e.to_string().contains(want), "{e}"),
                (got, want) => panic!("{got:?}, wanted {want:?}"),
            }
        }
    }
}
