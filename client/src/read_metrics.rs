//! `ReadMetrics`: the counters one epoch updates, resolved once when it starts so that reading
//! never looks a label set up (see `client_metrics` for the metrics and their cost).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use std::time::Duration;

/// One epoch's handles on its `(dataset, job)` series; clones count into the same series.
#[derive(Clone, Debug)]
pub(crate) struct ReadMetrics {
    elements: Counter,
    bytes: Counter,
    stalls: Histogram,
}

impl ReadMetrics {
    pub(crate) fn new(elements: Counter, bytes: Counter, stalls: Histogram) -> ReadMetrics {
        ReadMetrics {
            elements,
            bytes,
            stalls,
        }
    }

    /// Handles that belong to no registry (a stream without a dataset behind it: tests).
    pub(crate) fn detached() -> ReadMetrics {
        ReadMetrics::new(Counter::default(), Counter::default(), Histogram::new([]))
    }

    /// A delivery of `elements` elements of `bytes` bytes reached the reader.
    #[inline]
    pub(crate) fn delivered(&self, elements: u64, bytes: u64) {
        self.elements.inc_by(elements);
        self.bytes.inc_by(bytes);
    }

    /// The reader waited `wait` for an element.
    pub(crate) fn stalled(&self, wait: Duration) {
        self.stalls.observe(wait.as_secs_f64());
    }

    /// Elements counted so far in this epoch's series.
    #[cfg(test)]
    pub(crate) fn elements(&self) -> u64 {
        self.elements.get()
    }

    /// Bytes counted so far in this epoch's series.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.get()
    }
}
