//! `ClientMetrics`: what this process's readers received from the service and how long they
//! waited for it, as Prometheus metrics.
//!
//! One set per process (`ClientMetrics::global()`), counting every epoch read through this
//! library, so an application needs no handle to pass around: it adds the families to its own
//! `prometheus_client` registry with [`ClientMetrics::register`] (beside its own metrics), or
//! takes the text of these alone with [`ClientMetrics::encode_text`].
//!
//! | metric | type | what |
//! |---|---|---|
//! | `sluice_client_received_elements_total` | counter | elements handed to the reader |
//! | `sluice_client_received_bytes_total` | counter | their size: encoded as workers sent them (uncompressed), or tensor payloads for elements made by local ops |
//! | `sluice_client_stall_seconds` | histogram | each wait of the reader for an element when none was buffered |
//!
//! Labels: `dataset` (the dataset id) and `job` (the job name; empty for an anonymous job, whose
//! id is new every time). Cardinality stays bounded: at most `MAX_LABEL_SETS` pairs are kept
//! apart, and reads past them count under `dataset="_other", job="_other"`.
//!
//! Cost: an epoch resolves its counters once (`ReadMetrics`); taking an element touches no
//! metric; a delivery (one worker message, many elements) adds two atomic increments; only a
//! wait reads the clock.

use crate::read_metrics::ReadMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// Distinct `(dataset, job)` label pairs kept apart; later ones share `_other`.
pub(crate) const MAX_LABEL_SETS: usize = 64;

/// The label value of reads past `MAX_LABEL_SETS`.
pub(crate) const OTHER: &str = "_other";

/// The labels of every client metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReadLabels {
    pub dataset: String,
    pub job: String,
}

type HistogramFamily = Family<ReadLabels, Histogram, fn() -> Histogram>;

/// The process's client metric families.
#[derive(Debug)]
pub struct ClientMetrics {
    received_elements: Family<ReadLabels, Counter>,
    received_bytes: Family<ReadLabels, Counter>,
    stall_seconds: HistogramFamily,
    /// The label pairs given their own series so far. A std `Mutex`: taken once per epoch,
    /// never across an `.await`.
    label_sets: Mutex<HashSet<ReadLabels>>,
}

/// Waits from 100 µs to about 6.5 s, by factors of four.
fn stall_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 4.0, 9))
}

static GLOBAL: OnceLock<ClientMetrics> = OnceLock::new();

impl ClientMetrics {
    fn new() -> ClientMetrics {
        ClientMetrics {
            received_elements: Family::default(),
            received_bytes: Family::default(),
            stall_seconds: Family::new_with_constructor(stall_histogram as fn() -> Histogram),
            label_sets: Mutex::new(HashSet::new()),
        }
    }

    /// This process's client metrics.
    pub fn global() -> &'static ClientMetrics {
        GLOBAL.get_or_init(ClientMetrics::new)
    }

    /// Adds the client metric families to `registry` (they keep counting for every registry
    /// they are in).
    pub fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "sluice_client_received",
            "Elements the service handed to this process's readers",
            Unit::Other("elements".into()),
            self.received_elements.clone(),
        );
        registry.register_with_unit(
            "sluice_client_received",
            "Size of the elements the service handed to this process's readers",
            Unit::Bytes,
            self.received_bytes.clone(),
        );
        registry.register_with_unit(
            "sluice_client_stall",
            "Waits of a reader for an element when none was buffered",
            Unit::Seconds,
            self.stall_seconds.clone(),
        );
    }

    /// The client metrics alone, in the OpenMetrics text format (which Prometheus scrapes).
    pub fn encode_text(&self) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// The counters of one epoch of `dataset` in `job` (`None`: an anonymous job).
    pub(crate) fn for_read(&self, dataset: &str, job: Option<&str>) -> ReadMetrics {
        let labels = self.bounded(ReadLabels {
            dataset: dataset.to_string(),
            job: job.unwrap_or_default().to_string(),
        });
        ReadMetrics::new(
            self.received_elements.get_or_create_owned(&labels),
            self.received_bytes.get_or_create_owned(&labels),
            self.stall_seconds.get_or_create_owned(&labels),
        )
    }

    /// `labels`, or the `_other` pair once `MAX_LABEL_SETS` others have their own series.
    fn bounded(&self, labels: ReadLabels) -> ReadLabels {
        let mut seen = self.label_sets.lock().expect("label set lock poisoned");
        if seen.contains(&labels) || seen.len() < MAX_LABEL_SETS {
            seen.insert(labels.clone());
            return labels;
        }
        ReadLabels {
            dataset: OTHER.into(),
            job: OTHER.into(),
        }
    }
}

#[cfg(test)]
#[path = "client_metrics_tests.rs"]
mod tests;
