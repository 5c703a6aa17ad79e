//! `Report`: the bench's output. Each figure prints one row as it is measured; the JSON object
//! of every figure (the keys BENCHMARKS.md's history uses, values rounded to one decimal) is
//! printed once at the end, when asked for.

use serde_json::{json, Map, Value};

#[derive(Default)]
pub(crate) struct Report {
    figures: Map<String, Value>,
}

impl Report {
    /// Prints a row and keeps the figure for the JSON object.
    pub(crate) fn put(&mut self, key: &str, value: f64, unit: &str) {
        println!("{key:<24} {value:>14.1} {unit}");
        self.figures
            .insert(key.to_string(), json!((value * 10.0).round() / 10.0));
    }

    /// Every figure put so far, as one JSON object.
    pub(crate) fn into_json(self) -> Value {
        Value::Object(self.figures)
    }
}

/// The median of `values` (the upper one of an even count); sorts them.
pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}
