//! `DistributedIterator`: one epoch of a `DistributedDataset`, step by step.
//!
//! A step takes one value per local replica. With rebatching, every input element is cut into
//! `num_input_pipelines * local replicas` pieces (`rebatch.rs`) and the pieces are handed out
//! in order, `local replicas` per step; a step whose pieces are all empty (what is left of a
//! short final batch) is skipped. Without rebatching (`distribute_datasets_from_function`)
//! each element is one replica's value. Either way, at the end of the input a step is given
//! as long as one replica has data, the others getting an empty batch of the same structure,
//! dtypes and inner shape (tf's dummy batches), and then the epoch ends.
//!
//! A local input runs on a thread of its own that feeds a small channel, so the async methods
//! never block the runtime; dropping the iterator stops it at its next element.

use super::per_replica::PerReplica;
use super::rebatch::{empty_like, is_empty_batch, Rebatch};
use crate::element_stream::ElementStream;
use crate::error::ClientError;
use crate::reader_state::ReaderState;
use sluice_element::{DatasetError, Element, ElementIter};
use std::collections::VecDeque;

/// How input elements become replica values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Steps {
    /// Each element is a global batch, cut by the plan.
    Rebatch(Rebatch),
    /// Each element is one replica's value.
    Whole,
}

/// Where elements come from.
pub(crate) enum Feed {
    Local(flume::Receiver<Result<Element, DatasetError>>),
    Service(Box<ElementStream>),
}

/// Elements a local pipeline may run ahead of the caller.
const LOCAL_AHEAD: usize = 2;

impl Feed {
    /// Runs `elements` on a thread of its own.
    pub(crate) fn local(mut elements: ElementIter) -> Result<Feed, ClientError> {
        let (tx, rx) = flume::bounded(LOCAL_AHEAD);
        std::thread::Builder::new()
            .name("sluice-distributed-input".into())
            .spawn(move || {
                for item in elements.by_ref() {
                    if tx.send(item).is_err() {
                        return; // the iterator was dropped
                    }
                }
            })
            .map_err(|e| {
                ClientError::FailedPrecondition(format!("spawn the input pipeline thread: {e}"))
            })?;
        Ok(Feed::Local(rx))
    }

    async fn next(&mut self) -> Option<Result<Element, ClientError>> {
        match self {
            Feed::Local(rx) => rx.recv_async().await.ok().map(|r| r.map_err(Into::into)),
            Feed::Service(stream) => stream.next().await,
        }
    }
}

/// The steps of one epoch.
pub struct DistributedIterator {
    feed: Feed,
    steps: Steps,
    local_replicas: usize,
    /// Replica values not yet handed out, in order.
    pending: VecDeque<Element>,
    /// The input has ended (or failed): no more elements will be read.
    exhausted: bool,
}

impl DistributedIterator {
    pub(crate) fn new(feed: Feed, steps: Steps, local_replicas: usize) -> DistributedIterator {
        DistributedIterator {
            feed,
            steps,
            local_replicas: local_replicas.max(1),
            pending: VecDeque::new(),
            exhausted: false,
        }
    }

    /// The next step, or `None` at the end of the epoch (tf's `get_next_as_optional`). An
    /// error of the input ends the epoch.
    pub async fn get_next_as_optional(&mut self) -> Result<Option<PerReplica>, ClientError> {
        loop {
            if self.pending.len() >= self.local_replicas {
                let values: Vec<Element> = self.pending.drain(..self.local_replicas).collect();
                if matches!(self.steps, Steps::Rebatch(_)) && values.iter().all(is_empty_batch) {
                    continue;
                }
                return Ok(Some(PerReplica::new(values)));
            }
            if self.exhausted {
                return self.last_step();
            }
            match self.feed.next().await {
                Some(Ok(element)) => match &self.steps {
                    Steps::Rebatch(plan) => match plan.split(&element) {
                        Ok(pieces) => self.pending.extend(pieces),
                        Err(e) => return Err(self.fail(e)),
                    },
                    Steps::Whole => self.pending.push_back(element),
                },
                Some(Err(e)) => return Err(self.fail(e)),
                None => self.exhausted = true,
            }
        }
    }

    /// The next step; at the end of the epoch tf's `OutOfRangeError` ("End of sequence").
    pub async fn get_next(&mut self) -> Result<PerReplica, ClientError> {
        self.get_next_as_optional()
            .await?
            .ok_or_else(|| ClientError::OutOfRange("End of sequence".into()))
    }

    /// The next step as an iterator item: `None` at the end of the epoch.
    pub async fn next(&mut self) -> Option<Result<PerReplica, ClientError>> {
        self.get_next_as_optional().await.transpose()
    }

    /// Reads the rest of the epoch.
    pub async fn collect(mut self) -> Result<Vec<PerReplica>, ClientError> {
        let mut out = Vec::new();
        while let Some(step) = self.get_next_as_optional().await? {
            out.push(step);
        }
        Ok(out)
    }

    /// The reader's state after the steps handed out so far (see [`ReaderState`]): the input's
    /// state, which counts whole input elements, so it is taken only where no replica value cut
    /// from an input element read is still waiting for a step (with rebatching over W input
    /// pipelines, an input element makes W steps: take states every W steps). Needs an input
    /// read through the service whose state can be taken (see [`ElementStream::state`]).
    pub async fn state(&mut self) -> Result<ReaderState, ClientError> {
        let Feed::Service(stream) = &mut self.feed else {
            return Err(ClientError::FailedPrecondition(
                "a distributed dataset over a local pipeline takes no state: read it through \
                 the service (`distribute` with a `job_name`) to take states"
                    .into(),
            ));
        };
        let waiting = match &self.steps {
            // Empty pieces are skipped, never handed out: they do not count.
            Steps::Rebatch(_) => self.pending.iter().filter(|v| !is_empty_batch(v)).count(),
            Steps::Whole => self.pending.len(),
        };
        if waiting > 0 {
            return Err(ClientError::FailedPrecondition(format!(
                "{waiting} replica values cut from an input element already read are still to \
                 be handed out, and a state counts whole input elements: take it after the \
                 last step of an input element (with rebatching over W input pipelines, every \
                 W steps)"
            )));
        }
        stream.state().await
    }

    /// After the input ended: the replicas that still have a value get it, the others an
    /// empty batch like it; then nothing.
    fn last_step(&mut self) -> Result<Option<PerReplica>, ClientError> {
        let mut values: Vec<Element> = self.pending.drain(..).collect();
        let Some(first) = values.first() else {
            return Ok(None);
        };
        if values.iter().all(is_empty_batch) {
            return Ok(None);
        }
        let empty = empty_like(first)?;
        values.resize(self.local_replicas, empty);
        Ok(Some(PerReplica::new(values)))
    }

    fn fail(&mut self, e: ClientError) -> ClientError {
        self.exhausted = true;
        self.pending.clear();
        e
    }
}
