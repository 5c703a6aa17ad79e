//! The iterators of definitions that hold other definitions: `zip`, `concatenate`,
//! `sample_from_datasets` and `choose_from_datasets`, each over iterators (or factories) of its
//! nested datasets, built by `executor.rs`.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_element::{Cancellation, DatasetError, Element, ElementIter};

use super::Factory;

/// How zip puts its inputs' elements together.
#[derive(Clone, Debug)]
pub(crate) enum ZipShape {
    Tuple,
    /// The key of each input, in input order.
    Dict(Vec<String>),
}

/// tf.data's `zip`: one element of every input per element, ending with the shortest input.
/// An input's error is yielded as it is (the other inputs' elements of that step are dropped).
pub(crate) struct ZipIter {
    inputs: Vec<ElementIter>,
    shape: ZipShape,
    done: bool,
}

impl ZipIter {
    pub(crate) fn new(inputs: Vec<ElementIter>, shape: ZipShape) -> Self {
        ZipIter {
            inputs,
            shape,
            done: false,
        }
    }
}

impl Iterator for ZipIter {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut parts = Vec::with_capacity(self.inputs.len());
        for input in &mut self.inputs {
            match input.next() {
                Some(Ok(e)) => parts.push(e),
                Some(Err(e)) => return Some(Err(e)),
                None => {
                    self.done = true;
                    return None;
                }
            }
        }
        Some(Ok(match &self.shape {
            ZipShape::Tuple => Element::Tuple(parts),
            ZipShape::Dict(keys) => {
                Element::Dict(keys.iter().cloned().zip(parts).collect::<BTreeMap<_, _>>())
            }
        }))
    }
}

/// tf.data's `concatenate`: every element of `first`, then of a fresh iterator of `second`
/// (created only once `first` ends).
pub(crate) struct ConcatIter {
    first: Option<ElementIter>,
    second: Factory,
    current: Option<ElementIter>,
}

impl ConcatIter {
    pub(crate) fn new(first: ElementIter, second: Factory) -> Self {
        ConcatIter {
            first: Some(first),
            second,
            current: None,
        }
    }
}

impl Iterator for ConcatIter {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(first) = self.first.as_mut() {
            match first.next() {
                Some(item) => return Some(item),
                None => {
                    self.first = None;
                    match (self.second)() {
                        Ok(it) => self.current = Some(it),
                        Err(e) => return Some(Err(e)),
                    }
                }
            }
        }
        self.current.as_mut()?.next()
    }
}

/// How `MixIter` picks the input of its next element.
pub(crate) enum Picker {
    /// `sample_from_datasets`: at random, proportionally to the weights of the inputs not yet
    /// ended.
    Sample { rng: Box<StdRng>, weights: Vec<f64> },
    /// `choose_from_datasets`: the next int64 scalar of the choice dataset.
    Choose(ElementIter),
}

/// `sample_from_datasets` and `choose_from_datasets` (tf.data's directed interleave): each
/// element comes from the input the picker names. An input that ends is left out from then on,
/// or ends the whole dataset with `stop_on_empty`; with every input ended (or the choice
/// dataset ended) the dataset ends.
pub(crate) struct MixIter {
    inputs: Vec<Option<ElementIter>>,
    picker: Picker,
    stop_on_empty: bool,
    done: bool,
    cancel: Cancellation,
}

impl MixIter {
    pub(crate) fn new(
        inputs: Vec<ElementIter>,
        picker: Picker,
        stop_on_empty: bool,
        cancel: Cancellation,
    ) -> Self {
        MixIter {
            inputs: inputs.into_iter().map(Some).collect(),
            picker,
            stop_on_empty,
            done: false,
            cancel,
        }
    }

    /// A seeded sampler; equal weights when `weights` is empty.
    pub(crate) fn sampler(weights: &[f64], n: usize, seed: u64) -> Picker {
        let weights = if weights.is_empty() {
            vec![1.0; n]
        } else {
            weights.to_vec()
        };
        Picker::Sample {
            rng: Box::new(StdRng::seed_from_u64(seed)),
            weights,
        }
    }

    /// The next input to read: `Ok(None)` ends the dataset.
    fn pick(&mut self) -> Result<Option<usize>, DatasetError> {
        match &mut self.picker {
            Picker::Sample { rng, weights } => {
                let total: f64 = weights
                    .iter()
                    .zip(&self.inputs)
                    .filter(|(_, i)| i.is_some())
                    .map(|(w, _)| *w)
                    .sum();
                let live: Vec<usize> = (0..self.inputs.len())
                    .filter(|i| self.inputs[*i].is_some())
                    .collect();
                if live.is_empty() {
                    return Ok(None);
                }
                if total.is_nan() || total <= 0.0 {
                    // Only inputs of weight 0 are left: none can be drawn.
                    return Ok(None);
                }
                let mut x = rng.random::<f64>() * total;
                for &i in &live {
                    let w = weights[i];
                    if x < w {
                        return Ok(Some(i));
                    }
                    x -= w;
                }
                // Rounding: the last input of positive weight.
                Ok(live.iter().rev().copied().find(|i| weights[*i] > 0.0))
            }
            Picker::Choose(choice) => match choice.next() {
                None => Ok(None),
                Some(Err(e)) => Err(e),
                Some(Ok(e)) => {
                    let index = e.as_i64().ok_or_else(|| {
                        DatasetError::invalid(
                            "Invalid `choice_dataset`. Elements of `choice_dataset` must be \
                             scalar of type `tf.int64`.",
                        )
                    })?;
                    let n = self.inputs.len();
                    match usize::try_from(index) {
                        Ok(i) if i < n => Ok(Some(i)),
                        _ => Err(DatasetError::invalid(format!(
                            "choose_from_datasets: the choice dataset selected input {index}, \
                             out of range for {n} datasets"
                        ))),
                    }
                }
            },
        }
    }
}

impl Iterator for MixIter {
    type Item = Result<Element, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            if let Err(e) = self.cancel.check() {
                self.done = true;
                return Some(Err(e));
            }
            if self.inputs.iter().all(Option::is_none) {
                self.done = true;
                return None;
            }
            let i = match self.pick() {
                Ok(Some(i)) => i,
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            };
            // A choice of an input that already ended is skipped.
            let Some(input) = self.inputs[i].as_mut() else {
                continue;
            };
            match input.next() {
                Some(item) => return Some(item),
                None => {
                    self.inputs[i] = None;
                    if self.stop_on_empty {
                        self.done = true;
                        return None;
                    }
                }
            }
        }
    }
}
