//! Users' Python functions in a pipeline: the stage that runs a definition's `PyFunctionOp` with
//! a `PythonRunner` (the traits are `sluice-element`'s, so a runner needs nothing else).
//!
//! This crate never runs Python itself. A pipeline with a Python op is executed with a runner in
//! `ExecOptions::python`: a worker's pool of executor processes (`sluice-pyexec`), or the
//! reader's own interpreter (the Python package, for ops after `distribute` and local
//! iteration). Without one, building the pipeline fails with `DatasetError::PythonRuntime`.
//!
//! A call's outputs are a list: one element for a map, none or one for a filter (the runner
//! applies the predicate and returns the element it keeps), any number for a flat_map. So one
//! ordered, parallel stage runs all three kinds.
//!
//! Batches: the stage hands its inputs to the function in batches of the size the function
//! asks for (`PythonFunction::batch_size`, 1 unless a runner measures its calls as cheap), and
//! keeps `in_flight` batches outstanding (so `num_parallel_calls` counts batches). The inputs
//! in flight are reserved on the task's memory budget; the order of outputs, and each error in
//! its input's place, are as with calls one by one.

use std::collections::VecDeque;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use sluice_element::{
    pb, CallResult, Cancellation, DatasetError, Element, ElementIter, PythonFunction, PythonRunner,
    Tensor,
};
use sluice_pipeline::python_op;

use crate::memory_budget::{element_bytes, MemoryShare, Reservation};

/// The most calls of one Python op kept in flight, whatever `num_parallel_calls` asks and
/// whatever the batches' size.
const MAX_IN_FLIGHT: usize = 1024;

/// Readies `op` with the runner in `runner`, refusing it when there is none.
pub(crate) fn prepare(
    op: &pb::PyFunctionOp,
    runner: Option<&Arc<dyn PythonRunner>>,
) -> Result<PythonStage, DatasetError> {
    python_op::check(op)?;
    let runner = runner.ok_or_else(|| {
        DatasetError::PythonRuntime(format!(
            "python function '{}' cannot run here: this process has no Python executors (start \
             the worker with `sluice worker --python PATH`, or from Python with WorkerServer)",
            op.name
        ))
    })?;
    let function = runner.prepare(op)?;
    // Capped: each call in flight holds an element, and the count is the user's.
    let in_flight = match op.num_parallel_calls {
        0 => function.parallelism().max(1) * 2,
        n => n as usize,
    }
    .min(MAX_IN_FLIGHT);
    Ok(PythonStage {
        function,
        in_flight,
        name: op.name.clone(),
        ends_on_drop: op.kind == pb::PyFunctionKind::TakeWhile as i32,
        generator: op.kind == pb::PyFunctionKind::Generator as i32,
    })
}

/// A prepared Python op as a pipeline stage.
#[derive(Clone)]
pub(crate) struct PythonStage {
    function: Arc<dyn PythonFunction>,
    /// How many calls (batches) are kept in flight.
    in_flight: usize,
    name: String,
    /// take_while: the first element the predicate drops ends the stage.
    ends_on_drop: bool,
    /// from_generator: each input element starts a run of the generator, read in chunks.
    generator: bool,
}

/// The first chunk a generator run is asked for; each next one doubles, up to the most.
const FIRST_CHUNK: i64 = 16;
const MOST_CHUNK: i64 = 1024;

impl PythonStage {
    /// The outputs of one call, waited for (an interleave's inner dataset).
    pub(crate) fn call_outputs(&self, input: Element) -> Result<ElementIter, DatasetError> {
        Ok(Box::new(self.call_one(input)?.into_iter().map(Ok)))
    }

    /// The outputs of one call, waited for.
    pub(crate) fn call_one(&self, input: Element) -> Result<Vec<Element>, DatasetError> {
        match self.function.call(input).recv() {
            Ok(result) => result,
            Err(_) => Err(self.went_away()),
        }
    }

    fn went_away(&self) -> DatasetError {
        DatasetError::PythonRuntime(format!(
            "python function '{}': its executor went away without a result",
            self.name
        ))
    }

    pub(crate) fn apply(
        &self,
        input: ElementIter,
        memory: &Option<Arc<MemoryShare>>,
        cancel: Cancellation,
    ) -> ElementIter {
        if self.generator {
            return Box::new(GeneratorRuns {
                input,
                stage: self.clone(),
                run: None,
                cancel,
            });
        }
        Box::new(OrderedCalls {
            input: Some(input),
            stage: self.clone(),
            pending: VecDeque::new(),
            ready: Vec::new().into_iter(),
            unsent: None,
            reservation: Reservation::new(memory.clone(), "python function"),
            cancel,
        })
    }
}

/// Calls the function on upstream elements in batches, with up to `in_flight` batches
/// outstanding, and yields their outputs in upstream order. An upstream error is yielded in its
/// place, after the outputs of the calls started before it.
struct OrderedCalls {
    input: Option<ElementIter>,
    stage: PythonStage,
    /// One entry per input in flight (or upstream error), in upstream order.
    pending: VecDeque<Pending>,
    ready: std::vec::IntoIter<Element>,
    /// An input taken from upstream and not yet sent: the memory budget had no room for it.
    unsent: Option<Element>,
    /// The inputs in flight, on the task's memory budget.
    reservation: Reservation,
    /// Checked before each call is awaited: a Python filter that drops everything loops here.
    cancel: Cancellation,
}

enum Pending {
    /// A call and the bytes its input holds on the reservation.
    Call(Receiver<CallResult>, u64),
    Failed(DatasetError),
}

impl OrderedCalls {
    /// Starts batches while fewer than `in_flight` batches' inputs are outstanding. A batch
    /// starts only when a whole one fits (or nothing is in flight), so inputs go in the
    /// function's size rather than one at a time as outputs are taken. An input the memory
    /// budget has no room for waits in `unsent` for the calls in flight to end; with none in
    /// flight, the budget's error is yielded in its place.
    fn fill(&mut self) {
        loop {
            if self.input.is_none() && self.unsent.is_none() {
                return;
            }
            let batch = self.stage.function.batch_size().clamp(1, MAX_IN_FLIGHT);
            let most = self
                .stage
                .in_flight
                .saturating_mul(batch)
                .min(MAX_IN_FLIGHT);
            let room = most.saturating_sub(self.pending.len());
            if room < batch && !self.pending.is_empty() {
                return;
            }
            let want = batch.min(room).max(1);
            let mut inputs = Vec::with_capacity(want);
            let mut bytes = Vec::with_capacity(want);
            let mut failed = None;
            let mut full = false;
            while inputs.len() < want {
                let next = match self.unsent.take() {
                    Some(e) => Some(Ok(e)),
                    None => self.input.as_mut().and_then(Iterator::next),
                };
                match next {
                    None => {
                        self.input = None;
                        break;
                    }
                    Some(Ok(e)) => {
                        let size = element_bytes(&e);
                        match self.reservation.grow(size) {
                            Ok(()) => {
                                bytes.push(size);
                                inputs.push(e);
                            }
                            Err(err) if self.pending.is_empty() && inputs.is_empty() => {
                                failed = Some(err);
                                break;
                            }
                            Err(_) => {
                                self.unsent = Some(e);
                                full = true;
                                break;
                            }
                        }
                    }
                    Some(Err(err)) => {
                        failed = Some(err);
                        break;
                    }
                }
            }
            let short = inputs.len() < want;
            if !inputs.is_empty() {
                let calls = self.stage.function.call_batch(inputs);
                self.pending.extend(
                    calls
                        .into_iter()
                        .zip(bytes)
                        .map(|(rx, held)| Pending::Call(rx, held)),
                );
            }
            if let Some(err) = failed {
                self.pending.push_back(Pending::Failed(err));
                // Stop reading ahead past an error: what follows it is produced only if the
                // consumer goes on.
                return;
            }
            if short || full {
                return;
            }
        }
    }
}

impl Iterator for OrderedCalls {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(e) = self.ready.next() {
                return Some(Ok(e));
            }
            if let Err(e) = self.cancel.check() {
                return Some(Err(e));
            }
            self.fill();
            match self.pending.pop_front()? {
                Pending::Failed(err) => return Some(Err(err)),
                Pending::Call(rx, held) => {
                    let result = rx.recv();
                    self.reservation.shrink(held);
                    match result {
                        Ok(Ok(outputs)) if outputs.is_empty() && self.stage.ends_on_drop => {
                            // take_while: nothing after the first dropped element is yielded;
                            // the calls started past it are abandoned.
                            self.input = None;
                            self.unsent = None;
                            self.pending.clear();
                            self.reservation.clear();
                            return None;
                        }
                        Ok(Ok(outputs)) => self.ready = outputs.into_iter(),
                        Ok(Err(err)) => return Some(Err(err)),
                        Err(_) => return Some(Err(self.stage.went_away())),
                    }
                }
            }
        }
    }
}

/// from_generator: each input element starts a run of the generator, whose elements are asked
/// for in chunks of growing size, one call at a time: `(token, start, count)` in, the run's
/// elements `start..start + count` out, fewer at its end. The token names the run, so an
/// executor that holds it goes on where it stopped (another one starts the generator again
/// and skips to `start`).
struct GeneratorRuns {
    input: ElementIter,
    stage: PythonStage,
    run: Option<Run>,
    cancel: Cancellation,
}

struct Run {
    token: i64,
    next: i64,
    chunk: i64,
    ready: std::vec::IntoIter<Element>,
    ended: bool,
}

impl Iterator for GeneratorRuns {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Err(e) = self.cancel.check() {
                return Some(Err(e));
            }
            let Some(run) = self.run.as_mut() else {
                match self.input.next()? {
                    Ok(_) => {
                        self.run = Some(Run {
                            token: rand::random::<i64>(),
                            next: 0,
                            chunk: FIRST_CHUNK,
                            ready: Vec::new().into_iter(),
                            ended: false,
                        });
                        continue;
                    }
                    Err(err) => return Some(Err(err)),
                }
            };
            if let Some(e) = run.ready.next() {
                return Some(Ok(e));
            }
            if run.ended {
                self.run = None;
                continue;
            }
            let request = Element::Tuple(
                [run.token, run.next, run.chunk]
                    .into_iter()
                    .map(|v| Element::Tensor(Tensor::scalar_i64(v)))
                    .collect(),
            );
            let outputs = match self.stage.function.call(request).recv() {
                Ok(Ok(outputs)) => outputs,
                Ok(Err(err)) => {
                    self.run = None;
                    return Some(Err(err));
                }
                Err(_) => {
                    self.run = None;
                    return Some(Err(self.stage.went_away()));
                }
            };
            let got = i64::try_from(outputs.len()).unwrap_or(i64::MAX);
            run.ended = got < run.chunk;
            run.next = run.next.saturating_add(got);
            run.chunk = (run.chunk * 2).min(MOST_CHUNK);
            run.ready = outputs.into_iter();
        }
    }
}

#[cfg(test)]
#[path = "python_fn_tests.rs"]
mod tests;
