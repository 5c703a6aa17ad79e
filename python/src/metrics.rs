//! `client_metrics_text`: the text of this process's client metrics (`sluice.metrics.text()`).

use pyo3::prelude::*;

/// The client metrics of this process in the OpenMetrics text format.
#[pyfunction]
pub fn client_metrics_text() -> String {
    sluice_client::ClientMetrics::global().encode_text()
}
